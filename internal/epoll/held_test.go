package epoll_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/infera/infera/internal/epoll"
	"github.com/infera/infera/internal/testkit"
)

// echoOnce reads one message of n bytes on c and answers it with reply,
// reporting what it read on got.
func echoOnce(c net.Conn, n int, reply []byte, got chan<- []byte) {
	buf := make([]byte, n)
	_, err := io.ReadFull(c, buf)
	if err == nil && reply != nil {
		_, err = c.Write(reply)
	}
	if err != nil {
		buf = nil
	}
	got <- buf
}

// A held request goes out with the read, and the read returns the answer;
// the read after it is an ordinary one.
func TestHeldSendThenRead(t *testing.T) {
	a, b := testkit.TCPPair(t)
	var h epoll.Held
	h.Init(a)
	got := make(chan []byte, 1)
	go echoOnce(b, 10, []byte("answer"), got)
	if !h.Hold([]byte("hello")) || !h.Hold([]byte(" you")) || !h.Hold([]byte("!")) {
		t.Fatal("hold refused")
	}
	if !h.Holding() {
		t.Fatal("holds nothing")
	}
	select {
	case <-got:
		t.Fatal("the peer got bytes before the read")
	case <-time.After(20 * time.Millisecond):
	}
	buf := make([]byte, 16)
	n, rest, err := h.Read(buf)
	if err != nil || len(rest) != 0 || string(buf[:n]) != "answer" {
		t.Fatalf("read: %q rest %d %v", buf[:n], len(rest), err)
	}
	if s := <-got; string(s) != "hello you!" {
		t.Fatalf("peer read %q", s)
	}
	if h.Holding() {
		t.Fatal("still holds after the read")
	}
	// The peer closes: the next held read sends, then sees the end.
	go echoOnce(b, 3, nil, got)
	h.Hold([]byte("bye"))
	go func() { <-got; b.CloseWrite() }()
	if n, _, err := h.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read at the end: %d %v", n, err)
	}
}

// Then's work runs after the held bytes went out and before the read
// waits: the peer has the bytes while it runs (it answers them only
// after), and a read with nothing held does not run it.
func TestHeldThen(t *testing.T) {
	a, b := testkit.TCPPair(t)
	var h epoll.Held
	h.Init(a)
	peerGot := make(chan []byte, 1)
	answer := make(chan struct{})
	go func() {
		buf := make([]byte, 5)
		if _, err := io.ReadFull(b, buf); err != nil {
			buf = nil
		}
		peerGot <- buf
		<-answer
		_, _ = b.Write([]byte("next"))
	}()
	ran := 0
	h.Then(func() {
		ran++
		select {
		case s := <-peerGot:
			if string(s) != "hello" {
				t.Errorf("peer read %q", s)
			}
		case <-time.After(10 * time.Second):
			t.Error("the held bytes had not reached the peer when Then's work ran")
		}
		close(answer)
	})
	h.Hold([]byte("hello"))
	buf := make([]byte, 16)
	n, rest, err := h.Read(buf)
	if err != nil || len(rest) != 0 || string(buf[:n]) != "next" {
		t.Fatalf("read: %q rest %d %v", buf[:n], len(rest), err)
	}
	if ran != 1 {
		t.Fatalf("Then's work ran %d times for one held send", ran)
	}
	// Nothing held: an ordinary read, Then's work not run.
	go func() { _, _ = b.Write([]byte("more")) }()
	if n, _, err := h.Read(buf); err != nil || string(buf[:n]) != "more" {
		t.Fatalf("plain read: %q %v", buf[:n], err)
	}
	if ran != 1 {
		t.Fatalf("Then's work ran for a read with nothing held (%d)", ran)
	}
}

// A held read waits under the socket's read deadline.
func TestHeldDeadline(t *testing.T) {
	a, b := testkit.TCPPair(t)
	var h epoll.Held
	h.Init(a)
	got := make(chan []byte, 1)
	go echoOnce(b, 4, nil, got)
	_ = a.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	h.Hold([]byte("ping"))
	_, _, err := h.Read(make([]byte, 4))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want the deadline", err)
	}
	var ne net.Error
	if oe := epoll.OpError(a, err); !errors.As(oe, &ne) || !ne.Timeout() {
		t.Fatalf("OpError: %v is not a timeout", oe)
	}
	if s := <-got; string(s) != "ping" {
		t.Fatalf("peer read %q", s)
	}
}

