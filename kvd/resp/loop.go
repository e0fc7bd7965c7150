package resp

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/infera/infera/internal/epoll"
)

// The event loops: connections are served the way redis-server serves
// them, from a goroutine (Options.Loops of them) waiting in epoll_wait on
// many sockets (level-triggered), not from a goroutine per connection
// over Go's netpoller. A request then costs one read and one write (the reply to
// everything that read brought, pipelined or not), where a goroutine per
// connection costs a further read that finds nothing, a park and a wake-up.
//
// A connection belongs to one loop for its life; only that loop touches
// its buffers. A reply the socket cannot take at once is kept and written
// on EPOLLOUT, and the connection is not read meanwhile (backpressure).

const maxEvents = 256

// deferredReplyMax is how much of a connection's replies may wait for the
// end of the epoll batch. Replies are written after every ready socket has
// been read, as redis-server writes them before it sleeps: the clients then
// find several replies ready per wake-up instead of one, and a large
// reply still leaves at once.
const deferredReplyMax = 1 << 20

type loop struct {
	s *Server
	p *epoll.Poller // its wake-up stops the loop

	mu    sync.Mutex
	conns map[int32]*conn

	pending []*conn // replies to write at the end of this batch (run's goroutine only)
	waiting int     // connections waiting for EPOLLOUT (run's goroutine only)
}

func newLoop(s *Server) (*loop, error) {
	p, err := epoll.New(maxEvents)
	if err != nil {
		return nil, fmt.Errorf("resp: %w", err)
	}
	if t := s.opt.OutputTimeout; t > 0 {
		// The stall check's tick: a connection whose replies wait past
		// OutputTimeout is closed at most a quarter of it late.
		if err := p.SetTick(max(t/4, 10*time.Millisecond)); err != nil {
			p.Close()
			return nil, fmt.Errorf("resp: %w", err)
		}
	}
	return &loop{s: s, p: p, conns: map[int32]*conn{}}, nil
}

// startLoops makes Options.Loops loops; nil (and connections get
// goroutines) when epoll is unavailable.
func (s *Server) startLoops() []*loop {
	n := s.opt.Loops
	loops := make([]*loop, 0, n)
	for range n {
		l, err := newLoop(s)
		if err != nil {
			s.opt.Log.Warn().Err(err).Msg("resp event loop unavailable: one goroutine per connection")
			for _, l := range loops {
				l.closeFDs()
			}
			return nil
		}
		loops = append(loops, l)
	}
	for _, l := range loops {
		s.wg.Add(1)
		go l.run()
	}
	return loops
}

func (l *loop) closeFDs() { l.p.Close() }

// stop makes the loop close its connections and return.
func (l *loop) stop() { l.p.Wake() }

// takeConn moves an accepted connection from Go's netpoller into the
// loop: its descriptor is duplicated and the net.Conn closed (the socket
// stays open through the duplicate). false: c is not a socket the loop
// can take (the caller serves it from a goroutine); err: it could not be
// taken and was closed.
func (l *loop) takeConn(c net.Conn) (bool, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false, nil
	}
	fd := -1
	var derr error
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return false, nil
	}
	c.Close()
	if derr != nil {
		return true, fmt.Errorf("resp: dup: %w", derr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return true, fmt.Errorf("resp: set nonblock: %w", err)
	}
	s := l.s
	cn := &conn{s: s, fd: fd, id: s.nextID.Add(1), in: make([]byte, readBuf), authed: s.opt.Password == ""}
	s.C.ConnsTotal.Add(1)
	s.C.ConnsActive.Add(1)
	l.mu.Lock()
	l.conns[int32(fd)] = cn
	l.mu.Unlock()
	if err := l.p.Add(fd, epoll.In); err != nil {
		l.mu.Lock()
		delete(l.conns, int32(fd))
		l.mu.Unlock()
		s.C.ConnsActive.Add(-1)
		unix.Close(fd)
		return true, fmt.Errorf("resp: epoll_ctl: %w", err)
	}
	return true, nil
}

func (l *loop) run() {
	defer l.s.wg.Done()
	defer l.closeFDs()
	for {
		events, woken, ticked, err := l.p.Wait()
		if err != nil {
			l.s.opt.Log.Error().Err(err).Msg("resp epoll_wait failed")
			l.closeAll()
			return
		}
		if woken {
			l.closeAll()
			return
		}
		if ticked && l.waiting > 0 {
			l.closeStalled()
		}
		for i := range events {
			ev := &events[i]
			l.mu.Lock()
			cn := l.conns[ev.Fd]
			l.mu.Unlock()
			if cn == nil {
				continue
			}
			var err error
			if cn.waitOut {
				if err = l.flush(cn); err == nil && !cn.waitOut && cn.held {
					err = l.work(cn) // the requests that waited for these replies
				}
			} else {
				err = l.readable(cn)
			}
			if err != nil {
				l.closeConn(cn, err)
			}
		}
		l.flushPending()
	}
}

