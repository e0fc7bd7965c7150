package router

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/router/upstream"
	"github.com/valyala/fasthttp"
)

// Unary cancellation (issue 12). A unary answer writes nothing to its client
// until it is complete, so a client that leaves is not noticed by a failed
// write, as a stream's is. While a unary request waits for its worker, the
// relay reads the idle client connection on a goroutine of its own
// (clientWatch): EOF or an error means the client left, and the attempt's
// upstream connection is closed at once, which is how an engine (vLLM, the
// simulator) learns to abort the request and free its slot. The request
// ends as a disconnect, and is not retried.
//
// The upstream connection of a unary attempt is known through the router's
// transport (unaryTransport, the HostClient's RoundTripper): it exchanges
// the request on a pooled connection as fasthttp's own transport does, and
// publishes the connection in the attempt while the answer is awaited.
// Streams take fasthttp's transport unchanged.
//
// The same mechanism is why a unary attempt that hits --ttft-timeout never
// runs on two workers at once: its read fails at the deadline and the
// connection is closed (the engine aborts) before the next attempt starts.

// errClientLeft ends a unary attempt whose client went away.
var errClientLeft = errors.New("client went away")

// clientWatchDelay is how long a unary request waits for its answer before
// its client connection is watched. Most answers of a fast engine come
// sooner, and then the watch costs nothing (no goroutine, no read, no
// deadline changes); a client that leaves earlier is noticed at this delay,
// so the engine works at most this much longer for it.
const clientWatchDelay = 20 * time.Millisecond

// clientWatch reads a unary request's client connection while the router
// waits for the answer. The reading goroutine is the one of a timer armed
// at start (clientWatchDelay), reused across the requests of a pooled
// relay: a request answered before the delay stops the timer and never
// reads.
type clientWatch struct {
	conn     net.Conn
	timer    *time.Timer // runs run after clientWatchDelay; made with the relay
	gone     atomic.Bool // the client left
	stopping atomic.Bool
	byte     bool // a byte arrived (a pipelined request): the connection closes after the answer
	wg       sync.WaitGroup
	// up is the connection of the attempt in flight (unaryTransport), a
	// pointer to upConn; whoever swaps it out owns it: the watcher closes
	// it, the transport releases it.
	up     atomic.Pointer[net.Conn]
	upConn net.Conn
}

// init makes w's timer; w must not move afterwards (it lives in a pooled
// relay).
func (w *clientWatch) init() {
	w.timer = time.AfterFunc(time.Hour, w.run)
	w.timer.Stop()
}

// start begins watching c after clientWatchDelay (nil: nothing to watch).
func (w *clientWatch) start(c net.Conn) {
	if c == nil {
		return
	}
	w.conn = c
	w.wg.Add(1)
	w.timer.Reset(clientWatchDelay)
}

// run is the timer's goroutine: it reads the client connection until the
// client leaves, sends a byte, or stop ends the read.
func (w *clientWatch) run() {
	defer w.wg.Done()
	// The server's read deadline would end the read as if the client had
	// left: clear it, then look at stopping (stop sets it before its own
	// deadline, so one of the two always ends this read).
	if w.conn.SetReadDeadline(time.Time{}) != nil || w.stopping.Load() {
		return
	}
	var b [1]byte
	n, _ := w.conn.Read(b[:])
	if n > 0 {
		w.byte = true
		return
	}
	if w.stopping.Load() {
		return
	}
	w.gone.Store(true)
	if up := w.up.Swap(nil); up != nil {
		_ = (*up).Close()
	}
}

