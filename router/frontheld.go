package router

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
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

// heldAnswer is a frontConn's held answer. on and h are the serving
// goroutine's; pending says bytes are held, and whoever takes it (that
// goroutine's next read, or a Close from any goroutine) sends them.
type heldAnswer struct {
	on      bool // the next writes are held
	init    bool // h has its socket
	h       epoll.Held
	pending atomic.Bool
}

// holdAnswer makes the connection of ctx hold the answer fasthttp writes
// next, when it is the goroutine front door's and the answer is a whole
// body (a stream's writes go out as they come).
func holdAnswer(ctx *fasthttp.RequestCtx) {
	fc, ok := ctx.Conn().(*frontConn)
	if !ok || ctx.Response.IsBodyStream() || ctx.Hijacked() {
		return
	}
	fc.holdForRead()
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
	}
	if !fc.ans.h.Ready() {
		return nil
	}
	return &fc.ans.h
}

func (c *frontConn) Write(p []byte) (int, error) {
	if c.direct.pending {
		return c.writeDirect(p) // a unary answer's head, its body to follow
	}
	return c.writeNow(p)
}

// writeNow is Write without a direct body waiting: the bytes go out, or
// are held, as the connection's state says.
func (c *frontConn) writeNow(p []byte) (int, error) {
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
			if _, err := c.Conn.Write(c.ans.h.Take()); err != nil {
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
		return c.Conn.Read(p)
	}
	n, rest, err := c.ans.h.Read(p)
	if err != nil {
		return 0, epoll.OpError(c.Conn, err)
	}
	if len(rest) > 0 {
		// The socket was full: the rest goes as any write, then the
		// next request is read as usual.
		if err := c.beforeWrite(); err != nil {
			return 0, err
		}
		if _, err := c.Conn.Write(rest); err != nil {
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
}

// A unary answer's body is written by the front door's connection itself,
// straight into the held write (issue 36), not through fasthttp's response
// writer: that copied it into its 4 KiB bufio.Writer and, flushed, the
// connection copied it again into the held bytes (epoll.Held). The relay
// takes the body out of the response (answerDirect) and leaves fasthttp
// the head: the status line and headers fasthttp builds as before (the
// Content-Length the body's, set by the relay), with one more header line,
// directMark, that never reaches the client. When fasthttp's writer flushes
// the head, the connection finds the mark (writeDirect), drops its line
// and writes the head with the body after it: held for the next read on
// the goroutine front door, one write on the loop one. The client gets
// fasthttp's bytes: the head is fasthttp's, Connection: close included
// (the one line fasthttp adds after the handler's, which is why the mark
// is searched with its end: directEnds). Where the mark cannot be found
// by position (pipelined requests: fasthttp's writer may hold an earlier
// answer before the head) it is found by its content, a random token of
// the process: no worker's answer can carry it, since no client ever sees
// it. Not direct, and written as before: an HTTP/1.0 request (fasthttp
// adds its Connection header after the handler), HEAD, a status other
// than 200, an empty body or one above maxKeptHold, a request pipelined
// behind a direct answer whose head has not been flushed yet.

// unaryDirect: unary bodies are written by the connection (a test compares
// the bytes with fasthttp's writer's, unaryDirect off).
var unaryDirect = true

// directBody is a frontConn's unary body waiting for its head; only the
// connection's serving goroutine touches it.
type directBody struct {
	pending bool   // the body waits for its head (fasthttp's next flush)
	body    []byte // the body, taken out of the response
	// spare is the last body's buffer, given to the next response in
	// place of its body: fasthttp's and the upstream's body buffers keep
	// circulating, none allocated.
	spare []byte
	// carry: the end of a write that may be the start of the mark (or
	// the mark without its end), kept for the next write (pipelined
	// answers only).
	carry *[]byte
}

// directKey is the mark's header name (fasthttp's normalized form).
var directKey = []byte("X-Infera-Direct-Body")

// directToken is the mark's value, random per process.
var directToken = func() []byte {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("router: no random bytes for the direct answer mark: " + err.Error())
	}
	return hex.AppendEncode(nil, b[:])
}()

// directMark is the mark's line as fasthttp writes it, with the end of the
// line before it.
var directMark = []byte("\r\n" + string(directKey) + ": " + string(directToken) + "\r\n")

// directEnds are what can follow the mark in fasthttp's head: its end, or
// the Connection: close line fasthttp adds after the handler, then the end.
var directEnds = [...][]byte{[]byte("\r\n"), []byte("Connection: close\r\n\r\n")}

// errDirectMismatch: the head fasthttp wrote after the mark is not one the
// direct answer knows: the connection's framing cannot be trusted.
var errDirectMismatch = errors.New("router: a unary answer's head ends unexpectedly after its mark")

// answerDirect makes ctx's unary answer of status 200 direct where it can
// be (see above): its body goes to the connection, the response keeps its
// head, the body's Content-Length and the mark.
func answerDirect(ctx *fasthttp.RequestCtx, status int) {
	if !unaryDirect || status != fasthttp.StatusOK {
		return
	}
	fc, ok := ctx.Conn().(*frontConn)
	if !ok || fc.direct.pending || ctx.IsHead() || !ctx.Request.Header.IsHTTP11() || ctx.Response.IsBodyStream() {
		return
	}
	body := ctx.Response.Body()
	if len(body) == 0 || len(body) > maxKeptHold {
		return
	}
	old := ctx.Response.SwapBody(fc.direct.spare[:0])
	if len(old) != len(body) || &old[0] != &body[0] {
		// Not the body's buffer (a raw body): as before.
		fc.direct.spare = ctx.Response.SwapBody(old)
		return
	}
	fc.direct.spare = nil
	fc.direct.body, fc.direct.pending = old, true
	ctx.Response.Header.SetContentLength(len(old))
	ctx.Response.SkipBody = true
	ctx.Response.Header.SetCanonical(directKey, directToken)
}

// writeDirect is Write while a direct body waits for its head: p is
// fasthttp's writer flushing, the head with the mark in it (or before it,
// pipelined answers of fasthttp's own).
func (c *frontConn) writeDirect(p []byte) (int, error) {
	d := &c.direct
	q := p
	if d.carry != nil {
		// The last write ended with what may begin the mark (rare: the
		// head was cut by fasthttp's writer being full).
		cp := d.carry
		d.carry = nil
		*cp = append(*cp, p...)
		defer putCarry(cp)
		q = *cp
	}
	i := markAtEnd(q)
	if i < 0 {
		i = bytes.Index(q, directMark) // other answers after the head
	}
	if i < 0 {
		keep := markStartAtEnd(q)
		if err := c.directCarry(q, len(q)-keep); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	rest := q[i+len(directMark):]
	var end []byte
	for _, e := range directEnds {
		if bytes.HasPrefix(rest, e) {
			end = e
			break
		}
		if len(rest) < len(e) && bytes.HasPrefix(e, rest) {
			// The head's end is in the next write.
			if err := c.directCarry(q, i); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	if end == nil {
		return 0, errDirectMismatch
	}
	body := d.body
	d.pending, d.body = false, nil
	err := c.sendDirect(q[:i+2], end, body)
	d.spare = body[:0]
	if err != nil {
		return 0, err
	}
	if after := rest[len(end):]; len(after) > 0 {
		// Pipelined answers of fasthttp's own, after this one.
		if _, err := c.writeNow(after); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// directCarry writes q[:n], which comes before the mark, and keeps q[n:]
// for the next write.
func (c *frontConn) directCarry(q []byte, n int) error {
	cp := holdBufs.Get().(*[]byte)
	*cp = append((*cp)[:0], q[n:]...)
	c.direct.carry = cp
	if n == 0 {
		return nil
	}
	_, err := c.writeNow(q[:n]) // (writeNow never comes back here: the carry stays last)
	return err
}

func putCarry(cp *[]byte) {
	if cap(*cp) <= maxKeptHold {
		*cp = (*cp)[:0]
		holdBufs.Put(cp)
	}
}

// markAtEnd is where the mark is when q ends with the head (as it does
// unless fasthttp's writer held answers after it), checked without a
// search: -1 when q does not end with the mark and an end of the head.
func markAtEnd(q []byte) int {
	for _, e := range directEnds {
		if i := len(q) - len(e) - len(directMark); i >= 0 && bytes.HasSuffix(q, e) && bytes.Equal(q[i:i+len(directMark)], directMark) {
			return i
		}
	}
	return -1
}

// markStartAtEnd is the length of the longest end of q that begins the
// mark (and is shorter than it).
func markStartAtEnd(q []byte) int {
	for k := min(len(directMark)-1, len(q)); k > 0; k-- {
		if bytes.HasSuffix(q, directMark[:k]) {
			return k
		}
	}
	return 0
}

// sendDirect writes a unary answer, its head (without the mark's line),
// the head's end and the body, in one write: held for the next read when
// the connection holds its answer and the three fit, or from one pooled
// buffer.
func (c *frontConn) sendDirect(head, end, body []byte) error {
	if c.ans.on && c.hold.buf == nil && c.hold.endLeft == 0 && c.ans.h.Room() >= len(head)+len(end)+len(body) {
		c.ans.h.Hold(head)
		c.ans.h.Hold(end)
		c.ans.h.Hold(body)
		c.ans.pending.Store(true)
		return nil
	}
	bp := holdBufs.Get().(*[]byte)
	b := append(append(append((*bp)[:0], head...), end...), body...)
	_, err := c.writeNow(b)
	if cap(b) <= maxKeptHold {
		*bp = b[:0]
		holdBufs.Put(bp)
	}
	return err
}
