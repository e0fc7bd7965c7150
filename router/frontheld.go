package router

import (
	"io"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/internal/epoll"
)

// A goroutine front door's unary answer goes out with the read for the
// connection's next request (issue 36): fasthttp writes the answer and
// then reads, and that read, made as Go makes a socket read (try the
// socket, park if it has nothing), nearly always finds nothing first: a
// system call per request for nothing. Held (epoll.Held) instead, the
// answer is written from inside the read's wait (RawConn.Read: the
// netpoller's readiness reset comes first), and the socket is read only
// once the next request is there. A stream's last events are held the
// same way (relay.holdLast; the others go out as they come, with raw
// writes: writeAnswer); nothing is held for a read on the loop front door
// (its loop waits for the next request: writehold.go's sendEnd) or before
// the bare-LF guard has seen the first line (a held read bypasses it).
// A stream whose end is held so puts its bookkeeping off too (putOff):
// the read runs it once the end has gone, before it waits, so that the
// client's last bytes do not wait for it, nor the next request.

// heldAnswer is a frontConn's held answer. on and h are the serving
// goroutine's; pending says bytes are held, and whoever takes it (that
// goroutine's next read, or a Close from any goroutine) sends them.
type heldAnswer struct {
	on      bool // the next writes are held
	init    bool // h has its socket
	h       epoll.Held
	pending atomic.Bool
	// after: a stream whose end is held here, its bookkeeping (the
	// relay's finish) put off until that end has gone out (putOff);
	// whoever sends the held bytes runs it (runAfter).
	after atomic.Pointer[relay]
}

// holdAnswer makes the connection of ctx hold the answer fasthttp writes
// next, when it is the goroutine front door's and the answer is a whole
// body (a stream's writes go out as they come; a unary answer whose head
// lines the relay writes is whole too).
func holdAnswer(ctx *fasthttp.RequestCtx) {
	fc, ok := ctx.Conn().(*frontConn)
	if !ok || ctx.Hijacked() {
		return
	}
	if s := ctx.Response.BodyStream(); s != nil && s != io.Reader(&fc.una) {
		return
	}
	fc.holdForRead()
}

// sendHeldFirst sends an answer held for a read that a pipelined request
// made unnecessary (its bytes were already read), before anything of the
// next answer is written: a unary answer whose head lines the relay wrote
// went out of fasthttp's writer at once (relayhead.go), where fasthttp
// would have kept it there with the next answers.
func (c *frontConn) sendHeldFirst() error {
	if !c.ans.pending.Load() || !c.ans.pending.Swap(false) {
		return nil
	}
	if err := c.beforeWrite(); err != nil {
		return err
	}
	_, err := c.Conn.Write(c.ans.h.Take())
	c.runAfter()
	return err
}

// holdForRead holds the connection's next writes for its next read: a
// unary answer (holdAnswer), or the end of a stream (relay.holdLast).
// false: it cannot (see socket).
func (fc *frontConn) holdForRead() bool {
	if fc.socket() == nil {
		return false
	}
	fc.ans.on = true
	return true
}

// clientConn is the front door's connection of rel's client, if it is one.
func (rel *relay) clientConn() (*frontConn, bool) {
	if rel.ctx == nil {
		return nil, false
	}
	fc, ok := rel.ctx.Conn().(*frontConn)
	return fc, ok
}

// putOff keeps rel's bookkeeping (the relay's finish: the attempt's end,
// metrics, tracing) until the end of its stream, held for the
// connection's next read, has gone out: that read runs it between its
// write and its wait (epoll.Held.Then), while the client reads the end,
// where it ran before the write, between the answer's read from the
// engine and the client's first byte (issue 36). false: nothing is held
// for a read (rel finishes now).
func (fc *frontConn) putOff(rel *relay) bool {
	if !fc.ans.on {
		return false
	}
	fc.ans.after.Store(rel)
	return true
}

// runAfter runs the bookkeeping putOff kept, once: after the held bytes
// went out (the read's wait, a write that sent them, Close), or before a
// read that found nothing held.
func (fc *frontConn) runAfter() {
	if rel := fc.ans.after.Swap(nil); rel != nil {
		rel.r.finish(rel, rel.outcome, rel.status)
	}
}

