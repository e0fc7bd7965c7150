package router

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/openai"
)

// The front door: what the router spends on clients before a request is
// routed. Connections are counted in the listener (globally and per client
// address), so that a refused connection gets an OpenAI error envelope with
// Retry-After rather than fasthttp's plain text; large request bodies are
// read by the handler against a shared byte budget, so a flood of big
// bodies is refused before the router's memory grows.

const (
	// streamBodyThreshold: bodies up to this size are read into fasthttp's
	// pooled buffers (PostBody: the fast path, outside the budget, at most
	// this much per connection); larger and chunked ones are read by
	// readLargeBody against the body budget.
	streamBodyThreshold = 64 << 10
	// frontRetryAfter is the Retry-After of the front door's refusals.
	frontRetryAfter = "1"
	// maxRejecting bounds the goroutines answering refused connections;
	// beyond it a refused connection is closed without an answer.
	maxRejecting = 256
	// A refused connection's request is read before the answer is written
	// (a client that gets an answer before it sent its request takes it
	// for a broken connection), for at most rejectWait. After an answer
	// sent without reading the request's body, the close lingers: what the
	// client still sends is read and discarded, each read waiting at most
	// lingerIdle, for at most lingerTotal and lingerBytes, so that closing
	// does not reset the connection before the client has read the answer
	// (nginx's lingering close).
	rejectWait  = time.Second
	lingerIdle  = 2 * time.Second
	lingerTotal = 10 * time.Second
	lingerBytes = 256 << 20
	// fasthttpConcurrencySlack lets fasthttp's own limit (which answers in
	// plain text) sit above Config.MaxConnections: the listener refuses
	// first, and fasthttp's count may lag a closed connection briefly.
	fasthttpConcurrencySlack = 2
)

// errBodyRead is the cause of a large body that could not be read whole.
var errBodyRead = errors.New("router: read request body")

// frontDoor counts client connections and holds the body budget. All
// methods are safe for concurrent use.
type frontDoor struct {
	maxConns  int
	maxPerIP  int
	open      atomic.Int64
	rejecting atomic.Int64

	ipMu  sync.Mutex
	perIP map[string]int // guarded by ipMu; only with maxPerIP > 0

	// writeTimeout bounds the write of an answer held for a read that
	// does not come (frontConn.sendHeldAnswer); 0: none.
	writeTimeout time.Duration
	// own: the server timeouts frontConn applies itself (ownTimeouts);
	// set before the first connection is accepted.
	own frontTimeouts

	budget bodyBudget
	held   sync.Map // net.Conn → *heldBody: the body its current request holds

	// closers owns the goroutines that answer and close refused or
	// lingering connections (each bounded by rejectWait and lingerTotal);
	// Router.ServeAll waits for them after the listener has closed.
	closers sync.WaitGroup
}

func newFrontDoor(cfg Config) *frontDoor {
	fd := &frontDoor{maxConns: cfg.MaxConnections, maxPerIP: cfg.MaxConnectionsPerIP, writeTimeout: cfg.ClientWriteTimeout}
	if fd.maxPerIP > 0 {
		fd.perIP = make(map[string]int)
	}
	fd.budget.limit = cfg.BodyBudgetBytes
	return fd
}

// listener wraps ln so that Accept counts and refuses connections.
func (fd *frontDoor) listener(ln net.Listener, r *Router) net.Listener {
	return &frontListener{Listener: ln, fd: fd, r: r}
}

type frontListener struct {
	net.Listener
	fd *frontDoor
	r  *Router
}

// Accept returns the next connection within the limits; refused ones are
// answered (503 over the global cap, 429 over the per-address cap) on a
// goroutine of their own and never returned.
func (l *frontListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		fd := l.fd
		if fd.open.Add(1) > int64(fd.maxConns) {
			fd.open.Add(-1)
			l.r.metrics.rejected[rejected503].Inc()
			fd.refuse(c, fasthttp.StatusServiceUnavailable, "the router is at its connection limit ("+strconv.Itoa(fd.maxConns)+"); retry shortly", openai.TypeUnavailable, "too_many_connections")
			continue
		}
		fc := &frontConn{Conn: c, fd: fd}
		if fd.own.on {
			fc.readWithin(fd.own.header) // the first request's, from the opening
		}
		if fd.maxPerIP > 0 {
			fc.ip = remoteIP(c)
			fd.ipMu.Lock()
			n := fd.perIP[fc.ip] + 1
			ok := n <= fd.maxPerIP
			if ok {
				fd.perIP[fc.ip] = n
			}
			fd.ipMu.Unlock()
			if !ok {
				fd.open.Add(-1)
				l.r.metrics.rejected[rejected429].Inc()
				fd.refuse(c, fasthttp.StatusTooManyRequests, "too many connections from this address (limit "+strconv.Itoa(fd.maxPerIP)+"); retry shortly", openai.TypeInvalidRequest, "too_many_connections")
				continue
			}
		}
		return fc, nil
	}
}