// deferFlush queues cn's replies for the end of the batch.
func (l *loop) deferFlush(cn *conn) {
	if !cn.queued {
		cn.queued = true
		l.pending = append(l.pending, cn)
	}
}

// flushPending writes the replies deferred during the batch.
func (l *loop) flushPending() {
	for i, cn := range l.pending {
		l.pending[i] = nil
		cn.queued = false
		if cn.dead || cn.waitOut {
			continue
		}
		if err := l.flush(cn); err != nil {
			l.closeConn(cn, err)
		}
	}
	l.pending = l.pending[:0]
}

// readable reads what the socket has, answers every complete request in
// the buffer and writes the replies. A non-nil error closes cn.
func (l *loop) readable(cn *conn) error {
	for range 8 { // a large request in one event, up to a point
		n, space, err := cn.read() // bigset.go: a large SET's value goes to its slot
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			return nil
		case err != nil:
			return err
		case n == 0:
			return errEOF
		}
		if cn.incomplete() {
			return nil // n < space: the socket is drained
		}
		if err := l.work(cn); err != nil || cn.waitOut {
			return err
		}
		if n < space || cn.need == 0 {
			return nil
		}
	}
	return nil
}

// work answers the requests in cn's input and writes (or defers) the
// replies. Requests held back for their replies (holdOutput) are answered
// as the socket takes the replies; when it stops taking them, cn waits
// for EPOLLOUT with the rest of its input unanswered.
func (l *loop) work(cn *conn) error {
	for {
		perr := cn.process()
		if errors.Is(perr, ErrOutputTooLarge) {
			return perr // closed at once, the replies dropped (as Redis)
		}
		if perr != nil {
			cn.closing, cn.closeErr = true, perr
			return l.flush(cn) // errClosing once the last reply is written
		}
		if !cn.held {
			if len(cn.out) > deferredReplyMax {
				return l.flush(cn)
			}
			if len(cn.out) > 0 {
				l.deferFlush(cn)
			}
			return nil
		}
		if err := l.flush(cn); err != nil || cn.waitOut {
			return err
		}
	}
}

var (
	errEOF     = errors.New("resp: closed by the client")
	errClosing = errors.New("resp: closing")
)

// flush writes cn.out; what the socket does not take is written on
// EPOLLOUT, and until then cn is not read.
func (l *loop) flush(cn *conn) error {
	wrote := false
	for cn.outOff < len(cn.out) {
		n, err := epoll.Write(cn.fd, cn.out[cn.outOff:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			if !cn.waitOut {
				cn.waitOut = true
				l.waiting++
				cn.stallAt = time.Now().UnixNano()
				return l.interest(cn, epoll.Out)
			}
			if wrote { // some bytes went: not stalled
				cn.stallAt = time.Now().UnixNano()
			}
			return nil
		}
		if err != nil {
			return err
		}
		cn.outOff += n
		wrote = wrote || n > 0
	}
	cn.resetOut()
	if cn.closing {
		return errClosing
	}
	if cn.waitOut {
		cn.waitOut = false
		l.waiting--
		return l.interest(cn, epoll.In)
	}
	return nil
}

// closeStalled closes the connections whose replies have waited, the
// socket taking none of them, for OutputTimeout.
func (l *loop) closeStalled() {
	limit := time.Now().Add(-l.s.opt.OutputTimeout).UnixNano()
	var stalled []*conn
	l.mu.Lock()
	for _, cn := range l.conns {
		if cn.waitOut && cn.stallAt <= limit {
			stalled = append(stalled, cn)
		}
	}
	l.mu.Unlock()
	for _, cn := range stalled {
		l.closeConn(cn, ErrOutputStalled)
	}
}

func (l *loop) interest(cn *conn, events uint32) error {
	return l.p.Mod(cn.fd, events)
}

func (l *loop) closeConn(cn *conn, err error) {
	cn.dead = true // a reply still queued for this batch is dropped
	if cn.waitOut {
		l.waiting--
	}
	if err == errClosing {
		err = cn.closeErr
	}
	// Counted and logged before the socket closes: a client that sees the
	// close finds the counters already telling why.
	l.s.logClosed(cn, err)
	l.mu.Lock()
	delete(l.conns, int32(cn.fd))
	l.mu.Unlock()
	unix.Close(cn.fd) // also leaves the epoll set
	l.s.C.ConnsActive.Add(-1)
	cn.dropBig()
}

func (l *loop) closeAll() {
	l.mu.Lock()
	conns := l.conns
	l.conns = map[int32]*conn{}
	l.mu.Unlock()
	for _, cn := range conns {
		unix.Close(cn.fd)
		l.s.C.ConnsActive.Add(-1)
		cn.dropBig()
	}
}
