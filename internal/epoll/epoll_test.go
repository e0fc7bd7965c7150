package epoll_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/infera/infera/internal/epoll"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pollPipe returns a poller of 8 events and a non-blocking pipe whose read
// end (fds[0]) it watches for events; both are closed when the test ends.
func pollPipe(t *testing.T, events uint32) (*epoll.Poller, [2]int) {
	t.Helper()
	p, err := epoll.New(8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Close(fds[1])
		unix.Close(fds[0])
	})
	if err := p.Add(fds[0], events); err != nil {
		t.Fatal(err)
	}
	return p, fds
}

// A pipe's read end in a one-shot set: Wait reports it once per arming,
// Wake and the tick come through as flags, raw Read and Write move bytes.
func TestPoller(t *testing.T) {
	p, fds := pollPipe(t, epoll.In|epoll.OneShot)
	if _, err := epoll.Read(fds[0], make([]byte, 4)); err != unix.EAGAIN {
		t.Fatalf("read of an empty pipe: %v, want EAGAIN", err)
	}
	if n, err := epoll.Write(fds[1], []byte("ping")); n != 4 || err != nil {
		t.Fatalf("write: %d %v", n, err)
	}
	ev, woken, ticked, err := p.Wait()
	if err != nil || len(ev) != 1 || int(ev[0].Fd) != fds[0] || woken || ticked {
		t.Fatalf("wait: %v %v %v %v", ev, woken, ticked, err)
	}
	// One-shot: still readable, but not reported until re-armed.
	p.Wake()
	ev, woken, _, err = p.Wait()
	if err != nil || len(ev) != 0 || !woken {
		t.Fatalf("wait after wake: %v %v %v", ev, woken, err)
	}
	if err := p.Mod(fds[0], epoll.In|epoll.OneShot); err != nil {
		t.Fatal(err)
	}
	if ev, _, _, err = p.Wait(); err != nil || len(ev) != 1 {
		t.Fatalf("wait after re-arming: %v %v", ev, err)
	}
	buf := make([]byte, 8)
	if n, err := epoll.Read(fds[0], buf); n != 4 || err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("read: %q %v", buf[:n], err)
	}
	if err := p.Del(fds[0]); err != nil {
		t.Fatal(err)
	}
	if err := p.SetTick(time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for {
		_, _, ticked, err := p.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if ticked {
			break
		}
	}
}

// Poll returns at once: nothing when nothing is ready, else an
// edge-triggered descriptor's event once, into the caller's buffer, with
// Wake's flag.
func TestPollerPoll(t *testing.T) {
	p, fds := pollPipe(t, epoll.In|epoll.Edge)
	buf := make([]unix.EpollEvent, 1)
	if ev, woken, ticked, err := p.Poll(buf); len(ev) != 0 || woken || ticked || err != nil {
		t.Fatalf("poll of nothing: %v %v %v %v", ev, woken, ticked, err)
	}
	if _, err := epoll.Write(fds[1], []byte("ping")); err != nil {
		t.Fatal(err)
	}
	ev, _, _, err := p.Poll(buf)
	if err != nil || len(ev) != 1 || int(ev[0].Fd) != fds[0] {
		t.Fatalf("poll: %v %v", ev, err)
	}
	if ev, _, _, _ := p.Poll(buf); len(ev) != 0 {
		t.Fatalf("edge-triggered event reported twice: %v", ev)
	}
	p.Wake()
	if ev, woken, _, err := p.Poll(buf); len(ev) != 0 || !woken || err != nil {
		t.Fatalf("poll after wake: %v %v %v", ev, woken, err)
	}
}