func remoteIP(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// refuse answers a connection that will not be served with an OpenAI error
// and Retry-After, then closes it. The answer is written at once; the
// client's request is read and discarded for a moment so that closing does
// not reset the connection under the answer.
func (fd *frontDoor) refuse(c net.Conn, status int, message, errType, code string) {
	if fd.rejecting.Add(1) > maxRejecting {
		fd.rejecting.Add(-1)
		_ = c.Close()
		return
	}
	fd.closers.Go(func() {
		defer fd.rejecting.Add(-1)
		body := openai.AppendError(nil, message, errType, code)
		resp := make([]byte, 0, 256+len(body))
		resp = append(resp, "HTTP/1.1 "...)
		resp = strconv.AppendInt(resp, int64(status), 10)
		resp = append(resp, ' ')
		resp = append(resp, fasthttp.StatusMessage(status)...)
		resp = append(resp, "\r\nServer: infera\r\nContent-Type: application/json\r\nRetry-After: "...)
		resp = append(resp, frontRetryAfter...)
		resp = append(resp, "\r\nConnection: close\r\nContent-Length: "...)
		resp = strconv.AppendInt(resp, int64(len(body)), 10)
		resp = append(resp, "\r\n\r\n"...)
		resp = append(resp, body...)
		// Wait for the request's headers (or give up), then answer.
		_ = c.SetDeadline(time.Now().Add(rejectWait))
		readHead(c)
		_ = c.SetWriteDeadline(time.Now().Add(rejectWait))
		if _, err := c.Write(resp); err == nil {
			drainClose(c)
			return
		}
		_ = c.Close()
	})
}

// readHead reads from c until the end of a request's header block, an
// error or the deadline set on c, discarding what it read.
func readHead(c net.Conn) {
	var buf [4096]byte
	var tail [3]byte // the end of the previous read, for a split "\r\n\r\n"
	for total := 0; total < 64<<10; {
		n, err := c.Read(buf[:])
		if n > 0 {
			joined := append(tail[:0:0], tail[:]...)
			joined = append(joined, buf[:n]...)
			if bytes.Contains(joined, []byte("\r\n\r\n")) || bytes.Contains(joined, []byte("\n\n")) {
				return
			}
			copy(tail[:], joined[len(joined)-3:])
			total += n
		}
		if err != nil {
			return
		}
	}
}

// lingerClose closes a connection whose client may still be sending a
// request body the router will not read: closing at once would reset the
// connection and could destroy the answer in the client's receive buffer.
// It shuts the write side (the answer is out), discards what the client
// sends for up to rejectLinger, then closes; beyond maxRejecting lingering
// connections it closes at once.
func (fd *frontDoor) lingerClose(c net.Conn) {
	if fd.rejecting.Add(1) > maxRejecting {
		fd.rejecting.Add(-1)
		_ = c.Close()
		return
	}
	fd.closers.Go(func() {
		defer fd.rejecting.Add(-1)
		drainClose(c)
	})
}

// drainClose half-closes c (the answer is out), then reads and discards
// what the client sends until it closes, goes quiet for lingerIdle, or
// lingerTotal or lingerBytes are reached, and closes c.
func drainClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	end := time.Now().Add(lingerTotal)
	var buf [32 << 10]byte
	for total := 0; total < lingerBytes; {
		now := time.Now()
		if !now.Before(end) {
			break
		}
		deadline := now.Add(lingerIdle)
		if deadline.After(end) {
			deadline = end
		}
		_ = c.SetReadDeadline(deadline)
		n, err := c.Read(buf[:])
		total += n
		if err != nil {
			break
		}
	}
	_ = c.Close()
}

// frontConn is an accepted connection; Close gives its place back and
// releases the body its request still held.
type frontConn struct {
	net.Conn
	fd     *frontDoor
	ip     string
	closed atomic.Bool
	// linger: the last request was answered without reading its body; the
	// close first lets the client read the answer (see lingerClose).
	linger atomic.Bool
	// small holds the body of the current request when it is small
	// (readBody); used only by the connection's serving goroutine.
	small []byte
	// lc is the connection beneath, with the loop front door
	// (frontloop.go); nil with the goroutine one.
	lc *loopConn

	// ans is the unary answer held for the next read (frontheld.go).
	ans heldAnswer
	// hold: a stream's last writes, held for its closing chunk
	// (writehold.go).
	hold writeHold
	// una: a unary answer whose head lines the relay writes
	// (relayhead.go).
	una unaryAnswer
	// dl: the deadlines asked, set by the next read or write
	// (frontdeadline.go).
	dl frontDeadlines
}

