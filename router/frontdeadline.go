package router

import (
	"net"
	"time"

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
// at once: it reads and sets deadlines on the connection beneath
// (frontConn.watched), and forgets the read deadline set through frontConn
// once it has stopped. The loop front door's connection (loopConn) keeps
// its deadlines itself: frontConn passes them on.

// frontDeadlines is a frontConn's deadlines, the serving goroutine's.
type frontDeadlines struct {
	read, write time.Time // what fasthttp (or the relay) asked; zero: none
	// readNew, writeNew: asked since the last read (write) set it.
	readNew, writeNew bool
	readSet, writeSet epoll.Deadline // what is set on the socket
}

func (c *frontConn) SetReadDeadline(t time.Time) error {
	if c.lc != nil {
		return c.Conn.SetReadDeadline(t)
	}
	c.dl.read, c.dl.readNew = t, true
	return nil
}

func (c *frontConn) SetWriteDeadline(t time.Time) error {
	if c.lc != nil {
		return c.Conn.SetWriteDeadline(t)
	}
	c.dl.write, c.dl.writeNew = t, true
	return nil
}

func (c *frontConn) SetDeadline(t time.Time) error {
	if c.lc != nil {
		return c.Conn.SetDeadline(t)
	}
	c.dl.read, c.dl.readNew = t, true
	c.dl.write, c.dl.writeNew = t, true
	return nil
}

// beforeRead sets the read deadline the connection's next read runs under.
func (c *frontConn) beforeRead() error {
	if !c.dl.readNew {
		return nil
	}
	c.dl.readNew = false
	return c.dl.readSet.Set(c.Conn, false, c.dl.read, time.Now(), false)
}

// beforeWrite sets the write deadline the connection's next write runs
// under.
func (c *frontConn) beforeWrite() error {
	if !c.dl.writeNew {
		return nil
	}
	c.dl.writeNew = false
	return c.dl.writeSet.Set(c.Conn, true, c.dl.write, time.Now(), false)
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
