package router

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/infera/infera/router/upstream"
	"github.com/valyala/fasthttp"
)

// Unary cancellation (issue 12). A unary answer writes nothing to its client
// until it is complete, so a client that leaves is not noticed by a failed
// write, as a stream's is. While a unary request waits for its worker, the
// relay looks at the idle client connection on a goroutine of its own
// (clientWatch), peeking, so that a pipelined request's bytes stay for
// fasthttp: EOF or an error means the client left, and the attempt's
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

// clientWatchDelay is how long a unary request waits for its answer, at
// most, before its client connection is watched. Most answers of a fast
// engine come sooner, and then the watch costs nothing (no goroutine, no
// read, no deadline changes); a client that leaves earlier is noticed at
// this delay, so the engine works at most this much longer for it.
const clientWatchDelay = 20 * time.Millisecond

// clientWatch reads a unary request's client connection while the router
// waits for the answer. Its reading goroutine is started by the watch
// sweeper (below) for a request still waiting half to all of
// clientWatchDelay after its start: a request answered sooner never reads.
type clientWatch struct {
	conn     net.Conn    // read and given deadlines at once (watched)
	front    *frontConn  // the front door's connection above conn, if any
	slot     *watchSlot  // what the sweeper sees; made with the relay, kept across its reuse
	gone     atomic.Bool // the client left
	stopping atomic.Bool
	// byte: a byte was read (a pipelined request), where the connection
	// could not be peeked: it closes after the answer.
	byte bool
	wg   sync.WaitGroup
	// peek is peekFD, made once; n and err are its result, in buf.
	peek struct {
		fn  func(fd uintptr) bool
		buf [1]byte
		n   int
		err error
	}
	// legs are the request's exchanges, aborted when the client leaves
	// (nil: none). A leg that begins an exchange after that sees gone
	// (relay.beginExchange).
	legs [2]*upstream.Exchange
}

// The watch sweeper starts the watches of the requests that wait longer
// than a tick (issue 36): a request's start and stop are a few atomic
// operations on its slot, where a timer armed per request cost a reset
// and a stop of the runtime's timer (~0.34 µs a request, session 15). A
// watch's slot is pushed on the sweeper's list when it is armed and not
// listed; each tick (clientWatchDelay/2) the sweeper takes what was pushed
// and starts the watch of each slot armed, by the same request, at the
// previous tick too (so 1–2 ticks after its start), and drops the slots no
// longer armed. The sweeping goroutine runs while slots are listed, and
// ends a tick after the last is dropped.

const watchTick = clientWatchDelay / 2

// A watch slot's states.
const (
	watchIdle    uint32 = iota
	watchArmed          // a request waits; its watch has not started
	watchRunning        // the sweeper started the watch (run)
)

// watchSlot is a clientWatch's part that the sweeper reads.
type watchSlot struct {
	w      *clientWatch
	state  atomic.Uint32 // watchIdle, watchArmed, watchRunning
	starts atomic.Uint32 // the requests armed so far: tells a new one from one seen
	listed atomic.Bool   // on the sweeper's list (pushed or kept)
	// next links the list: written by whoever pushes the slot (it is not
	// listed until then), then the sweeper's.
	next *watchSlot
	// The sweeper's: the request (starts) it saw armed at its last tick.
	seen      uint32
	seenArmed bool
}

// watchSweeper is the package's sweeper; relays are pooled package-wide.
var watchSweeper watchSweep

type watchSweep struct {
	pushed  atomic.Pointer[watchSlot] // slots listed since the last tick
	running atomic.Bool               // a sweeping goroutine runs
}

// push lists s (its listed flag was just set) and starts the sweeping
// goroutine if none runs.
func (sw *watchSweep) push(s *watchSlot) {
	for {
		old := sw.pushed.Load()
		s.next = old
		if sw.pushed.CompareAndSwap(old, s) {
			break
		}
	}
	if !sw.running.Load() && sw.running.CompareAndSwap(false, true) {
		go sw.sweep()
	}
}

// sweep is the sweeping goroutine: a tick at a time, until no slot is
// listed.
func (sw *watchSweep) sweep() {
	var kept *watchSlot
	for {
		time.Sleep(watchTick)
		var keep *watchSlot
		for _, list := range [2]*watchSlot{kept, sw.pushed.Swap(nil)} {
			for s := list; s != nil; {
				next := s.next
				if s.visit() {
					s.next, keep = keep, s
				}
				s = next
			}
		}
		kept = keep
		if kept != nil {
			continue
		}
		sw.running.Store(false)
		// A push that saw this goroutine running left its slot for it.
		if sw.pushed.Load() == nil || !sw.running.CompareAndSwap(false, true) {
			return
		}
	}
}