// NetConn returns the accepted connection under the front door's wrapper.
func (c *frontConn) NetConn() net.Conn { return c.Conn }

// SyscallConn exposes the socket, as *net.TCPConn does, so that code
// inspecting the client connection (liveness checks) sees through the
// wrapper.
func (c *frontConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errNoSyscallConn
	}
	return sc.SyscallConn()
}

var errNoSyscallConn = errors.New("router: front door connection has no socket")

// lingerOnClose marks the connection of ctx, when it is the front door's,
// for a lingering close.
func lingerOnClose(ctx *fasthttp.RequestCtx) {
	if fc, ok := ctx.Conn().(*frontConn); ok {
		fc.linger.Store(true)
	}
}

func (c *frontConn) Close() error {
	if c.lc != nil && c.lc.handBack {
		// fasthttp is done with it for now; the loop keeps it open.
		return nil
	}
	c.sendHeldAnswer()
	var err error
	if c.linger.Load() && !c.closed.Load() {
		c.fd.lingerClose(c.Conn)
	} else {
		err = c.Conn.Close()
	}
	if c.closed.CompareAndSwap(false, true) {
		c.fd.release(c)
		c.fd.open.Add(-1)
		if c.ip != "" {
			c.fd.ipMu.Lock()
			if n := c.fd.perIP[c.ip] - 1; n > 0 {
				c.fd.perIP[c.ip] = n
			} else {
				delete(c.fd.perIP, c.ip)
			}
			c.fd.ipMu.Unlock()
		}
	}
	return err
}

// connState is the fasthttp ConnState hook: once a request's response has
// been written (idle) or the connection is gone, its body is released; a
// request's first byte (active) and its answer's end (idle) start the
// timeouts frontConn applies (frontdeadline.go).
func (fd *frontDoor) connState(c net.Conn, st fasthttp.ConnState) {
	fc, own := c.(*frontConn)
	own = own && fd.own.on && fc.lc == nil
	switch st {
	case fasthttp.StateActive:
		if own {
			fc.requestBegins()
		}
	case fasthttp.StateIdle:
		fd.release(c)
		if own {
			fc.answerDone()
		}
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		fd.release(c)
		if fc != nil && fc.lc == nil && st == fasthttp.StateClosed {
			// The serving goroutine's last word on the connection (the
			// loop door's may be served again, by another goroutine: its
			// spare stays with it).
			fc.releaseHoldBuf()
		}
	}
}

// heldBody is a large body read against the budget.
type heldBody struct {
	reserved int64
	buf      []byte
}

func (fd *frontDoor) release(c net.Conn) {
	v, ok := fd.held.LoadAndDelete(c)
	if !ok {
		return
	}
	h := v.(*heldBody)
	fd.budget.put(h.buf)
	fd.budget.used.Add(-h.reserved)
}

// bodyBudget is the shared budget of large request bodies, with a free list
// of their buffers: reusing them keeps the router's memory near the budget
// (fresh buffers for every body would let the heap grow to a multiple of it
// between garbage collections).
type bodyBudget struct {
	limit int64
	used  atomic.Int64

	mu     sync.Mutex
	free   [][]byte // guarded by mu
	pooled int64    // capacity in free; guarded by mu
}