// socket returns the Held of the connection's socket, for raw writes and
// reads (epoll.Held), or nil where the connection's reads and writes must
// take their usual way: the loop front door (its loop reads), the bare-LF
// guard still reading the first request (a raw read bypasses it), no
// socket beneath.
func (fc *frontConn) socket() *epoll.Held {
	if fc.lc != nil {
		return nil
	}
	g, ok := fc.Conn.(*lfGuardConn)
	if !ok || !g.checked || g.bad {
		return nil
	}
	if !fc.ans.init {
		fc.ans.init = true
		fc.ans.h.Init(g.Conn)
		fc.ans.h.Then(fc.runAfter)
		// A client's next request, or its half-close, may be in before
		// the answer goes (pipelined, or sent while the engine works).
		fc.ans.h.PeerSendsEarly()
	}
	if !fc.ans.h.Ready() {
		return nil
	}
	return &fc.ans.h
}

func (c *frontConn) Write(p []byte) (int, error) {
	if c.hold.endLeft > 0 {
		return c.writeAfterEnd(p) // a stream's end went out already (writehold.go)
	}
	if c.hold.buf != nil {
		return c.writeHeld(p) // a stream's last writes (writehold.go)
	}
	return c.writeAnswer(p)
}

// writeAnswer writes p to the client, or holds it while an answer is held.
func (c *frontConn) writeAnswer(p []byte) (int, error) {
	if c.ans.on {
		if c.ans.h.Hold(p) {
			c.ans.pending.Store(true)
			return len(p), nil
		}
		// Too large to hold (or no socket): what is held goes first.
		c.ans.on = false
		if c.ans.pending.Swap(false) {
			if err := c.beforeWrite(); err != nil {
				return 0, err
			}
			_, err := c.Conn.Write(c.ans.h.Take())
			c.runAfter()
			if err != nil {
				return 0, err
			}
		}
	}
	return c.write(p)
}

// write writes p to the client now: with a raw system call where the
// connection has its socket (a stream's events as they come), since a
// write through the runtime's syscall bookkeeping wakes its monitor thread
// after an idle spell, as between a paced stream's tokens (a futex call
// and a thread woken on the way to the client).
func (c *frontConn) write(p []byte) (int, error) {
	if err := c.beforeWrite(); err != nil {
		return 0, err
	}
	if s := c.socket(); s != nil {
		n, err := s.Send(p)
		return n, epoll.OpError(c.Conn, err)
	}
	return c.Conn.Write(p)
}

func (c *frontConn) Read(p []byte) (int, error) {
	if c.ans.on {
		c.ans.on = false // (no write while it is off: the client watch reads too)
	}
	if err := c.beforeRead(); err != nil {
		return 0, err // (an answer held goes out with the Close)
	}
	if !c.ans.pending.Swap(false) {
		c.runAfter()
		return c.Conn.Read(p)
	}
	n, rest, err := c.ans.h.Read(p) // runAfter once the held bytes went
	if err != nil {
		c.runAfter()
		return 0, epoll.OpError(c.Conn, err)
	}
	if len(rest) > 0 {
		// The socket was full: the rest goes as any write, then the
		// next request is read as usual.
		err := c.beforeWrite()
		if err == nil {
			_, err = c.Conn.Write(rest)
		}
		c.runAfter()
		if err != nil {
			return 0, err
		}
		return c.Conn.Read(p)
	}
	return n, nil
}

// sendHeldAnswer sends an answer held for a read that does not come
// (Connection: close, drain, an idle close): it goes out before the close.
// Close may run on another goroutine than the serving one (a drain), so
// the write's deadline is set here, from the write timeout, not through
// frontConn's deadlines (frontdeadline.go).
func (c *frontConn) sendHeldAnswer() {
	if c.ans.pending.Swap(false) {
		var dl time.Time
		if d := c.fd.writeTimeout; d > 0 {
			dl = time.Now().Add(d)
		}
		_ = c.Conn.SetWriteDeadline(dl)
		_, _ = c.Conn.Write(c.ans.h.Take())
	}
	c.runAfter()
}
