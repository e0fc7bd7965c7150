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
// A watched unary attempt holds its upstream connection by hand
// (attempt.exchangeUnary): it takes one of the worker's pool, exchanges the
// request on it as fasthttp's own transport does, and publishes it in the
// watch while the answer is awaited. Streams take fasthttp's exchange
// unchanged.
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
	// up is the connection of the attempt in flight (attempt.exchangeUnary), a
	// pointer to upConn; whoever swaps it out owns it: the watcher closes
	// it, the attempt releases it.
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

// exchangeUnary exchanges req for a whole answer on a connection of hc,
// a's worker's pool, within a's deadline. The connection is held by hand
// (not by hc.DoDeadline) so that the client watch can close it when its
// client leaves, and so that the connection knows its owner (a stall gives
// up only while a retry is left); after a complete answer it goes back to
// the pool, after a failure it is closed.
func (a *attempt) exchangeUnary(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) error {
	w := &a.rel.watch
	deadline := a.deadline
	wait := time.Until(deadline)
	if wait <= 0 {
		return fasthttp.ErrTimeout
	}
	// What hc.DoDeadline would set on its way to the connection.
	req.URI().DisablePathNormalizing = hc.DisablePathNormalizing
	if len(req.Header.UserAgent()) == 0 && hc.Name != "" {
		req.Header.SetUserAgent(hc.Name)
	}
	cc, err := hc.AcquireConn(wait, req.ConnectionClose())
	if err != nil {
		return err
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
		return errClientLeft
	}
	err = exchangeOn(hc, conn, req, resp, deadline)
	mine := w.up.Swap(nil) != nil
	switch {
	case !mine:
		// The watcher closed it: the client is gone.
		hc.CloseConn(cc)
		return errClientLeft
	case err != nil:
		hc.CloseConn(cc)
		return err
	case req.ConnectionClose() || resp.ConnectionClose():
		hc.CloseConn(cc)
	default:
		_ = conn.SetDeadline(time.Time{})
		hc.ReleaseConn(cc)
	}
	return nil
}

// CanRetry implements upstream.Owner: whether the unary attempt may still
// give up a stalled worker for another.
func (a *attempt) CanRetry() bool { return a.rel.canRetry() }

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
