package upstream

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp refreshes its Date header from one process-wide
		// goroutine started on first use and never stopped.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// fasthttp's worker-pool cleaner notices Serve's end only after
		// its idle sleep (MaxIdleWorkerDuration) and then exits by itself.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	)
}

// echoServer accepts connections and answers each read with its bytes,
// until the test ends.
func echoServer(t testing.TB) string {
	return serveEach(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// serveEach accepts connections until the test ends and runs serve on
// each (on its own goroutine; the connection is closed after it).
func serveEach(t testing.TB, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { serve(c); _ = c.Close() }()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// dialPeer dials a Conn into set with progress p (nil: none) and returns
// it with the peer's end, which the test writes to.
func dialPeer(t *testing.T, set *Set, p Progress) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := Dial(set, ln.Addr().String(), time.Second, 5*time.Second, p)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = peer.Close() })
	return c, peer
}

type countProgress struct {
	n    atomic.Int64
	last atomic.Int64 // the last stamp
	tick time.Duration
	err  error
}

func (p *countProgress) Progress(now int64)                { p.n.Add(1); p.last.Store(now) }
func (p *countProgress) StallTick() time.Duration          { return p.tick }
func (p *countProgress) GiveUp(now, start time.Time) error { return p.err }

func TestDialReadStampsProgressAndCloseAllCuts(t *testing.T) {
	addr := echoServer(t)
	var set Set
	p := &countProgress{}
	c, err := Dial(&set, addr, time.Second, 5*time.Second, p)
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 1 {
		t.Fatal("the dialed connection is not in the set")
	}
	if _, err := c.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("read %q, %v", buf, err)
	}
	if p.n.Load() == 0 {
		t.Fatal("a read that returned bytes stamped no progress")
	}
	if n := set.CloseAll(); n != 1 {
		t.Fatalf("CloseAll closed %d connections, want 1", n)
	}
	if set.Len() != 0 {
		t.Fatal("a closed connection is still in the set")
	}
	if _, err := Dial(&set, addr, time.Second, time.Second, nil); !errors.Is(err, ErrShuttingDown) {
		t.Fatalf("Dial after CloseAll: %v, want ErrShuttingDown", err)
	}
}

type owner bool

func (o owner) CanRetry() bool { return bool(o) }

// A silent worker: an unwatched read gives up with Progress.GiveUp's error
// while its owner may retry, and keeps waiting (to the hard cap) when not.
func TestReadUnwatchedGivesUpOnlyWithRetryLeft(t *testing.T) {
	addr := echoServer(t)
	var set Set
	defer set.CloseAll()
	stalled := errors.New("stalled")
	p := &countProgress{tick: 10 * time.Millisecond, err: stalled}
	c, err := Dial(&set, addr, time.Second, 5*time.Second, p)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	c.SetOwner(owner(true))
	if _, err := c.Read(buf); !errors.Is(err, stalled) {
		t.Fatalf("read with retry left: %v, want the GiveUp error", err)
	}
	c.SetOwner(owner(false))
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := c.Read(buf); !IsTimeout(err) {
		t.Fatalf("read with no retry left: %v, want the hard deadline's timeout", err)
	}
}

// A silent worker: an unwatched read's first wait ends at the earliest of
// its stall tick (GiveUp's error), its idle timeout and fasthttp's
// deadline (a timeout), whichever way round they come.
func TestReadUnwatchedWaitsForTheEarliestDeadline(t *testing.T) {
	addr := echoServer(t)
	stalled := errors.New("stalled")
	for _, tc := range []struct {
		name          string
		tick, timeout time.Duration
		hard          time.Duration // fasthttp's deadline from now; 0: none
		want          error         // nil: a timeout
	}{
		{"tick before the timeout", 20 * time.Millisecond, 5 * time.Second, 0, stalled},
		{"tick before fasthttp's deadline", 20 * time.Millisecond, 5 * time.Second, 2 * time.Second, stalled},
		{"fasthttp's deadline before the tick", time.Second, 5 * time.Second, 30 * time.Millisecond, nil},
		{"timeout before the tick", time.Second, 30 * time.Millisecond, 0, nil},
	} {
		var set Set
		c, err := Dial(&set, addr, time.Second, tc.timeout, &countProgress{tick: tc.tick, err: stalled})
		if err != nil {
			t.Fatal(err)
		}
		if tc.hard > 0 {
			_ = c.SetReadDeadline(time.Now().Add(tc.hard))
		}
		_, err = c.Read(make([]byte, 1))
		if tc.want == nil && !IsTimeout(err) || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: read %v, want %v (nil: a timeout)", tc.name, err, tc.want)
		}
		set.CloseAll()
	}
}

// timeoutBeater beats every second against a stream deadline 30 ms
// away, counting heartbeats and read timeouts.
type timeoutBeater struct{ beats, timeouts int }

func (b *timeoutBeater) BeforeRead(now time.Time) (time.Time, time.Duration) {
	return now.Add(30 * time.Millisecond), time.Second
}
func (b *timeoutBeater) Heartbeat() error { b.beats++; return nil }
func (b *timeoutBeater) NoteReadTimeout() { b.timeouts++ }

