package router

import (
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/internal/epoll"
)

// A goroutine front door's client deadlines are set when a read or a write
// of the socket begins, not when fasthttp asks (issue 36). fasthttp sets a
// connection's read deadline three times a request (the idle wait, the
// headers, the body) and its write deadline once: each a runtime timer
// update and two clock reads, while a request that arrives whole and an
// answer the socket takes at once never wait under three of them. So
// frontConn records what fasthttp asks (SetReadDeadline, SetWriteDeadline)
// and its reads and writes set the one they run under, with
// epoll.Deadline's slack: the read deadline a busy connection's reads run
// under is the idle wait's, and it stays set across requests (it ends up
// to 1/epoll.SlackDiv of the wait late). Go's read and write check the
// deadline before they try the socket, so a deadline already past still
// fails the operation at once.
//
// The client watch (unary.go) reads from another goroutine while the
// serving one waits for the answer, and must be stopped by a deadline set
// at once: it peeks and sets deadlines on the connection beneath
// (frontConn.watched), and forgets the read deadline set through frontConn
// once it has stopped. The loop front door's connection (loopConn) keeps
// its deadlines itself: frontConn passes them on.
//
// The goroutine front door's server timeouts (the first request's and each
// request's headers, the idle wait, the answer's writes) are frontConn's
// own, not fasthttp's (frontDoor.ownTimeouts): fasthttp reads the clock
// for each as it sets it, four a request with the body's, while frontConn
// knows when each wait begins from fasthttp's connection states (connState:
// active at a request's first byte, idle once its answer is out) and takes
// the time only when a read or a write begins under it: one clock read a
// request for the idle wait, the answer held for it (frontheld.go) going
// out without one. A keep-alive request's header timeout thus runs from
// the first read after its first byte, which fasthttp makes at once when
// the headers are not whole (microseconds later, well within the slack).
// The body's timeout stays fasthttp's (HeaderReceived): the end of the
// headers is seen by fasthttp's parser alone.

// frontTimeouts is the goroutine front door's server timeouts, applied by
// frontConn rather than fasthttp (frontDoor.ownTimeouts); zero: none.
type frontTimeouts struct {
	on     bool
	header time.Duration // from the connection's opening, or a keep-alive request's first byte
	idle   time.Duration // the wait for a keep-alive connection's next request
	write  time.Duration // an answer's writes, from the first
}

// ownTimeouts makes srv's read, idle and write timeouts frontConn's
// (above) and clears them in srv, before srv serves fd's connections.
func (fd *frontDoor) ownTimeouts(srv *fasthttp.Server) {
	idle := srv.IdleTimeout
	if idle == 0 {
		idle = srv.ReadTimeout // fasthttp's rule
	}
	fd.own = frontTimeouts{on: true, header: srv.ReadTimeout, idle: idle, write: srv.WriteTimeout}
	srv.ReadTimeout, srv.IdleTimeout, srv.WriteTimeout = 0, 0, 0
}

// requestBegins is for connState when a request's first byte is in: its
// headers get their timeout (a keep-alive request's; the first request's
// runs from the connection's opening), its answer's writes theirs.
func (c *frontConn) requestBegins() {
	if c.dl.answered {
		c.readWithin(c.fd.own.header)
	}
	c.writeWithin(c.fd.own.write)
}

// answerDone is for connState once a request's answer is out: the wait for
// the next one begins.
func (c *frontConn) answerDone() {
	c.dl.answered = true
	c.readWithin(c.fd.own.idle)
}

// readWithin makes the deadline of the connection's next reads d from the
// first one's start (0: none).
func (c *frontConn) readWithin(d time.Duration) {
	c.dl.readIn, c.dl.readRel, c.dl.readNew = d, true, true
}

// writeWithin makes the deadline of the connection's next writes d from
// the first one's start (0: none).
func (c *frontConn) writeWithin(d time.Duration) {
	c.dl.writeIn, c.dl.writeRel, c.dl.writeNew = d, true, true
}

// frontDeadlines is a frontConn's deadlines, the serving goroutine's.
type frontDeadlines struct {
	read, write time.Time // what fasthttp (or the relay) asked; zero: none
	// readNew, writeNew: asked since the last read (write) set it.
	readNew, writeNew bool
	readSet, writeSet epoll.Deadline // what is set on the socket
	// readRel (writeRel): the deadline asked is readIn (writeIn) from the
	// next read's (write's) start, 0 for none (frontTimeouts).
	readIn, writeIn   time.Duration
	readRel, writeRel bool
	answered          bool // an answer went out: a keep-alive connection
}

func (c *frontConn) SetReadDeadline(t time.Time) error {
	if c.lc != nil {
		return c.Conn.SetReadDeadline(t)
	}
	c.dl.read, c.dl.readNew, c.dl.readRel = t, true, false
	return nil
}

func (c *frontConn) SetWriteDeadline(t time.Time) error {
	if c.lc != nil {
		return c.Conn.SetWriteDeadline(t)
	}
	c.dl.write, c.dl.writeNew, c.dl.writeRel = t, true, false
	return nil
}

func (c *frontConn) SetDeadline(t time.Time) error {
	if c.lc != nil {
		return c.Conn.SetDeadline(t)
	}
	_ = c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

// beforeRead sets the read deadline the connection's next read runs under.
func (c *frontConn) beforeRead() error {
	if !c.dl.readNew {
		return nil
	}
	c.dl.readNew = false
	now := time.Now()
	if c.dl.readRel {
		c.dl.readRel = false
		c.dl.read = within(now, c.dl.readIn)
	}
	return c.dl.readSet.Set(c.Conn, false, c.dl.read, now, false)
}

// beforeWrite sets the write deadline the connection's next write runs
// under.
func (c *frontConn) beforeWrite() error {
	if !c.dl.writeNew {
		return nil
	}
	c.dl.writeNew = false
	now := time.Now()
	if c.dl.writeRel {
		c.dl.writeRel = false
		c.dl.write = within(now, c.dl.writeIn)
	}
	return c.dl.writeSet.Set(c.Conn, true, c.dl.write, now, false)
}

// within returns the deadline d from now; zero (none) when d is 0.
func within(now time.Time, d time.Duration) time.Time {
	if d <= 0 {
		return time.Time{}
	}
	return now.Add(d)
}

// watched returns the connection the client watch reads (see above): the
// one beneath a goroutine front door's frontConn, c itself otherwise.
func watched(c net.Conn) (net.Conn, *frontConn) {
	if fc, ok := c.(*frontConn); ok && fc.lc == nil {
		return fc.Conn, fc
	}
	return c, nil
}

// forgetRead is for the serving goroutine once the client watch has
// stopped: the watch set the socket's read deadline beneath frontConn, so
// the next read sets the one asked whatever it is.
func (c *frontConn) forgetRead() {
	c.dl.readSet.Forget()
	c.dl.readNew = true
}