// stop ends the watch and waits for its goroutine, so that fasthttp has
// the connection to itself again. It reports whether the client left.
func (w *clientWatch) stop(ctx *fasthttp.RequestCtx) bool {
	if w.conn == nil {
		return false
	}
	if w.timer.Stop() {
		// The answer came before the delay: run never started.
		w.wg.Done()
	} else {
		// run started (or is starting): end its read.
		w.stopping.Store(true)
		_ = w.conn.SetReadDeadline(time.Now())
		w.wg.Wait()
		_ = w.conn.SetReadDeadline(time.Time{})
	}
	if w.byte {
		ctx.SetConnectionClose()
	}
	gone := w.gone.Load()
	w.conn, w.upConn, w.byte = nil, nil, false
	w.gone.Store(false)
	w.stopping.Store(false)
	return gone
}

// unaryTransport is the RoundTripper of every worker's HostClient.
type unaryTransport struct{ r *Router }

// RoundTrip implements fasthttp.RoundTripper.
func (t unaryTransport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (bool, error) {
	if resp.StreamBody {
		return fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
	}
	a := t.r.unary.lookup(req)
	if a == nil {
		return fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
	}
	w := &a.rel.watch
	deadline := a.deadline
	cc, err := hc.AcquireConn(time.Until(deadline), req.ConnectionClose())
	if err != nil {
		return false, err
	}
	conn := cc.Conn()
	if dc, ok := conn.(*upstream.Conn); ok {
		dc.SetOwner(a)
		defer dc.SetOwner(nil)
	}
	resp.ParseNetConn(conn)
	w.upConn = conn
	w.up.Store(&w.upConn)
	if w.gone.Load() {
		// The client left while the connection was acquired.
		if w.up.Swap(nil) != nil {
			hc.CloseConn(cc)
		}
		return false, errClientLeft
	}
	err = exchangeOn(hc, conn, req, resp, deadline)
	mine := w.up.Swap(nil) != nil
	switch {
	case !mine:
		// The watcher closed it: the client is gone.
		hc.CloseConn(cc)
		return false, errClientLeft
	case err != nil:
		hc.CloseConn(cc)
		return false, err
	case req.ConnectionClose() || resp.ConnectionClose():
		hc.CloseConn(cc)
	default:
		_ = conn.SetDeadline(time.Time{})
		hc.ReleaseConn(cc)
	}
	return false, nil
}

// CanRetry implements upstream.Owner: whether the unary attempt may still
// give up a stalled worker for another.
func (a *attempt) CanRetry() bool { return a.rel.canRetry() }

// unaryAttempts maps the upstream request of each unary attempt in flight
// to its attempt, for unaryTransport.
type unaryAttempts struct {
	mu sync.Mutex
	m  map[*fasthttp.Request]*attempt
}

func (u *unaryAttempts) add(req *fasthttp.Request, a *attempt) {
	u.mu.Lock()
	if u.m == nil {
		u.m = make(map[*fasthttp.Request]*attempt)
	}
	u.m[req] = a
	u.mu.Unlock()
}

func (u *unaryAttempts) remove(req *fasthttp.Request) {
	u.mu.Lock()
	delete(u.m, req)
	u.mu.Unlock()
}

func (u *unaryAttempts) lookup(req *fasthttp.Request) *attempt {
	u.mu.Lock()
	a := u.m[req]
	u.mu.Unlock()
	return a
}

// exchangeOn writes req on conn, a connection taken from hc's pool, and
// reads its whole answer into resp, both before deadline: the exchange
// the pooled client would make, done by hand so that the caller holds
// conn and can abort it (a client that leaves, a PD leg cancelled).
func exchangeOn(hc *fasthttp.HostClient, conn net.Conn, req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error {
	err := conn.SetWriteDeadline(deadline)
	if err == nil {
		bw := hc.AcquireWriter(conn)
		if err = req.Write(bw); err == nil {
			err = bw.Flush()
		}
		hc.ReleaseWriter(bw)
	}
	if err == nil {
		if err = conn.SetReadDeadline(deadline); err == nil {
			br := hc.AcquireReader(conn)
			err = resp.ReadLimitBody(br, hc.MaxResponseBodySize)
			hc.ReleaseReader(br)
		}
	}
	return err
}