func (b *bodyBudget) reserve(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

// get returns a buffer of length n, from the free list when one is large
// enough.
func (b *bodyBudget) get(n int) []byte {
	b.mu.Lock()
	for i, buf := range b.free {
		if cap(buf) >= n {
			last := len(b.free) - 1
			b.free[i] = b.free[last]
			b.free[last] = nil
			b.free = b.free[:last]
			b.pooled -= int64(cap(buf))
			b.mu.Unlock()
			return buf[:n]
		}
	}
	b.mu.Unlock()
	return make([]byte, n)
}

// put keeps buf for reuse while the free list and the bodies held stay
// within the budget.
func (b *bodyBudget) put(buf []byte) {
	if cap(buf) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pooled+int64(cap(buf))+b.used.Load() > b.limit {
		// Drop the smallest buffers first: they are the least reusable.
		for len(b.free) > 0 && b.pooled+int64(cap(buf))+b.used.Load() > b.limit {
			small := 0
			for i := range b.free {
				if cap(b.free[i]) < cap(b.free[small]) {
					small = i
				}
			}
			if cap(b.free[small]) >= cap(buf) {
				return // buf is the smallest: drop it
			}
			b.pooled -= int64(cap(b.free[small]))
			last := len(b.free) - 1
			b.free[small] = b.free[last]
			b.free[last] = nil
			b.free = b.free[:last]
		}
		if b.pooled+int64(cap(buf))+b.used.Load() > b.limit {
			return
		}
	}
	b.free = append(b.free, buf)
	b.pooled += int64(cap(buf))
}

// readBody reads the request's body, which fasthttp hands over as a stream
// (StreamRequestBody; it pre-reads at most 8 KiB), and makes it the
// request's body. A small body on a front-door connection is read into that
// connection's own buffer (no allocation per request; the connection serves
// one request at a time and the buffer is reused only after the response
// has been written); larger, chunked or other ones go to readLargeBody.
// false: an error was answered.
func (r *Router) readBody(ctx *fasthttp.RequestCtx) bool {
	n := ctx.Request.Header.ContentLength()
	fc, ok := ctx.Conn().(*frontConn)
	if !ok || n < 0 || n > streamBodyThreshold || n > r.cfg.MaxBodyBytes {
		return r.readLargeBody(ctx)
	}
	if cap(fc.small) < n {
		fc.small = make([]byte, max(n, 2*cap(fc.small), smallBodyMin))
	}
	buf := fc.small[:n]
	if _, err := io.ReadFull(ctx.RequestBodyStream(), buf); err != nil {
		ctx.SetConnectionClose()
		r.handleParseError(ctx, bodyReadError{err})
		return false
	}
	ctx.Request.SetBodyRaw(buf)
	return true
}

// smallBodyMin is the least a connection's small-body buffer grows to.
const smallBodyMin = 4 << 10

// readLargeBody reads a body fasthttp left unread (above
// streamBodyThreshold) into a buffer reserved from the body budget, and
// makes it the request's body. It answers and returns false when the body
// is too large (413), does not fit the budget (503 with Retry-After, before
// a byte of it is read) or cannot be read (400, 408 on a timeout).
func (r *Router) readLargeBody(ctx *fasthttp.RequestCtx) bool {
	n := ctx.Request.Header.ContentLength()
	if n > r.cfg.MaxBodyBytes {
		ctx.SetConnectionClose()
		lingerOnClose(ctx)
		r.handleParseError(ctx, fasthttp.ErrBodyTooLarge)
		return false
	}
	chunked := n < 0
	need := n
	if chunked {
		need = r.cfg.MaxBodyBytes + 1
	}
	fd := r.front
	if !fd.budget.reserve(int64(need)) {
		r.requestID(ctx)
		ctx.SetConnectionClose()
		lingerOnClose(ctx)
		ctx.Response.Header.Set("Retry-After", frontRetryAfter)
		writeError(ctx, fasthttp.StatusServiceUnavailable, "the router is reading too many request bodies at once; retry shortly", openai.TypeUnavailable, "server_busy")
		r.metrics.request(routeOf(ctx.Path()), outcomeBodyBudget).Inc()
		r.metrics.rejected[rejected503].Inc()
		return false
	}
	h := &heldBody{reserved: int64(need), buf: fd.budget.get(need)}
	// Registered before reading, so that whatever happens next the
	// reservation goes back when the response is written or the
	// connection closes.
	fd.held.Store(ctx.Conn(), h)
	got, err := io.ReadFull(ctx.RequestBodyStream(), h.buf)
	switch {
	case chunked && errors.Is(err, io.ErrUnexpectedEOF), chunked && errors.Is(err, io.EOF):
		err = nil
	case chunked && err == nil:
		ctx.SetConnectionClose()
		lingerOnClose(ctx)
		r.handleParseError(ctx, fasthttp.ErrBodyTooLarge)
		return false
	}
	if err != nil {
		ctx.SetConnectionClose()
		r.handleParseError(ctx, bodyReadError{err})
		return false
	}
	ctx.Request.SetBodyRaw(h.buf[:got])
	return true
}

// bodyReadError keeps a read error's timeout for handleParseError (408)
// and marks it as a body read.
type bodyReadError struct{ err error }

func (e bodyReadError) Error() string { return errBodyRead.Error() + ": " + e.err.Error() }
func (e bodyReadError) Unwrap() error { return e.err }
