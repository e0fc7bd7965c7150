package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/infera/infera/internal/epoll"
)

// The loop front door (ServeLoop, `infera serve --front-door loop`): client
// connections wait in a few epoll loops instead of a goroutine each. A loop
// reads a connection's bytes with raw non-blocking reads until a request's
// header block is complete (or over MaxHeaderBytes, or the request line
// ends with a bare LF), and only then hands the connection to a goroutine
// that serves what arrived through the same fasthttp machinery as the
// goroutine front door (Server.ServeConn on the connection, parse, body
// limits, Expect: 100-continue, pipelining, the router's handlers):
// parsing and every answer are byte for byte the goroutine front door's
// (FuzzFrontDoorsAgree). When the goroutine has answered everything the
// loop had read and nothing more is buffered, fasthttp's next read ends
// the hand-off (no read that finds nothing, no park on the socket) and
// the connection goes back to its loop. The loop has no goroutine of its
// own: its leader, one of the serving goroutines, waits on the set, and
// when a wait brings requests in it keeps the first connection for
// itself, hands the others to serving goroutines, promotes a follower to
// wait on the set (leader/follower: the set is never unwatched) and
// serves its connection with no hand-off on the critical path. A
// goroutine that has answered takes the loop's turn when no one else runs
// it (proc): it adopts its connection at once and, while other requests
// are in flight, polls the loop's set (epoll_wait 0; while such polls
// pay: turnPolls) for the next connection whose request is in and serves
// that one itself: under load most requests then start without a
// hand-off (no loop wake-up, no goroutine park and wake).
//
// Deadlines of connections in a loop (header, idle keep-alive) live in a
// timer wheel ticking on a timerfd; a served connection's reads and writes
// are raw system calls, and only one that would block falls back to the
// socket's Go netpoller with the runtime deadline fasthttp asked for.

const (
	loopMaxEvents = 256
	wheelSlots    = 512
	loopReadBuf   = 4 << 10
)

// errLoopTimeout is what a connection's read returns after its loop's
// timer cut it (fasthttp answers it as it answers a read deadline).
var errLoopTimeout = os.ErrDeadlineExceeded

// loopConn.state.
const (
	stLoop int32 = iota
	stServer
	stReturned
)

// loopDoor is one ServeLoop's front door.
type loopDoor struct {
	r        *Router
	srv      *fasthttp.Server
	loops    []*frontLoop
	tick     time.Duration
	draining atomic.Bool
	inflight atomic.Int64 // connections handed to goroutines
	next     int
	served   sync.WaitGroup // the serving goroutines

	// Serving goroutines waiting for a connection (a goroutine keeps
	// the stack the request path grew, which a fresh one would grow
	// again for every request); at most maxIdleServers wait.
	poolMu sync.Mutex
	idle   []*server
	closed bool // guarded by poolMu: drain ended the pool
}

// server is a goroutine serving loop connections one after another, or
// leading a loop (waiting on its set; see lead).
type server struct {
	work chan job
	evs  [1]unix.EpollEvent // its turns' polls (see turn)
}

// job is a server's next work: a connection to serve, or a loop to lead.
type job struct {
	lc   *loopConn
	lead *frontLoop
}

// maxIdleServers bounds the serving goroutines kept waiting.
const maxIdleServers = 1024

// frontLoop owns the connections waiting for a request.
type frontLoop struct {
	d  *loopDoor
	p  *epoll.Poller
	wg sync.WaitGroup // the leader role, from start to the loop's end

	// proc is held by whoever runs the loop's work (adopt, expire,
	// reads, the wheel): the leader after each wait, or a serving
	// goroutine taking its turn (see turn). The fields below it and the
	// loop-owned fields of loopConn are guarded by it.
	proc    sync.Mutex
	keeping bool      // the first connection dispatched is kept ...
	kept    *loopConn // ... for the leader or the goroutine taking the turn
	gone    bool      // the loop ended: its poller is closed

	mu       sync.Mutex
	conns    map[int32]*loopConn // every connection of the loop, served or waiting
	out      atomic.Int64        // of them, those dispatched to serving goroutines
	returned []*loopConn         // handed back by their goroutines; guarded by mu
	stopping bool                // guarded by mu

	// Guarded by proc.
	pollScore int // whether a turn's poll pays (see turnPolls)
	pollSkips int // turns that skipped their poll since the last one
	wheel     [wheelSlots]*loopConn
	at        time.Duration // the loop's clock: time since it started, as last read (clock)
	now       int64         // at in whole ticks
	done      int64         // the last tick expire handled
	started   time.Time
}

