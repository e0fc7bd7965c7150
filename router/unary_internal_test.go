package router

import (
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/internal/testkit"
)

// A unary request answered before its client watch starts costs the watch
// no allocation (the sweeper's list is linked through the slots).
func TestClientWatchAnsweredAllocs(t *testing.T) {
	c, _ := testkit.TCPPair(t)
	var w clientWatch
	w.init()
	var ctx fasthttp.RequestCtx
	if n := testing.AllocsPerRun(100, func() {
		w.start(c)
		if w.stop(&ctx) {
			t.Fatal("a client that stayed counted as gone")
		}
	}); n != 0 {
		t.Fatalf("%.1f allocations a request, want 0", n)
	}
	testkit.Eventually(t, "the sweeper to end with no watch armed", func() bool { return !watchSweeper.running.Load() })
}

// A request still waiting a tick or two after its start is watched: its
// client leaving is seen, and the sweeper ends once the watch has stopped.
func TestClientWatchStartedBySweeper(t *testing.T) {
	c, peer := testkit.TCPPair(t)
	var w clientWatch
	w.init()
	w.start(c)
	if err := peer.Close(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the watch to see its client leave", w.gone.Load)
	var ctx fasthttp.RequestCtx
	if !w.stop(&ctx) {
		t.Fatal("a client that left not counted as gone")
	}
	testkit.Eventually(t, "the sweeper to end with no watch armed", func() bool { return !watchSweeper.running.Load() })
	// The slot serves the next request: answered at once, not watched.
	c2, _ := testkit.TCPPair(t)
	w.start(c2)
	if w.stop(&ctx) {
		t.Fatal("the next request's client counted as gone")
	}
}

// A watched client that pipelines its next request: the watch sees the
// byte without taking it, so the next read finds the request whole and
// the connection stays open for it.
func TestClientWatchLeavesPipelinedByte(t *testing.T) {
	c, peer := testkit.TCPPair(t)
	var w clientWatch
	w.init()
	w.start(c)
	if _, err := peer.Write([]byte("G")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the sweeper to start the watch", func() bool { return w.slot.state.Load() == watchRunning })
	w.wg.Wait() // the watch ends at the byte
	var ctx fasthttp.RequestCtx
	if w.stop(&ctx) {
		t.Fatal("a client that pipelined counted as gone")
	}
	if ctx.Response.ConnectionClose() {
		t.Fatal("the connection closes after the answer")
	}
	var b [1]byte
	if n, err := c.Read(b[:]); n != 1 || b[0] != 'G' || err != nil {
		t.Fatalf("the next read got %q %v", b[:n], err)
	}
	testkit.Eventually(t, "the sweeper to end with no watch armed", func() bool { return !watchSweeper.running.Load() })
}