// When the socket cannot take all that is held, Read returns the rest for
// the caller to send; MaxHeld bounds what is held.
func TestHeldRest(t *testing.T) {
	a, b := testkit.TCPPair(t)
	sc, _ := a.SyscallConn()
	_ = sc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 4096) })
	bc, _ := b.SyscallConn()
	_ = bc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
	var h epoll.Held
	h.Init(a)
	big := bytes.Repeat([]byte("x"), epoll.MaxHeld)
	if !h.Hold(big) {
		t.Fatal("MaxHeld bytes refused")
	}
	if h.Hold([]byte("y")) {
		t.Fatal("held more than MaxHeld")
	}
	n, rest, err := h.Read(make([]byte, 8))
	if err != nil || n != 0 || len(rest) == 0 || len(rest) >= len(big) {
		t.Fatalf("read: %d rest %d %v", n, len(rest), err)
	}
	sent := len(big) - len(rest)
	got := make(chan []byte, 1)
	go echoOnce(b, len(big), nil, got)
	if _, err := a.Write(rest); err != nil {
		t.Fatal(err)
	}
	if s := <-got; len(s) != len(big) {
		t.Fatalf("peer read %d bytes (%d sent held)", len(s), sent)
	}
}

// HoldSpace lends the held bytes' buffer where Hold would hold, and
// SetHeld keeps what was appended to it; over MaxHeld, or without a socket,
// it refuses as Hold does.
func TestHeldSpace(t *testing.T) {
	var none epoll.Held
	if _, ok := none.HoldSpace(1); ok {
		t.Fatal("space without a socket")
	}
	a, _ := testkit.TCPPair(t)
	var h epoll.Held
	h.Init(a)
	h.Hold([]byte("held "))
	dst, ok := h.HoldSpace(epoll.MaxHeld - len("held "))
	if !ok {
		t.Fatal("space up to MaxHeld refused")
	}
	h.SetHeld(append(dst, "appended"...))
	if _, ok := h.HoldSpace(epoll.MaxHeld); ok {
		t.Fatal("space past MaxHeld")
	}
	if got := string(h.Take()); got != "held appended" {
		t.Fatalf("held %q", got)
	}
}

// Without a socket nothing is held; a failed write is a syscall error.
func TestHeldNoSocketAndErrors(t *testing.T) {
	var h epoll.Held
	h.Init(nil)
	if h.Hold([]byte("x")) {
		t.Fatal("held without a socket")
	}
	a, b := testkit.TCPPair(t)
	h.Init(a)
	_ = b.SetLinger(0)
	b.Close() // a reset
	time.Sleep(10 * time.Millisecond)
	h.Hold([]byte("ping"))
	_, _, err := h.Read(make([]byte, 4))
	var se *os.SyscallError
	if !errors.As(err, &se) || !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("read after a reset: %v", err)
	}
	if oe := epoll.OpError(a, err); !errors.As(oe, new(*net.OpError)) {
		t.Fatalf("OpError: %T", oe)
	}
}

// A held exchange allocates nothing, nor does Send with a read after it.
func TestHeldAlloc(t *testing.T) {
	a, b := testkit.TCPPair(t)
	var h epoll.Held
	h.Init(a)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4)
		for {
			if _, err := io.ReadFull(b, buf); err != nil {
				return
			}
			if _, err := b.Write(buf); err != nil {
				return
			}
		}
	}()
	req, buf := []byte("ping"), make([]byte, 4)
	readAnswer := func() {
		for got := 0; got < 4; {
			n, _, err := h.Read(buf[got:])
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	held := testing.AllocsPerRun(200, func() {
		h.Hold(req)
		readAnswer()
	})
	sent := testing.AllocsPerRun(200, func() {
		if _, err := h.Send(req); err != nil {
			t.Fatal(err)
		}
		readAnswer()
	})
	a.Close()
	<-done
	if held != 0 || sent != 0 {
		t.Fatalf("%v allocations per held exchange, %v per Send and read, want 0", held, sent)
	}
}

// Send writes at once, all of it: a socket that is full is waited on until
// the peer makes room. Read with nothing held then reads as any read.
func TestHeldSendWaitsForRoom(t *testing.T) {
	a, b := testkit.TCPPair(t)
	sc, _ := a.SyscallConn()
	_ = sc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 4096) })
	var h epoll.Held
	h.Init(a)
	big := bytes.Repeat([]byte("z"), 1<<20) // more than both socket buffers
	got := make(chan []byte, 1)
	go echoOnce(b, len(big), []byte("ok"), got)
	if n, err := h.Send(big); n != len(big) || err != nil {
		t.Fatalf("Send: %d, %v", n, err)
	}
	if s := <-got; !bytes.Equal(s, big) {
		t.Fatalf("peer read %d bytes, want %d", len(s), len(big))
	}
	if h.Holding() {
		t.Fatal("Send held its bytes")
	}
	buf := make([]byte, 2)
	n, rest, err := h.Read(buf)
	if err != nil || rest != nil || string(buf[:n]) != "ok" {
		t.Fatalf("read after Send: %q, rest %q, %v", buf[:n], rest, err)
	}
}

