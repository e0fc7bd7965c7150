package router

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

var errBadWorkerURL = errors.New("worker url must be http(s)://host[:port][/path]")

// newHostClient builds the connection pool of one worker. A streaming
// request's response body is streamed (the relay reads it event by event,
// attempt.do sets Response.StreamBody); a unary answer is read whole by
// fasthttp, within the attempt's deadline and up to maxUnaryResponseBytes,
// which spares it the stream reader and a copy. fasthttp retries are
// off because a POST must not be replayed blindly — retries belong to the
// router, around Pick and forward.
func (r *Router) newHostClient(addr string, tls bool, w *Worker) *fasthttp.HostClient {
	return &fasthttp.HostClient{
		Addr:                      addr,
		IsTLS:                     tls,
		Name:                      "infera",
		MaxConns:                  r.cfg.MaxConnsPerWorker,
		MaxConnWaitTimeout:        r.cfg.ConnectTimeout,
		MaxIdleConnDuration:       r.cfg.IdleConnTimeout,
		MaxIdemponentCallAttempts: 1,
		MaxResponseBodySize:       maxUnaryResponseBytes,
		DisablePathNormalizing:    true,
		// A worker is trusted, but not infinitely: cap what the response
		// header parser may buffer.
		ReadBufferSize: 16 << 10,
		Dial:           func(addr string) (net.Conn, error) { return r.dial(addr, w) },
		Transport:      unaryTransport{r},
	}
}

// dial connects to a worker within the connect timeout and wraps the
// connection so that every read and write gets its own deadline: an
// engine may stream for many minutes, but must never go silent for longer
// than UpstreamTimeout. (fasthttp's ReadTimeout would instead bound the
// whole response, cutting long generations.)
//
// Bytes read from the connection are the worker's progress (stall.go).
func (r *Router) dial(addr string, w *Worker) (net.Conn, error) {
	d := net.Dialer{Timeout: r.cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	dc := &deadlineConn{Conn: c, timeout: r.cfg.UpstreamTimeout, set: &r.conns, local: c.LocalAddr(), r: r, w: w}
	if !r.conns.add(dc) {
		_ = c.Close()
		return nil, errShuttingDown
	}
	return dc, nil
}

var errShuttingDown = errors.New("router is shutting down")

// deadlineConn is an upstream connection with a per-operation idle timeout.
//
// Two more bounds apply on top. A deadline fasthttp sets (DoDeadline: the
// first-byte and request timeouts of one attempt) caps every operation
// until it is cleared. And while a streaming relay watches the connection
// (watch, a streamWatcher: the relay's attempt), reads follow its stream
// deadlines and, whenever the worker is silent for a heartbeat interval,
// the watcher writes an SSE comment to its client from inside Read — the
// reading goroutine is the relay's own, so nothing runs concurrently — and
// a failed write ends the read: the client is gone, the worker connection
// is closed.
type deadlineConn struct {
	net.Conn
	timeout time.Duration
	set     *connSet
	local   net.Addr // the key of set.byLocal
	once    sync.Once
	r       *Router
	w       *Worker // whose progress its reads are; nil: not tracked
	// owner is the unary attempt exchanging on it (unaryTransport), read
	// and written only on that attempt's goroutine; nil otherwise.
	owner *attempt

	readHard  atomic.Int64 // unix ns; 0: none
	writeHard atomic.Int64
	// The deadlines last set on Conn (unix ns; 0: none or unknown), by
	// its reading and its writing goroutine (setDeadline).
	readSet, writeSet int64
	watch             atomic.Pointer[watchSlot] // the stream reading it, if watched
}

// Deadline slack. Resetting a connection's deadline costs a runtime timer
// update, and a busy connection would pay it on every read and write. So
// setDeadline sets a deadline a little later than wanted, and keeps the one
// already set while it is no earlier than wanted and no later than that
// slack: a timeout or tick by 1/deadlineSlackDiv of its wait (an idle
// timeout of 5 min ends up to ~19 s late, a stall tick of 500 ms up to
// ~31 ms), a hard deadline (fasthttp's first-byte and request deadlines,
// a stream's) by 1/hardSlackDiv of its wait and at most hardSlackMax.
const (
	deadlineSlackDiv = 16
	hardSlackDiv     = 64
	hardSlackMax     = 20 * time.Millisecond
)

// setDeadline sets Conn's read (or write) deadline to dl (hard: a hard
// deadline) unless *cur, the one already set, may stand for it.
func (c *deadlineConn) setDeadline(cur *int64, write bool, dl, now time.Time, hard bool) error {
	want := dl.UnixNano()
	slack := (want - now.UnixNano()) / deadlineSlackDiv
	if hard {
		slack = min(slack*deadlineSlackDiv/hardSlackDiv, int64(hardSlackMax))
	}
	slack = max(slack, 0)
	if have := *cur; have >= want && have-want <= slack {
		return nil
	}
	set := dl.Add(time.Duration(slack))
	var err error
	if write {
		err = c.Conn.SetWriteDeadline(set)
	} else {
		err = c.Conn.SetReadDeadline(set)
	}
	if err != nil {
		*cur = 0
		return err
	}
	*cur = want + slack
	return nil
}

// capExact returns the earlier of t and the hard deadline h (unix ns, 0:
// none), and whether h won.
func capExact(t time.Time, h int64) (time.Time, bool) {
	if h != 0 && h < t.UnixNano() {
		return time.Unix(0, h), true
	}
	return t, false
}

func (c *deadlineConn) Read(p []byte) (int, error) {
	now := time.Now()
	sw := c.watch.Load()
	if sw == nil {
		return c.readUnwatched(p, now)
	}
	hard, every := sw.beforeRead(now)
	beat := now.Add(every)
	for {
		dl, isBeat := hard, false
		if every > 0 && beat.Before(hard) {
			dl, isBeat = beat, true
		}
		if err := c.setDeadline(&c.readSet, false, dl, now, !isBeat); err != nil {
			return 0, err
		}
		n, err := c.Conn.Read(p)
		if n > 0 || err == nil {
			c.progress(n)
			return n, err
		}
		if !isBeat || !isTimeout(err) {
			if isTimeout(err) {
				sw.noteReadTimeout()
			}
			return n, err
		}
		if herr := sw.heartbeat(); herr != nil {
			return 0, herr
		}
		beat = beat.Add(every)
		now = time.Now()
	}
}

// progress stamps the worker's progress after a read of n bytes.
func (c *deadlineConn) progress(n int) {
	if n > 0 && c.w != nil {
		c.w.stall.noteProgress(time.Now().UnixNano())
	}
}

// readUnwatched is a read outside a relayed stream: response headers, a
// unary answer, a probe. With stall detection on it wakes every stall tick,
// and gives up (errAttemptStalled) once its worker is confirmed stalled and
// the read has waited a stall window: nothing of the answer reached the
// client yet, so the request can go elsewhere, and closing the connection
// tells the engine to drop it.
func (c *deadlineConn) readUnwatched(p []byte, now time.Time) (int, error) {
	hard, exact := capExact(now.Add(c.timeout), c.readHard.Load())
	var tick time.Duration
	if c.w != nil && c.r.cfg.StallWindow > 0 {
		tick = c.r.stallTick()
	}
	start := now
	for {
		dl, isTick := hard, false
		if tick > 0 && now.Add(tick).Before(hard) {
			dl, isTick = now.Add(tick), true
		}
		if err := c.setDeadline(&c.readSet, false, dl, now, exact && !isTick); err != nil {
			return 0, err
		}
		n, err := c.Conn.Read(p)
		if n > 0 || err == nil || !isTick || !isTimeout(err) {
			c.progress(n)
			return n, err
		}
		now = time.Now()
		if c.r.skipStalled(c.w, now.UnixNano()) && c.w.Stalled() && now.Sub(start) >= c.r.cfg.StallWindow &&
			(c.owner == nil || c.owner.rel.canRetry()) {
			// A unary attempt with no retry left keeps waiting instead.
			return 0, errAttemptStalled
		}
	}
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	now := time.Now()
	dl, exact := capExact(now.Add(c.timeout), c.writeHard.Load())
	if err := c.setDeadline(&c.writeSet, true, dl, now, exact); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// SetReadDeadline records fasthttp's deadline as a cap: Read sets the
// real one.
func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.readHard.Store(unixOrZero(t))
	return nil
}

// SetWriteDeadline records fasthttp's deadline as a cap, like
// SetReadDeadline.
func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	c.writeHard.Store(unixOrZero(t))
	return nil
}