// visit is the sweeper's look at a listed slot: it starts the watch of a
// request armed since the previous tick, and reports whether the slot
// stays listed.
func (s *watchSlot) visit() bool {
	n := s.starts.Load()
	if s.state.Load() == watchArmed {
		if !s.seenArmed || s.seen != n {
			s.seen, s.seenArmed = n, true
			return true
		}
		if s.state.CompareAndSwap(watchArmed, watchRunning) {
			go s.w.run()
		}
	}
	// Not armed, or watched now: dropped, unless armed again meanwhile
	// (start lists a slot only while it is not listed).
	s.seenArmed = false
	s.listed.Store(false)
	return s.state.Load() == watchArmed && !s.listed.Swap(true)
}

// init makes w's slot; w must not move afterwards (it lives in a pooled
// relay).
func (w *clientWatch) init() {
	w.slot = &watchSlot{w: w}
	w.peek.fn = w.peekFD
}

// start begins watching c after clientWatchDelay at most (nil: nothing to
// watch); legs are the exchanges to abort when its client leaves.
func (w *clientWatch) start(c net.Conn, legs ...*upstream.Exchange) {
	if c == nil {
		return
	}
	w.conn, w.front = watched(c)
	copy(w.legs[:], legs)
	w.wg.Add(1)
	s := w.slot
	s.starts.Add(1)
	s.state.Store(watchArmed)
	if !s.listed.Swap(true) {
		watchSweeper.push(s)
	}
}

// run is the watch's goroutine (the sweeper starts it): it looks at the
// client connection until the client leaves, sends a byte, or stop ends
// the wait.
func (w *clientWatch) run() {
	defer w.wg.Done()
	// The server's read deadline would end the read as if the client had
	// left: clear it, then look at stopping (stop sets it before its own
	// deadline, so one of the two always ends this read).
	if w.conn.SetReadDeadline(time.Time{}) != nil || w.stopping.Load() {
		return
	}
	if w.look() || w.stopping.Load() {
		return
	}
	w.gone.Store(true)
	for _, x := range w.legs {
		if x != nil {
			x.Abort()
		}
	}
}

// look waits until the client sends a byte, ends its side or fails, or
// stop ends the wait; it reports whether a byte came (a pipelined
// request). The byte is peeked, not read: it stays for fasthttp's next
// read, as a byte the loop front door read for its connection does
// (loopConn.peek), and the request after the answer is served. The end of
// the client's side is taken for the client leaving (as nginx does): a
// half-close cannot be told from a close without writing to the client.
func (w *clientWatch) look() bool {
	var err error
	if fc, ok := w.conn.(*frontConn); ok && fc.lc != nil {
		var buffered bool
		if buffered, err = fc.lc.peek(w.peek.fn); buffered {
			return true
		}
	} else if raw := rawConn(w.conn); raw != nil {
		err = raw.Read(w.peek.fn)
	} else {
		// No socket to peek (a test's pipe): a byte read is gone, so
		// the connection closes after the answer.
		n, _ := w.conn.Read(w.peek.buf[:])
		w.byte = n > 0
		return w.byte
	}
	n := w.peek.n
	w.peek.n, w.peek.err = 0, nil
	return err == nil && n > 0
}

// peekFD is look's RawConn.Read callback: it peeks a byte of the
// client's socket, asking to wait while there is none.
func (w *clientWatch) peekFD(fd uintptr) bool {
	for {
		n, _, err := unix.Recvfrom(int(fd), w.peek.buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch err {
		case nil:
			w.peek.n = n
			if n == 0 {
				w.peek.err = io.EOF
			}
			return true
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			w.peek.err = err
			return true
		}
	}
}

// rawConn returns the socket beneath c (through the bare-LF guard), nil
// where there is none.
func rawConn(c net.Conn) syscall.RawConn {
	if g, ok := c.(*lfGuardConn); ok {
		c = g.Conn
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return raw
}

// stop ends the watch and waits for its goroutine, so that fasthttp has
// the connection to itself again. It reports whether the client left.
func (w *clientWatch) stop(ctx *fasthttp.RequestCtx) bool {
	if w.conn == nil {
		return false
	}
	if w.slot.state.CompareAndSwap(watchArmed, watchIdle) {
		// The answer came before the watch: run never started.
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
		w.slot.state.Store(watchIdle)
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