// A watched read whose stream deadline comes before its beat waits for
// the deadline: a timeout, noted, and no heartbeat.
func TestWatchedReadDeadlineBeforeTheBeat(t *testing.T) {
	var set Set
	defer set.CloseAll()
	c, _ := dialPeer(t, &set, nil)
	b := &timeoutBeater{}
	c.Watch(&WatchSlot{Watcher: b})
	if _, err := c.Read(make([]byte, 1)); !IsTimeout(err) {
		t.Fatalf("watched read: %v, want the stream deadline's timeout", err)
	}
	if b.beats != 0 || b.timeouts != 1 {
		t.Fatalf("%d heartbeats and %d noted timeouts, want 0 and 1", b.beats, b.timeouts)
	}
}

type beater struct {
	beats   atomic.Int64
	stopAt  int64
	stopErr error
}

func (b *beater) BeforeRead(now time.Time) (time.Time, time.Duration) {
	return now.Add(5 * time.Second), 5 * time.Millisecond
}

func (b *beater) Heartbeat() error {
	if b.beats.Add(1) >= b.stopAt {
		return b.stopErr
	}
	return nil
}

func (b *beater) NoteReadTimeout() {}

// A watched read runs the watcher's heartbeat at every beat of silence,
// and the heartbeat's error ends the read.
func TestWatchedReadHeartbeats(t *testing.T) {
	addr := echoServer(t)
	var set Set
	defer set.CloseAll()
	c, err := Dial(&set, addr, time.Second, 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	gone := errors.New("client gone")
	b := &beater{stopAt: 3, stopErr: gone}
	slot := &WatchSlot{Watcher: b}
	c.Watch(slot)
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, gone) {
		t.Fatalf("watched read: %v, want the heartbeat's error", err)
	}
	if n := b.beats.Load(); n != 3 {
		t.Fatalf("%d heartbeats, want 3", n)
	}
}

// A read that waited for its bytes stamps progress with the time they
// came, not the time the read began (which may be a stall tick earlier);
// watched or not.
func TestReadThatWaitedStampsProgressAfterTheWait(t *testing.T) {
	for _, watched := range []bool{false, true} {
		var set Set
		p := &countProgress{tick: time.Second}
		c, peer := dialPeer(t, &set, p)
		if watched {
			// Heartbeats every 5 ms: the read's last one still comes
			// before the byte.
			c.Watch(&WatchSlot{Watcher: &beater{stopAt: 1 << 30}})
		}
		sent := make(chan int64, 1)
		go func() {
			time.Sleep(30 * time.Millisecond) // the read is waiting by then
			at := time.Now().UnixNano()
			_, _ = peer.Write([]byte("x"))
			sent <- at
		}()
		if _, err := c.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		at := <-sent
		if stamp := p.last.Load(); stamp < at {
			t.Fatalf("watched %v: progress stamped %v before the byte was sent", watched, time.Duration(at-stamp))
		}
		set.CloseAll()
	}
}

// Reads and writes on a connection allocate nothing: unwatched with a
// stall tick, with held writes, and watched.
func TestConnReadWriteAllocs(t *testing.T) {
	addr := echoServer(t)
	var set Set
	defer set.CloseAll()
	c, err := Dial(&set, addr, time.Second, 5*time.Second, &countProgress{tick: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	msg, buf := []byte("ping"), make([]byte, 4)
	exchange := func() {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(100, exchange); n != 0 {
		t.Fatalf("unwatched: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() { c.HoldWrites(); exchange() }); n != 0 {
		t.Fatalf("held: %v allocations", n)
	}
	c.Watch(&WatchSlot{Watcher: &beater{stopAt: 1 << 30}})
	if n := testing.AllocsPerRun(100, exchange); n != 0 {
		t.Fatalf("watched: %v allocations", n)
	}
}

// timedBeater beats every 100 ms and ends the read at its first
// heartbeat, recording when the read began and when the heartbeat came.
type timedBeater struct {
	began, beat time.Time
}

func (b *timedBeater) BeforeRead(now time.Time) (time.Time, time.Duration) {
	b.began = now
	return now.Add(5 * time.Second), 100 * time.Millisecond
}

func (b *timedBeater) Heartbeat() error {
	b.beat = time.Now()
	return errors.New("beat")
}

func (b *timedBeater) NoteReadTimeout() {}

// A heartbeat comes only after a beat of silence, even when the socket's
// deadline, kept from the read before (SetTick), wakes the read earlier.
func TestWatchedHeartbeatWaitsAWholeBeat(t *testing.T) {
	var set Set
	defer set.CloseAll()
	c, peer := dialPeer(t, &set, nil)
	b := &timedBeater{}
	c.Watch(&WatchSlot{Watcher: b})
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	// The first read sets a deadline a beat (and its slack) away and
	// returns the byte; the second, 30 ms later, keeps that deadline,
	// which wakes it 30 ms before its own beat.
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	if _, err := c.Read(make([]byte, 1)); err == nil || err.Error() != "beat" {
		t.Fatalf("second read: %v, want the heartbeat's error", err)
	}
	if silent := b.beat.Sub(b.began); silent < 100*time.Millisecond {
		t.Fatalf("heartbeat after %v of silence, want a beat (100ms)", silent)
	}
}
