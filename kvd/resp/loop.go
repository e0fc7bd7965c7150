package resp

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
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
	s    *Server
	ep   int // epoll fd, owned by epf
	epf  *os.File
	raw  syscall.RawConn
	wake int // eventfd: stop

	mu    sync.Mutex
	conns map[int32]*conn

	pending []*conn // replies to write at the end of this batch (run's goroutine only)
}

func newLoop(s *Server) (*loop, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("resp: epoll_create: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("resp: eventfd: %w", err)
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, fmt.Errorf("resp: epoll_ctl: %w", err)
	}
	// The loop waits for its epoll set through Go's netpoller (an epoll fd
	// is itself pollable) rather than in a blocking epoll_wait, which
	// would have the runtime hand its P to another thread on every wait.
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, fmt.Errorf("resp: set nonblock: %w", err)
	}
	f := os.NewFile(uintptr(ep), "resp-epoll")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		unix.Close(wake)
		return nil, fmt.Errorf("resp: epoll poller: %w", err)
	}
	return &loop{s: s, ep: ep, epf: f, raw: raw, wake: wake, conns: map[int32]*conn{}}, nil
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

func (l *loop) closeFDs() {
	l.epf.Close()
	unix.Close(l.wake)
}

// stop makes the loop close its connections and return.
func (l *loop) stop() {
	var one = [8]byte{1}
	_, _ = unix.Write(l.wake, one[:])
}

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
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
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
	events := make([]unix.EpollEvent, maxEvents)
	// One closure for the loop's life (one per wait would allocate).
	var n int
	var werr error
	wait := func(fd uintptr) bool {
		n, werr = rawEpollPoll(int(fd), events)
		if werr == unix.EINTR {
			n, werr = 0, nil
			return true
		}
		return n > 0 || werr != nil // none ready: park until some are
	}
	for {
		err := l.raw.Read(wait)
		if err == nil {
			err = werr
		}
		if err != nil {
			l.s.opt.Log.Error().Err(err).Msg("resp epoll_wait failed")
			l.closeAll()
			return
		}
		for i := range n {
			ev := &events[i]
			if int(ev.Fd) == l.wake {
				l.closeAll()
				return
			}
			l.mu.Lock()
			cn := l.conns[ev.Fd]
			l.mu.Unlock()
			if cn == nil {
				continue
			}
			var err error
			if cn.waitOut {
				err = l.flush(cn)
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
		if perr := cn.process(); perr != nil {
			cn.closing, cn.closeErr = true, perr
			return l.flush(cn) // errClosing once the last reply is written
		}
		if len(cn.out) > deferredReplyMax {
			if err := l.flush(cn); err != nil || cn.waitOut {
				return err
			}
		} else if len(cn.out) > 0 {
			l.deferFlush(cn)
		}
		if n < space || cn.need == 0 {
			return nil
		}
	}
	return nil
}

var (
	errEOF     = errors.New("resp: closed by the client")
	errClosing = errors.New("resp: closing")
)

// flush writes cn.out; what the socket does not take is written on
// EPOLLOUT, and until then cn is not read.
func (l *loop) flush(cn *conn) error {
	for cn.outOff < len(cn.out) {
		n, err := rawWrite(cn.fd, cn.out[cn.outOff:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			if !cn.waitOut {
				cn.waitOut = true
				return l.interest(cn, unix.EPOLLOUT)
			}
			return nil
		}
		if err != nil {
			return err
		}
		cn.outOff += n
	}
	cn.resetOut()
	if cn.closing {
		return errClosing
	}
	if cn.waitOut {
		cn.waitOut = false
		return l.interest(cn, unix.EPOLLIN)
	}
	return nil
}

func (l *loop) interest(cn *conn, events uint32) error {
	return unix.EpollCtl(l.ep, unix.EPOLL_CTL_MOD, cn.fd, &unix.EpollEvent{Events: events, Fd: int32(cn.fd)})
}

func (l *loop) closeConn(cn *conn, err error) {
	cn.dead = true // a reply still queued for this batch is dropped
	l.mu.Lock()
	delete(l.conns, int32(cn.fd))
	l.mu.Unlock()
	unix.Close(cn.fd) // also leaves the epoll set
	l.s.C.ConnsActive.Add(-1)
	cn.dropBig()
	if err == errClosing {
		err = cn.closeErr
	}
	l.s.logClosed(cn, err)
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
