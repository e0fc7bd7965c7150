package epoll

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// MaxHeld bounds the bytes a Held keeps for its socket's next read.
const MaxHeld = 64 << 10

// Held keeps what is written to a socket that Go's netpoller watches until
// the next read, which sends it from inside its wait for the answer.
//
// A read on such a socket first tries the socket and parks only when that
// finds nothing (EAGAIN): the netpoller forgets a readiness edge when a
// read begins (its pollReset), so it cannot park first. Right after a
// request (or an answer, on a keep-alive client connection) that first
// read nearly always finds nothing: a system call per exchange for
// nothing. Held makes the read a RawConn.Read whose callback, called once
// the reset is done, first writes the held bytes and asks to wait; the
// answer's readiness edge comes after the write, so it is kept, and the
// socket is read only once there is something to read.
//
// The zero Held holds nothing; Init gives it its socket. It is used by one
// goroutine at a time (the connection's reader and writer, which take turns).
type Held struct {
	raw  syscall.RawConn
	buf  []byte // buf[off:] is still to be sent
	off  int
	fn   func(fd uintptr) bool // sendThenRead, made once
	p    []byte                // sendThenRead's read buffer ...
	n    int                   // ... and its result
	err  error
	rest bool // the socket took part of buf: the rest goes the usual way
	// waited: the last Read asked to wait (its callback returned false)
	waited bool
	// then, when set (Then), runs once a Read has sent the held bytes,
	// before it waits for the socket.
	then func()
	// early: the peer may send before it has the held bytes (a client
	// that pipelines, or half-closes): a Read tries the socket after
	// sending them (PeerSendsEarly).
	early bool

	wfn func(fd uintptr) bool // sendNow, made once
	wp  []byte                // Send's bytes ...
	wn  int                   // ... and how many went
}

// Init makes h hold for the socket beneath c; without one (c is not a
// syscall.Conn) Hold never holds.
func (h *Held) Init(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	h.raw = raw
	h.fn = h.sendThenRead
	h.wfn = h.sendNow
}

// Hold keeps p (copied) for the next Read. false: p is not held (no
// socket, or MaxHeld would be exceeded): the caller sends Take's bytes
// and then p its usual way.
func (h *Held) Hold(p []byte) bool {
	if h.raw == nil || len(h.buf)-h.off+len(p) > MaxHeld {
		return false
	}
	h.buf = append(h.buf, p...)
	return true
}

// HoldSpace returns the held bytes' buffer for the caller to append at
// most n bytes to, and then pass to SetHeld: the bytes are framed where they
// are held, not built elsewhere and copied by Hold. false: they would not
// be held (as Hold).
func (h *Held) HoldSpace(n int) ([]byte, bool) {
	if h.raw == nil || len(h.buf)-h.off+n > MaxHeld {
		return nil, false
	}
	return h.buf, true
}

// SetHeld keeps b, HoldSpace's buffer with the caller's bytes appended, as
// what is held.
func (h *Held) SetHeld(b []byte) { h.buf = b }

// Then makes every Read that sends held bytes call f once they have gone,
// before it waits for the socket: work the caller put off until its
// answer was out (the router's bookkeeping of a stream) is done while the
// peer reads that answer, neither before the answer nor after the peer's
// next request. f runs on the reading goroutine, within the read; it must
// not use the socket.
func (h *Held) Then(f func()) { h.then = f }

// PeerSendsEarly makes every Read that sends held bytes try the socket
// before it waits: bytes (or the end of the stream) that came before the
// Read began left their readiness edge to the netpoller's reset, and a
// Read that parked at once would wait for them until its deadline. A
// client may send its next request, or half-close, before it has its
// answer; an upstream answers only what it was sent.
func (h *Held) PeerSendsEarly() { h.early = true }

// Ready reports whether h has its socket (Init found one): only then does
// Hold hold.
func (h *Held) Ready() bool { return h.raw != nil }

// Holding reports whether bytes are held.
func (h *Held) Holding() bool { return h.off < len(h.buf) }

// Take returns the bytes held (valid until the next Hold) and holds nothing
// more: the caller sends them its usual way.
func (h *Held) Take() []byte {
	b := h.buf[h.off:]
	h.buf, h.off = h.buf[:0], 0
	return b
}