// loopConn is a client connection of the loop front door; it is the
// net.Conn fasthttp serves (beneath frontConn and the bare-LF guard).
// Ownership moves between the loop (waiting for a request: in, the wheel
// fields) and one serving goroutine (everything else); the hand-over is
// the go statement one way and the loop's mutex the other.
type loopConn struct {
	l  *frontLoop
	fd int // the socket (a duplicate; the accepted net.Conn is closed)
	// slow is the socket in Go's netpoller, made for a read or write
	// that has to wait (a body that trickles, the client watch, a full
	// socket) and closed before the loop waits for the connection again
	// (else every byte would wake the netpoller too); guarded by dmu.
	slow         net.Conn
	laddr, raddr net.Addr
	fc           *frontConn

	in   []byte // read by the loop, not yet by fasthttp: in[r:w]
	r, w int
	// ends of the loop's reads in in (the first nmarks): fasthttp reads
	// what arrived in the pieces it arrived in, as from the socket (its
	// errors can depend on where a read ends).
	marks  [8]int
	nmarks int
	scan   int  // in[r:scan] holds no header end
	served bool // a request was answered (keep-alive)
	// hup: an event said the client shut its side down (or the
	// connection is gone): reads go on past a short read, to the end
	// (see readable). Loop-owned (proc), as the wheel fields.
	hup bool

	// Who has it: the loop, a serving goroutine, or back from one and
	// not yet adopted; pending: the loop saw an event it could not act
	// on (the socket is edge-triggered: read it once the loop has it).
	state   atomic.Int32
	pending atomic.Bool

	// Wheel (loop only).
	deadline   int64 // tick
	prev, next *loopConn
	inWheel    bool

	// Serving goroutine.
	failErr  error // read error the loop saw (EOF, reset, its timeout), after in
	idle     bool  // fasthttp answered the last request (ConnState idle)
	handBack bool  // the next read ended the hand-off
	closed   bool

	dmu    sync.Mutex // deadlines, and a read the client watch may run
	rd, wd time.Time
	rArmed bool
	wArmed bool
}

// ServeLoop is ServeAll with the loop front door (see above) instead of a
// goroutine per connection; behaviour and answers are the same.
func (r *Router) ServeLoop(ctx context.Context, ln, adminLn net.Listener) error {
	return r.serveFront(ctx, adminLn, func(mainCtx context.Context) error { return r.serveLoopDoor(mainCtx, ln) })
}

// serveLoopDoor accepts on ln into the loops until ctx ends, then drains
// as lifecycle.Serve does: no new connections, idle ones closed, in-flight
// requests given ShutdownTimeout (answers say Connection: close), then the
// running streams are cut.
func (r *Router) serveLoopDoor(ctx context.Context, ln net.Listener) error {
	d := &loopDoor{r: r, srv: r.Server()}
	d.tick = min(r.cfg.ClientHeaderTimeout, r.cfg.ClientReadTimeout, r.cfg.ClientIdleTimeout) / 8
	d.tick = max(min(d.tick, 250*time.Millisecond), 2*time.Millisecond)
	d.srv.Handler = d.handle
	d.srv.ConnState = d.connState
	nloops := 1
	for range nloops {
		l, err := d.newLoop()
		if err != nil {
			for _, l := range d.loops {
				l.p.Close()
			}
			_ = ln.Close()
			return err
		}
		d.loops = append(d.loops, l)
	}
	for _, l := range d.loops {
		l.wg.Add(1)
		d.served.Add(1)
		s := &server{work: make(chan job, 1)}
		s.work <- job{lead: l}
		go d.runServer(s)
	}
	acceptErr := make(chan error, 1)
	go func() { acceptErr <- d.accept(ln) }()
	var err error
	select {
	case err = <-acceptErr:
	case <-ctx.Done():
		_ = ln.Close()
		<-acceptErr
	}
	d.drain()
	return err
}

// accept takes connections through the front door's limits into the loops.
func (d *loopDoor) accept(ln net.Listener) error {
	fl := d.r.front.listener(ln, d.r)
	for {
		c, err := fl.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		fc := c.(*frontConn)
		l := d.loops[d.next%len(d.loops)]
		d.next++
		if err := l.take(fc); err != nil {
			d.r.log.Warn().Err(err).Msg("client connection dropped")
		}
	}
}

