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
// Every leg exchanges its request on a connection it holds
// (upstream.Exchange); the watch knows the request's exchanges and aborts
// them, which closes whatever connection they hold and refuses the next
// one.
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
	conn     net.Conn    // read and given deadlines at once (watched)
	front    *frontConn  // the front door's connection above conn, if any
	timer    *time.Timer // runs run after clientWatchDelay; made with the relay
	gone     atomic.Bool // the client left
	stopping atomic.Bool
	byte     bool // a byte arrived (a pipelined request): the connection closes after the answer
	wg       sync.WaitGroup
	// legs are the request's exchanges, aborted when the client leaves
	// (nil: none). A leg that begins an exchange after that sees gone
	// (relay.beginExchange).
	legs [2]*upstream.Exchange
}

// init makes w's timer; w must not move afterwards (it lives in a pooled
// relay).
func (w *clientWatch) init() {
	w.timer = time.AfterFunc(time.Hour, w.run)
	w.timer.Stop()
}

// start begins watching c after clientWatchDelay (nil: nothing to watch);
// legs are the exchanges to abort when its client leaves.
func (w *clientWatch) start(c net.Conn, legs ...*upstream.Exchange) {
	if c == nil {
		return
	}
	w.conn, w.front = watched(c)
	copy(w.legs[:], legs)
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
	for _, x := range w.legs {
		if x != nil {
			x.Abort()
		}
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
		if w.front != nil {
			w.front.forgetRead()
		}
	}
	if w.byte {
		ctx.SetConnectionClose()
	}
	gone := w.gone.Load()
	w.conn, w.front, w.legs, w.byte = nil, nil, [2]*upstream.Exchange{}, false
	w.gone.Store(false)
	w.stopping.Store(false)
	return gone
}

// CanRetry implements upstream.Owner: whether the unary attempt may still
// give up a stalled worker for another.
func (a *attempt) CanRetry() bool { return a.rel.retryable(nil) }
