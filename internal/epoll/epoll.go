package epoll

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Events the loops ask for.
const (
	In      = unix.EPOLLIN
	Out     = unix.EPOLLOUT
	OneShot = unix.EPOLLONESHOT
	Edge    = unix.EPOLLET
	// RDHup: the peer shut its side down. An edge-triggered loop that
	// stops reading at a short read (the socket is then empty of bytes)
	// must read on to the end when it is reported: a FIN that came with
	// or just after the bytes, before the loop looked, makes no edge of
	// its own.
	RDHup = unix.EPOLLRDHUP
	// Reported whether asked for or not: the connection is gone (Hup) or
	// failed (Err).
	Hup = unix.EPOLLHUP
	Err = unix.EPOLLERR
)

// ErrPoller wraps a failure to make or use an epoll set.
var ErrPoller = errors.New("epoll: poller")

// Poller is an epoll set waited for through Go's netpoller (an epoll fd is
// itself pollable): the waiting goroutine parks like any network read
// instead of holding a thread in a blocking epoll_wait.
type Poller struct {
	ep     int
	f      *os.File // owns ep
	raw    syscall.RawConn
	wake   int // eventfd
	tick   int // timerfd; -1 without a tick
	events []unix.EpollEvent

	// The one wait closure (one per Wait would allocate).
	n    int
	werr error
	wait func(uintptr) bool
}

// New makes a Poller reporting at most maxEvents per Wait.
func New(maxEvents int) (*Poller, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("%w: epoll_create: %w", ErrPoller, err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("%w: eventfd: %w", ErrPoller, err)
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, fmt.Errorf("%w: epoll_ctl: %w", ErrPoller, err)
	}
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, fmt.Errorf("%w: set nonblock: %w", ErrPoller, err)
	}
	f := os.NewFile(uintptr(ep), "epoll")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		unix.Close(wake)
		return nil, fmt.Errorf("%w: %w", ErrPoller, err)
	}
	p := &Poller{ep: ep, f: f, raw: raw, wake: wake, tick: -1, events: make([]unix.EpollEvent, maxEvents)}
	p.wait = func(fd uintptr) bool {
		p.n, p.werr = rawEpollPoll(int(fd), p.events)
		if p.werr == unix.EINTR {
			p.n, p.werr = 0, nil
			return true
		}
		return p.n > 0 || p.werr != nil // none ready: park until some are
	}
	return p, nil
}

// SetTick makes Wait report a tick every d (a timerfd in the set).
func (p *Poller) SetTick(d time.Duration) error {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("%w: timerfd: %w", ErrPoller, err)
	}
	ts := unix.NsecToTimespec(int64(d))
	if err := unix.TimerfdSettime(fd, 0, &unix.ItimerSpec{Interval: ts, Value: ts}, nil); err != nil {
		unix.Close(fd)
		return fmt.Errorf("%w: timerfd_settime: %w", ErrPoller, err)
	}
	if err := unix.EpollCtl(p.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("%w: epoll_ctl: %w", ErrPoller, err)
	}
	p.tick = fd
	return nil
}

// Close releases the set, its eventfd and its timerfd. The descriptors
// added to it are the caller's.
func (p *Poller) Close() {
	p.f.Close()
	unix.Close(p.wake)
	if p.tick >= 0 {
		unix.Close(p.tick)
	}
}

// Wake makes the waiting loop's Wait return with woken set.
func (p *Poller) Wake() {
	var one = [8]byte{1}
	_, _ = unix.Write(p.wake, one[:])
}

// Add puts fd in the set with events; the events report fd as their Fd.
func (p *Poller) Add(fd int, events uint32) error {
	return rawEpollCtl(p.ep, unix.EPOLL_CTL_ADD, fd, events)
}

// Mod changes fd's events (re-arms a one-shot fd).
func (p *Poller) Mod(fd int, events uint32) error {
	return rawEpollCtl(p.ep, unix.EPOLL_CTL_MOD, fd, events)
}

// Del takes fd out of the set (closing fd does too, when it has no
// duplicates).
func (p *Poller) Del(fd int) error {
	return rawEpollCtl(p.ep, unix.EPOLL_CTL_DEL, fd, 0)
}

// rawEpollCtl is epoll_ctl as a raw system call (it never blocks).
func rawEpollCtl(ep, op, fd int, events uint32) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(fd)}
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(ep), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(&ev)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Wait parks until descriptors are ready and returns their events (valid
// until the next Wait), whether Wake was called, and whether the tick
// came; the eventfd's and timerfd's own events are not among them.
func (p *Poller) Wait() (ev []unix.EpollEvent, woken, ticked bool, err error) {
	err = p.raw.Read(p.wait)
	if err == nil {
		err = p.werr
	}
	if err != nil {
		return nil, false, false, fmt.Errorf("%w: epoll_wait: %w", ErrPoller, err)
	}
	return p.sift(p.events[:p.n])
}

// Poll is Wait without the wait, into the caller's buf (another goroutine
// may be in Wait meanwhile: each ready descriptor's event goes to one of
// them). It returns at once, with no events when none are ready.
func (p *Poller) Poll(buf []unix.EpollEvent) (ev []unix.EpollEvent, woken, ticked bool, err error) {
	n, err := rawEpollPoll(p.ep, buf)
	if err == unix.EINTR {
		return nil, false, false, nil
	}
	if err != nil {
		return nil, false, false, fmt.Errorf("%w: epoll_wait: %w", ErrPoller, err)
	}
	return p.sift(buf[:n])
}

// sift takes the eventfd's and timerfd's events out of ev (resetting
// their counters) and reports them.
func (p *Poller) sift(ev []unix.EpollEvent) (_ []unix.EpollEvent, woken, ticked bool, err error) {
	for i := 0; i < len(ev); {
		switch int(ev[i].Fd) {
		case p.wake:
			woken = true
		case p.tick:
			ticked = true
		default:
			i++
			continue
		}
		var b [8]byte
		_, _ = Read(int(ev[i].Fd), b[:]) // reset the counter
		ev[i] = ev[len(ev)-1]
		ev = ev[:len(ev)-1]
	}
	return ev, woken, ticked, nil
}

// The loops' read, write and epoll_wait never block (the sockets are
// non-blocking and the wait's timeout is 0), so they are made as raw
// system calls: without the runtime's entersyscall/exitsyscall around
// each, which cost a request more than its parse (and, after an idle
// spell, a futex wake of the runtime's monitor thread). A write copies at
// most the socket's buffer space, so none holds its P for long.

// Read is read(2) on a non-blocking descriptor.
func Read(fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// Write is write(2) on a non-blocking descriptor.
func Write(fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawEpollPoll is epoll_wait with a timeout of 0 (epoll_pwait without a
// signal mask, which every Linux architecture has).
func rawEpollPoll(ep int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