// drain stops the front door: idle connections close at once, requests in
// flight get ShutdownTimeout, then the streams still running are cut.
func (d *loopDoor) drain() {
	d.draining.Store(true)
	for _, l := range d.loops {
		l.p.Wake()
	}
	deadline := time.Now().Add(d.r.cfg.ShutdownTimeout)
	for d.inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if d.inflight.Load() > 0 {
		n := d.r.conns.CloseAll()
		d.r.log.Warn().Int("connections", n).Dur("grace", d.r.cfg.ShutdownTimeout).Msg("shutdown grace over, cutting running streams")
	}
	for _, l := range d.loops {
		l.mu.Lock()
		l.stopping = true
		l.mu.Unlock()
		l.p.Wake()
	}
	for _, l := range d.loops {
		l.wg.Wait()
	}
	d.closePool()
	d.served.Wait()
}

func (d *loopDoor) newLoop() (*frontLoop, error) {
	p, err := epoll.New(loopMaxEvents)
	if err != nil {
		return nil, fmt.Errorf("router: loop front door: %w", err)
	}
	// The clock starts before the timerfd, so that each tick comes after
	// the tick boundary it stands for (see schedule).
	started := time.Now()
	if err := p.SetTick(d.tick); err != nil {
		p.Close()
		return nil, fmt.Errorf("router: loop front door: %w", err)
	}
	return &frontLoop{d: d, p: p, conns: map[int32]*loopConn{}, started: started}, nil
}

// handle is the router's handler; while draining, answers close their
// connection.
func (d *loopDoor) handle(ctx *fasthttp.RequestCtx) {
	d.r.Handle(ctx)
	if d.draining.Load() {
		ctx.SetConnectionClose()
	}
}

// connState follows fasthttp's view of a served connection: idle once its
// answer is out (the next read with nothing buffered ends the hand-off).
func (d *loopDoor) connState(c net.Conn, st fasthttp.ConnState) {
	if fc, ok := c.(*frontConn); ok && fc.lc != nil && (st == fasthttp.StateIdle || st == fasthttp.StateActive) {
		fc.lc.dmu.Lock()
		fc.lc.idle = st == fasthttp.StateIdle
		fc.lc.dmu.Unlock()
	}
	d.r.front.connState(c, st)
}

// take moves an accepted connection into the loop.
func (l *frontLoop) take(fc *frontConn) error {
	nc := fc.Conn
	sc, ok := nc.(syscall.Conn)
	if !ok {
		_ = fc.Close()
		return errNoSyscallConn
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		_ = fc.Close()
		return err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || derr != nil {
		_ = fc.Close()
		return errors.Join(err, derr)
	}
	laddr, raddr := nc.LocalAddr(), nc.RemoteAddr()
	// Out of Go's netpoller: the loop's epoll set alone watches it.
	_ = nc.Close()
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		fc.Conn = closedConn{nc}
		_ = fc.Close()
		return err
	}
	lc := &loopConn{l: l, fd: fd, fc: fc, in: make([]byte, loopReadBuf), laddr: laddr, raddr: raddr}
	fc.lc = lc
	fc.Conn = &lfGuardConn{Conn: lc}
	l.mu.Lock()
	if l.stopping || l.d.draining.Load() {
		l.mu.Unlock()
		_ = fc.Close()
		return nil
	}
	l.conns[int32(fd)] = lc
	// Scheduled by the loop (its wheel is its own) with the header
	// timeout, from now.
	lc.deadline = -1
	lc.state.Store(stReturned)
	lc.pending.Store(true) // read it once in the loop: edge-triggered
	l.returned = append(l.returned, lc)
	l.mu.Unlock()
	if err := l.p.Add(fd, epoll.In|epoll.RDHup|epoll.Edge); err != nil {
		l.mu.Lock()
		delete(l.conns, int32(fd))
		l.mu.Unlock()
		_ = fc.Close()
		return fmt.Errorf("router: epoll_ctl: %w", err)
	}
	l.p.Wake()
	return nil
}

// lead waits on the loop's set and runs its work after each wait (the
// loop's leader, on a serving goroutine s) until a wait brings a request
// in: the leader keeps the first connection dispatched (the others go to
// serving goroutines), promotes a follower to lead (a waiting serving
// goroutine, or a new one: the set is never left unwatched) and returns
// the connection to serve it itself, with no hand-off on the critical
// path. It returns nil when the loop stops.
func (l *frontLoop) lead() *loopConn {
	for {
		evs, _, ticked, err := l.p.Wait()
		l.proc.Lock()
		if err != nil {
			l.d.r.log.Error().Err(err).Msg("front door epoll_wait failed")
		}
		l.keeping = true
		stop := err != nil || l.work(evs, ticked)
		l.keeping = false
		lc := l.kept
		l.kept = nil
		if stop {
			l.closeAll()
			l.p.Close()
			l.gone = true
			l.proc.Unlock()
			l.wg.Done()
			return lc // served, then closed (see turn)
		}
		if lc != nil {
			l.d.promote(l)
		}
		l.proc.Unlock()
		if lc != nil {
			return lc
		}
	}
}