// Send into a socket that stays full ends at the write deadline, named as
// a net.Conn names its own; after a reset it is a syscall error.
func TestHeldSendErrors(t *testing.T) {
	a, b := testkit.TCPPair(t)
	var h epoll.Held
	h.Init(a)
	big := bytes.Repeat([]byte("z"), 64<<20) // b never reads
	_ = a.SetWriteDeadline(time.Now().Add(30 * time.Millisecond))
	n, err := h.Send(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n == 0 {
		t.Fatalf("Send to a full socket: %d, %v", n, err)
	}
	var oe *net.OpError
	if e := epoll.OpError(a, err); !errors.As(e, &oe) || oe.Op != "write" || !oe.Timeout() {
		t.Fatalf("OpError: %v", e)
	}
	_ = a.SetWriteDeadline(time.Time{})

	c, d := testkit.TCPPair(t)
	h.Init(c)
	_ = d.SetLinger(0)
	d.Close() // a reset
	time.Sleep(10 * time.Millisecond)
	_, err = h.Send([]byte("ping"))
	var se *os.SyscallError
	if !errors.As(err, &se) || !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("Send after a reset: %v", err)
	}
	_ = b
}

// Waited tells a read that found its bytes at the first try from one that
// waited for them (for nothing, here), and counts a held send as a wait.
func TestHeldWaited(t *testing.T) {
	a, b := testkit.TCPPair(t)
	var h epoll.Held
	h.Init(a)
	buf := make([]byte, 8)
	if _, err := b.Write([]byte("here")); err != nil {
		t.Fatal(err)
	}
	waitQueued(t, a, 4)
	if n, _, err := h.Read(buf); err != nil || string(buf[:n]) != "here" || h.Waited() {
		t.Fatalf("read of bytes already there: %q %v, waited %v", buf[:n], err, h.Waited())
	}
	// Nothing comes: the read waits until its deadline.
	_ = a.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
	if _, _, err := h.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) || !h.Waited() {
		t.Fatalf("read of nothing: %v, waited %v", err, h.Waited())
	}
	_ = a.SetReadDeadline(time.Time{})
	got := make(chan []byte, 1)
	go echoOnce(b, 4, []byte("pong"), got)
	h.Hold([]byte("ping"))
	if n, _, err := h.Read(buf); err != nil || string(buf[:n]) != "pong" || !h.Waited() {
		t.Fatalf("held read: %q %v, waited %v", buf[:n], err, h.Waited())
	}
	<-got
}

// A peer that sends before it has the held bytes (PeerSendsEarly): the
// Read that sends them finds what came before it began, whose readiness
// edge the netpoller's reset dropped, instead of waiting for more.
func TestHeldPeerSendsEarly(t *testing.T) {
	a, b := testkit.TCPPair(t)
	var h epoll.Held
	h.Init(a)
	h.PeerSendsEarly()
	if _, err := b.Write([]byte("next")); err != nil {
		t.Fatal(err)
	}
	waitQueued(t, a, 4) // before the read begins
	// ... and the netpoller has seen them (an idle scheduler polls while
	// some goroutine waits on a socket), so that the read's reset drops
	// their edge, as for a client's next request that came while its
	// answer was worked on.
	idle, _ := testkit.TCPPair(t)
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		_, _ = idle.Read(make([]byte, 1))
	}()
	time.Sleep(20 * time.Millisecond)
	// Without PeerSendsEarly the read would park after its send and
	// wait for more, here until this deadline.
	_ = a.SetReadDeadline(time.Now().Add(10 * time.Second))
	h.Hold([]byte("answer"))
	buf := make([]byte, 8)
	if n, _, err := h.Read(buf); err != nil || string(buf[:n]) != "next" {
		t.Fatalf("held read with bytes already in: %q %v", buf[:n], err)
	}
	got := make([]byte, 6)
	if _, err := io.ReadFull(b, got); err != nil || string(got) != "answer" {
		t.Fatalf("the peer got %q %v", got, err)
	}
	_ = idle.Close()
	<-waiting
}

// waitQueued waits until c's receive queue holds n bytes: a raw read can
// see them.
func waitQueued(t *testing.T, c *net.TCPConn, n int) {
	t.Helper()
	sc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for {
		var q int
		var qerr error
		_ = sc.Control(func(fd uintptr) { q, qerr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		if qerr != nil {
			t.Fatal(qerr)
		}
		if q == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}