// Read sends the held bytes, if any, and then reads into p once the
// socket has something, waiting as a read does (its deadline applies).
// With nothing held it is a read that tries the socket first, as Go's
// does, but with a raw system call (see Send). rest, when not empty, is what the socket did not take (it was
// full): the caller sends it its usual way and then reads its usual way
// (n is 0). A failed write or read is returned as an *os.SyscallError;
// the wait's own errors (deadline, closed) as RawConn.Read returns them.
// The end of the stream is io.EOF.
func (h *Held) Read(p []byte) (n int, rest []byte, err error) {
	h.p, h.n, h.err, h.rest, h.waited = p, 0, nil, false, false
	werr := h.raw.Read(h.fn)
	n, err, partial := h.n, h.err, h.rest
	h.p, h.err = nil, nil
	rest = h.Take()
	if werr != nil {
		return 0, nil, werr
	}
	if err != nil {
		return 0, nil, err
	}
	if partial {
		return 0, rest, nil
	}
	return n, nil, nil
}

// Waited reports whether the last Read waited for the socket (it sent held
// bytes, or found nothing to read at first) rather than returning from its
// first try: a caller that read the clock just before a Read that did not
// wait may take that time for when the bytes came.
func (h *Held) Waited() bool { return h.waited }

// Send writes p to the socket now (Ready must be true), waiting for room
// as a write does (its deadline applies), and returns how much went. The
// system calls are raw, as Read's are: a write through the runtime's
// syscall bookkeeping wakes the runtime's monitor thread (sysmon) when
// the process was idle, a futex call and a thread woken on the way to a
// client waiting for its answer. A failed write is an *os.SyscallError,
// the wait's own errors are RawConn.Write's.
func (h *Held) Send(p []byte) (int, error) {
	h.wp, h.wn, h.err = p, 0, nil
	werr := h.raw.Write(h.wfn)
	n, err := h.wn, h.err
	h.wp, h.err = nil, nil
	if werr != nil {
		return n, werr
	}
	return n, err
}

// sendNow is Send's RawConn.Write callback: it writes until all of h.wp
// went, asking to wait while the socket is full.
func (h *Held) sendNow(fd uintptr) bool {
	for h.wn < len(h.wp) {
		n, err := Write(int(fd), h.wp[h.wn:])
		switch err {
		case nil:
			h.wn += n
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			h.err = os.NewSyscallError("write", err)
			return true
		}
	}
	return true
}

// sendThenRead is Read's RawConn.Read callback: its first call writes the
// held bytes and asks to wait (PeerSendsEarly: reads first); later calls read into h.p, asking to wait
// again while there is nothing. The socket is non-blocking: raw system
// calls, as the loops make them.
func (h *Held) sendThenRead(fd uintptr) bool {
	if h.Holding() {
		for h.Holding() {
			n, err := Write(int(fd), h.buf[h.off:])
			switch err {
			case nil:
				h.off += n
			case unix.EINTR:
			case unix.EAGAIN:
				h.rest = true
				return true
			default:
				h.err = os.NewSyscallError("write", err)
				return true
			}
		}
		if h.then != nil {
			h.then()
		}
		h.waited = true
		if !h.early {
			return false
		}
	}
	for {
		n, err := Read(int(fd), h.p)
		switch err {
		case nil:
			if n == 0 && len(h.p) > 0 {
				h.err = io.EOF
			}
			h.n = n
			return true
		case unix.EINTR:
		case unix.EAGAIN:
			h.waited = true
			return false
		default:
			h.err = os.NewSyscallError("read", err)
			return true
		}
	}
}

// OpError names err (from Read or Send) as a net.Conn's read or write on
// c names its own: a *net.OpError with c's addresses; io.EOF and nil pass
// as they are.
func OpError(c net.Conn, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		switch oe.Op {
		case "raw-read":
			oe.Op = "read"
		case "raw-write":
			oe.Op = "write"
		}
		return err
	}
	op := "read"
	var se *os.SyscallError
	if errors.As(err, &se) {
		op = se.Syscall
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