// work adopts what came back, expires the wheel when it ticked and takes
// the events; proc is held. true: stop the loop.
func (l *frontLoop) work(evs []unix.EpollEvent, ticked bool) bool {
	if l.adopt() {
		return true
	}
	if ticked {
		l.expire()
	}
	for i := range evs {
		l.mu.Lock()
		lc := l.conns[evs[i].Fd]
		if lc != nil && lc.closed {
			lc = nil
		}
		l.mu.Unlock()
		if lc == nil {
			continue
		}
		if evs[i].Events&(epoll.RDHup|epoll.Hup|epoll.Err) != 0 {
			lc.hup = true
		}
		if lc.state.Load() == stLoop {
			l.readable(lc)
			continue
		}
		// A goroutine serves it: the bytes are read once it is back
		// (see serveConn); if it just came back, take it now.
		lc.pending.Store(true)
		if lc.state.Load() == stReturned && l.adopt() {
			return true
		}
	}
	return false
}

// clock reads the loop's clock (at, now).
func (l *frontLoop) clock() {
	l.at = time.Since(l.started)
	l.now = int64(l.at / l.d.tick)
}

// adopt takes back the connections their goroutines returned, each with
// its deadline (header timeout for a new one, idle timeout after an
// answer), and closes the idle ones while draining. true: stop the loop.
func (l *frontLoop) adopt() bool {
	l.mu.Lock()
	ret := l.returned
	l.returned = nil
	for i, lc := range ret {
		if lc.closed {
			ret[i] = nil
		}
	}
	stopping := l.stopping
	l.mu.Unlock()
	l.clock()
	draining := l.d.draining.Load()
	cfg := &l.d.r.cfg
	for _, lc := range ret {
		if lc == nil {
			continue
		}
		lc.state.Store(stLoop)
		switch {
		case draining && lc.r == lc.w:
			l.close(lc)
			continue
		case lc.deadline == -1:
			l.schedule(lc, min(cfg.ClientHeaderTimeout, cfg.ClientReadTimeout))
		default:
			l.schedule(lc, cfg.ClientIdleTimeout)
		}
		if lc.pending.Swap(false) {
			l.readable(lc)
		}
	}
	if draining {
		// Idle connections close; those a request is arriving on keep
		// their header deadline.
		for _, lc := range l.snapshot() {
			if lc.inWheel && lc.r == lc.w {
				l.close(lc)
			}
		}
	}
	return stopping
}

func (l *frontLoop) snapshot() []*loopConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*loopConn, 0, len(l.conns))
	for _, lc := range l.conns {
		out = append(out, lc)
	}
	return out
}

// schedule (re)places lc in the wheel, due d from now (the clock as last
// read): at the first tick boundary at or after it, never before. expire
// takes a connection once the clock has passed its tick's boundary, so
// rounding up makes a timeout end up to a tick late, as the goroutine
// door's socket deadlines end up to epoll.SlackDiv of theirs late; rounded
// from the tick now begun instead it would end up to a tick early (a 1 s
// header timeout at 875 ms, with its 125 ms tick).
func (l *frontLoop) schedule(lc *loopConn, d time.Duration) {
	l.unschedule(lc)
	lc.deadline = max(int64((l.at+d+l.d.tick-1)/l.d.tick), l.done+1)
	slot := &l.wheel[lc.deadline%wheelSlots]
	lc.prev, lc.next = nil, *slot
	if *slot != nil {
		(*slot).prev = lc
	}
	*slot = lc
	lc.inWheel = true
}

func (l *frontLoop) unschedule(lc *loopConn) {
	if !lc.inWheel {
		return
	}
	if lc.prev != nil {
		lc.prev.next = lc.next
	} else {
		l.wheel[lc.deadline%wheelSlots] = lc.next
	}
	if lc.next != nil {
		lc.next.prev = lc.prev
	}
	lc.prev, lc.next, lc.inWheel = nil, nil, false
}