// SetDeadline sets both caps.
func (c *deadlineConn) SetDeadline(t time.Time) error {
	c.readHard.Store(unixOrZero(t))
	c.writeHard.Store(unixOrZero(t))
	return nil
}

func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func (c *deadlineConn) Close() error {
	c.once.Do(func() { c.set.remove(c) })
	return c.Conn.Close()
}

// connSet tracks open upstream connections so that shutdown can cut the
// streams still running when its grace period ends.
type connSet struct {
	mu      sync.Mutex
	conns   map[*deadlineConn]struct{}
	byLocal map[net.Addr]*deadlineConn // by local address: how a relay finds its connection
	closed  bool
}

func (s *connSet) add(c *deadlineConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = make(map[*deadlineConn]struct{})
		s.byLocal = make(map[net.Addr]*deadlineConn)
	}
	s.conns[c] = struct{}{}
	s.byLocal[c.local] = c
	return true
}

func (s *connSet) remove(c *deadlineConn) {
	s.mu.Lock()
	delete(s.conns, c)
	if s.byLocal[c.local] == c {
		delete(s.byLocal, c.local)
	}
	s.mu.Unlock()
}

// lookup returns the connection a response came over: fasthttp records the
// connection's local address in the response (the same net.Addr value the
// connection returns, which is the map key), and exposes nothing else of it.
func (s *connSet) lookup(local net.Addr) *deadlineConn {
	if local == nil {
		return nil
	}
	s.mu.Lock()
	c := s.byLocal[local]
	s.mu.Unlock()
	return c
}

// closeAll closes every tracked connection and refuses new ones.
func (s *connSet) closeAll() int {
	s.mu.Lock()
	s.closed = true
	conns := make([]*deadlineConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	return len(conns)
}