// expire handles the wheel's slots up to now: a connection past its
// deadline with nothing read after an answer closes (fasthttp's idle
// timeout); any other is served with the timeout as its read error, so
// that fasthttp answers it as it answers its own read deadline.
func (l *frontLoop) expire() {
	l.clock()
	from := max(l.done+1, l.now-wheelSlots+1)
	for t := from; t <= l.now; t++ {
		for lc := l.wheel[t%wheelSlots]; lc != nil; {
			next := lc.next
			if lc.deadline <= l.now {
				l.unschedule(lc)
				if lc.served && lc.r == lc.w {
					l.close(lc)
				} else {
					lc.failErr = errLoopTimeout
					l.dispatch(lc)
				}
			}
			lc = next
		}
	}
	l.done = l.now
}

// readable reads what lc's socket has and serves lc once a request's
// header block is in (or cannot be: too large, bare LF, EOF, an error).
// A read that fills less than the buffer has emptied the socket, so
// readable stops there (no read that finds nothing), unless the client
// has shut its side down (hup): the end of its stream, when it came with
// or just after the bytes before the loop looked, brings no edge of its
// own, and it would be taken only at the header timeout (a 408 where the
// goroutine door reads the end at once and answers what came).
func (l *frontLoop) readable(lc *loopConn) {
	maxHead := l.d.r.cfg.MaxHeaderBytes
	wasEmpty := lc.r == lc.w
	for {
		if lc.w == len(lc.in) {
			if lc.r > 0 {
				lc.w = copy(lc.in, lc.in[lc.r:lc.w])
				lc.scan -= lc.r
				for i := range lc.nmarks {
					lc.marks[i] -= lc.r
				}
				lc.r = 0
			} else if len(lc.in) < maxHead+loopReadBuf {
				grown := make([]byte, min(2*len(lc.in), maxHead+loopReadBuf))
				copy(grown, lc.in[:lc.w])
				lc.in = grown
			} else {
				break
			}
		}
		n, err := epoll.Read(lc.fd, lc.in[lc.w:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			break
		}
		if err != nil || n == 0 {
			if lc.r == lc.w {
				l.close(lc)
				return
			}
			lc.failErr = io.EOF
			if err != nil {
				lc.failErr = err
			}
			l.unschedule(lc)
			l.dispatch(lc)
			return
		}
		lc.w += n
		lc.mark()
		if lc.w < len(lc.in) && !lc.hup {
			break
		}
	}
	if lc.headComplete(maxHead) {
		l.unschedule(lc)
		l.dispatch(lc)
		return
	}
	if wasEmpty && lc.r < lc.w && lc.served {
		// The first byte of the next request: its header timeout starts.
		l.schedule(lc, min(l.d.r.cfg.ClientHeaderTimeout, l.d.r.cfg.ClientReadTimeout))
	}
}

// headComplete: in[r:w] holds a header block, or more than maxHead, or
// (on a connection's first request) a request line ending in a bare LF.
func (lc *loopConn) headComplete(maxHead int) bool {
	b := lc.in[lc.r:lc.w]
	if len(b) >= maxHead {
		return true
	}
	from := max(lc.scan-lc.r-3, 0)
	if bytes.Contains(b[from:], crlfcrlf) {
		return true
	}
	lc.scan = lc.w
	if !lc.served {
		if i := bytes.IndexByte(b, '\n'); i >= 0 && (i == 0 || b[i-1] != '\r') {
			return true
		}
	}
	return false
}

var crlfcrlf = []byte("\r\n\r\n")

// mark records the end of a read; past len(marks) reads, the last one
// grows.
func (lc *loopConn) mark() {
	if lc.nmarks < len(lc.marks) {
		lc.nmarks++
	}
	lc.marks[lc.nmarks-1] = lc.w
}

// dispatch hands lc to a goroutine that serves what arrived.
func (l *frontLoop) dispatch(lc *loopConn) {
	lc.scan = lc.r
	lc.idle = false
	lc.state.Store(stServer)
	d := l.d
	d.inflight.Add(1)
	l.out.Add(1)
	if l.keeping && l.kept == nil {
		l.kept = lc
		return
	}
	d.give(job{lc: lc})
}

// promote makes a serving goroutine l's leader (proc held, by the leader
// that keeps a connection to serve).
func (d *loopDoor) promote(l *frontLoop) { d.give(job{lead: l}) }

// give hands j to a waiting serving goroutine, or to a new one. (The pool
// is open: it closes after the loops have ended, and a job comes from a
// loop's leader or turn.)
func (d *loopDoor) give(j job) {
	d.poolMu.Lock()
	if n := len(d.idle); n > 0 {
		s := d.idle[n-1]
		d.idle[n-1] = nil
		d.idle = d.idle[:n-1]
		d.poolMu.Unlock()
		s.work <- j
		return
	}
	d.poolMu.Unlock()
	d.served.Add(1)
	s := &server{work: make(chan job, 1)}
	s.work <- j
	go d.runServer(s)
}

// runServer serves the connections handed to s, and leads the loops it is
// promoted to, until the pool is full or closed.
func (d *loopDoor) runServer(s *server) {
	defer d.served.Done()
	for j := range s.work {
		lc := j.lc
		if j.lead != nil {
			lc = j.lead.lead()
		}
		for lc != nil {
			lc = d.serveConn(lc, s)
		}
		d.poolMu.Lock()
		if d.closed || len(d.idle) >= maxIdleServers {
			d.poolMu.Unlock()
			return
		}
		d.idle = append(d.idle, s)
		d.poolMu.Unlock()
	}
}

// closePool ends the waiting serving goroutines; one still serving ends
// when it is done.
func (d *loopDoor) closePool() {
	d.poolMu.Lock()
	d.closed = true
	for _, s := range d.idle {
		close(s.work)
	}
	d.idle = nil
	d.poolMu.Unlock()
}

// serveConn runs fasthttp on lc until it has answered what arrived; the
// connection then goes back to its loop, or closes. It returns the
// connection s serves next, if its turn (see turn) found one.
func (d *loopDoor) serveConn(lc *loopConn, s *server) *loopConn {
	defer d.inflight.Add(-1)
	defer lc.l.out.Add(-1)
	_ = d.srv.ServeConn(lc.fc)
	if !lc.handBack {
		return nil // closed
	}
	lc.handBack = false
	lc.served = true
	lc.dropSlow()
	l := lc.l
	if l.proc.TryLock() {
		next := l.turn(lc, s)
		l.proc.Unlock()
		return next
	}
	l.giveBack(lc)
	return nil
}

// turn: a serving goroutine that has answered lc runs the loop's work
// itself (proc held): lc goes back at once, and while other requests are
// in flight (the front door is busy) and other connections wait in the
// loop (only they can bring a request: with every other one being served
// a poll finds nothing, and with 2 connections 3,565 of 3,577 polls did)
// it polls the loop's set for the next connection whose request is in,
// and keeps the first for itself.
// Under load the connections ready to serve are then taken by the
// goroutines finishing a request, without a hand-off (a loop wake-up and
// a goroutine park and wake per request); idle, it costs no system call.
func (l *frontLoop) turn(lc *loopConn, s *server) *loopConn {
	d := l.d
	l.mu.Lock()
	if l.gone || l.stopping || d.draining.Load() {
		l.mu.Unlock()
		_ = lc.fc.Close()
		return nil
	}
	lc.state.Store(stReturned)
	l.returned = append(l.returned, lc)
	// Connections waiting in the loop besides lc (counted in both): a
	// poll can find a request only on one of them.
	waiting := len(l.conns) - int(l.out.Load())
	l.mu.Unlock()
	l.keeping = true
	stop := l.adopt() // lc's deadline, and its pending read if any
	for range 4 {
		if stop || l.kept != nil || waiting <= 0 || d.inflight.Load() <= 1 {
			break
		}
		if !l.turnPolls() {
			break
		}
		evs, woken, ticked, err := l.p.Poll(s.evs[:])
		if err != nil || len(evs) == 0 && !woken && !ticked {
			l.scorePoll(false)
			break
		}
		stop = l.work(evs, ticked)
		l.scorePoll(l.kept != nil)
	}
	l.keeping = false
	next := l.kept
	l.kept = nil
	if stop {
		// The loop goroutine stops itself (a wake-up this turn took
		// may have been the one meant for it).
		l.p.Wake()
	}
	return next
}

// A turn's poll is a system call that pays when it brings in a request
// its goroutine then serves without a hand-off. Whether it does depends on
// the load and on what a system call costs against a hand-off. With 16
// connections and a fast upstream (BenchmarkFrontDoor) ~60 % of the polls
// brought one; with wrk's 64 connections in front of two simulators 26 %
// (24,906 polls, 6,514 requests), while the leader's waits brought ~19
// requests each: the polls cost ~0.9 epoll_wait a request. On the 2-core
// VM the benchmarks run on, a system call costs ~1.2 µs of CPU (getppid:
// 0.6 user, 0.65 kernel) and a goroutine hand-off ~0.2 µs, so a poll pays
// only when more than ~4 in 5 bring a request. The loop keeps a score: a
// poll that brought a request earns pollHit, an empty one costs pollMiss
// (the break-even is pollMiss / (pollHit + pollMiss) of the polls bringing
// one), and at zero the turns poll only every pollProbe-th time, to notice
// when polls pay again; the leader's wait takes the rest, in batches.
const (
	pollHit      = 1
	pollMiss     = 4
	pollScoreMax = 16
	pollProbe    = 16
)

// turnPolls says whether this turn polls the set (proc held).
func (l *frontLoop) turnPolls() bool {
	if l.pollScore > 0 {
		return true
	}
	l.pollSkips++
	if l.pollSkips < pollProbe {
		return false
	}
	l.pollSkips = 0
	return true
}

// scorePoll records what a turn's poll brought (proc held).
func (l *frontLoop) scorePoll(hit bool) {
	if hit {
		l.pollScore = min(l.pollScore+pollHit, pollScoreMax)
	} else {
		l.pollScore = max(l.pollScore-pollMiss, 0)
	}
}

// giveBack hands a connection served to the end of what arrived back to
// its loop goroutine (another goroutine is running the loop's work).
func (l *frontLoop) giveBack(lc *loopConn) {
	d := l.d
	l.mu.Lock()
	if l.stopping || d.draining.Load() {
		l.mu.Unlock()
		_ = lc.fc.Close()
		return
	}
	// State before the list: once listed, the connection may be
	// adopted (stLoop) at any moment.
	lc.state.Store(stReturned)
	l.returned = append(l.returned, lc)
	l.mu.Unlock()
	// No system call: the socket stays in the loop's set (edge-
	// triggered), and the loop adopts it (its idle deadline) at its
	// next event or tick. Bytes that arrived meanwhile made an event
	// the loop could not act on: it marked the connection pending, and
	// then it is woken now. (State before pending, and the loop
	// pending before state: one of the two sees the other.)
	if lc.pending.Load() {
		l.p.Wake()
	}
}

// close closes a connection the loop owns.
func (l *frontLoop) close(lc *loopConn) {
	l.unschedule(lc)
	_ = lc.fc.Close()
}

// closeAll closes every connection the loop owns (served ones close when
// their goroutines return and find the loop stopping).
func (l *frontLoop) closeAll() {
	l.mu.Lock()
	ret := l.returned
	l.returned = nil
	for i, lc := range ret {
		if lc.closed {
			ret[i] = nil
		}
	}
	l.mu.Unlock()
	for _, lc := range ret {
		if lc != nil {
			l.close(lc)
		}
	}
	for _, lc := range l.snapshot() {
		if lc.inWheel {
			l.close(lc)
		}
	}
}

// net.Conn, for fasthttp and the router's handlers.

func (lc *loopConn) Read(p []byte) (int, error) {
	lc.dmu.Lock()
	if lc.r < lc.w {
		end := lc.w
		if lc.nmarks > 0 {
			end = lc.marks[0]
		}
		n := copy(p, lc.in[lc.r:end])
		lc.r += n
		if lc.r == end && lc.nmarks > 0 {
			copy(lc.marks[:], lc.marks[1:lc.nmarks])
			lc.nmarks--
		}
		if lc.r == lc.w {
			lc.r, lc.w, lc.scan, lc.nmarks = 0, 0, 0, 0
		}
		lc.dmu.Unlock()
		return n, nil
	}
	if err := lc.failErr; err != nil {
		lc.dmu.Unlock()
		return 0, err
	}
	if lc.idle {
		// fasthttp waits for the next request: the loop does that, or,
		// while draining, nobody does: the connection closes, as
		// fasthttp's Shutdown closes an idle one. (Waiting here instead
		// would hold the drain for the whole ShutdownTimeout, this
		// goroutine counted in flight, on a client that sends nothing.)
		lc.handBack = !lc.l.d.draining.Load()
		lc.dmu.Unlock()
		return 0, io.EOF
	}
	slow, err := lc.armSlow(true)
	lc.dmu.Unlock()
	n := 0
	if err == nil {
		n, err = slow.Read(p)
	}
	lc.disarmSlow(true)
	return n, err
}

// peek is the client watch's look at lc (clientWatch.look): buffered at
// once when the loop read bytes that fasthttp has not (they stay for it),
// else the socket's RawConn.Read with fn, which peeks and leaves what it
// finds; the read deadline applies, as to Read.
func (lc *loopConn) peek(fn func(fd uintptr) bool) (buffered bool, err error) {
	lc.dmu.Lock()
	if lc.r < lc.w {
		lc.dmu.Unlock()
		return true, nil
	}
	if err := lc.failErr; err != nil {
		lc.dmu.Unlock()
		return false, err
	}
	slow, err := lc.armSlow(true)
	lc.dmu.Unlock()
	if err == nil {
		if raw := rawConn(slow); raw != nil {
			err = raw.Read(fn)
		} else {
			err = errNoPeek
		}
	}
	lc.disarmSlow(true)
	return false, err
}

// errNoPeek: a socket without a RawConn (not a TCP or Unix socket).
var errNoPeek = errors.New("router: client socket cannot be peeked")

func (lc *loopConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := epoll.Write(lc.fd, p[done:])
		switch err {
		case nil:
			done += n
			continue
		case unix.EINTR:
			continue
		case unix.EAGAIN:
		default:
			return done, &net.OpError{Op: "write", Net: "tcp", Addr: lc.raddr, Err: os.NewSyscallError("write", err)}
		}
		// The socket is full: wait for it through the netpoller.
		lc.dmu.Lock()
		slow, err := lc.armSlow(false)
		lc.dmu.Unlock()
		if err == nil {
			n, err = slow.Write(p[done:])
			done += n
		}
		lc.disarmSlow(false)
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// Close closes the socket, unless the read that ended fasthttp's serving
// handed the connection back to its loop.
func (lc *loopConn) Close() error {
	if lc.handBack {
		return nil
	}
	l := lc.l
	l.mu.Lock()
	if lc.closed {
		l.mu.Unlock()
		return nil
	}
	lc.closed = true
	delete(l.conns, int32(lc.fd))
	l.mu.Unlock()
	lc.dropSlow()
	return unix.Close(lc.fd) // also leaves the epoll set
}

// armSlow readies the netpoller duplicate for a read (read) or a write
// that must wait, under the deadline fasthttp set for it, and marks it
// armed so that a deadline set meanwhile reaches it; dmu held.
func (lc *loopConn) armSlow(read bool) (net.Conn, error) {
	if read {
		lc.rArmed = true
	} else {
		lc.wArmed = true
	}
	slow, err := lc.slowConn()
	if err != nil {
		return nil, err
	}
	if read {
		err = slow.SetReadDeadline(lc.rd)
	} else {
		err = slow.SetWriteDeadline(lc.wd)
	}
	return slow, err
}

// disarmSlow ends what armSlow began.
func (lc *loopConn) disarmSlow(read bool) {
	lc.dmu.Lock()
	if read {
		lc.rArmed = false
	} else {
		lc.wArmed = false
	}
	lc.dmu.Unlock()
}

// slowConn returns lc.slow, made when missing; dmu is held.
func (lc *loopConn) slowConn() (net.Conn, error) {
	if lc.slow != nil {
		return lc.slow, nil
	}
	fd, err := unix.FcntlInt(uintptr(lc.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("router: dup client socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), "client")
	c, err := net.FileConn(f) // its own duplicate
	f.Close()
	if err != nil {
		return nil, err
	}
	lc.slow = c
	return c, nil
}

// dropSlow closes lc.slow (the connection goes back to its loop, or
// closes).
func (lc *loopConn) dropSlow() {
	lc.dmu.Lock()
	if lc.slow != nil {
		_ = lc.slow.Close()
		lc.slow = nil
	}
	lc.dmu.Unlock()
}

func (lc *loopConn) LocalAddr() net.Addr  { return lc.laddr }
func (lc *loopConn) RemoteAddr() net.Addr { return lc.raddr }

func (lc *loopConn) SetDeadline(t time.Time) error {
	_ = lc.SetReadDeadline(t)
	return lc.SetWriteDeadline(t)
}

// SetReadDeadline records t for a read that has to wait; a read waiting
// now (the client watch's) gets it at once.
func (lc *loopConn) SetReadDeadline(t time.Time) error {
	lc.dmu.Lock()
	defer lc.dmu.Unlock()
	lc.rd = t
	if lc.rArmed && lc.slow != nil {
		return lc.slow.SetReadDeadline(t)
	}
	return nil
}

func (lc *loopConn) SetWriteDeadline(t time.Time) error {
	lc.dmu.Lock()
	defer lc.dmu.Unlock()
	lc.wd = t
	if lc.wArmed && lc.slow != nil {
		return lc.slow.SetWriteDeadline(t)
	}
	return nil
}

// closedConn is an accepted connection already closed (take failed after
// closing it): the front door's Close only does its accounting.
type closedConn struct{ net.Conn }

func (closedConn) Close() error { return nil }
