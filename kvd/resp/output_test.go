package resp

import (
	"bytes"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/testkit"
)

const outputLogMsg = "resp client disconnected over its output buffer limit"

// TestClientNotReadingIsBounded: a client that pipelines GETs of a 1 MiB
// value and never reads its replies costs kvd about one reply's worth of
// memory, not a reply per request it sent (2,000 here: 2 GB); other
// clients are served meanwhile, and once its socket has taken nothing for
// OutputTimeout it is disconnected, counted and logged.
func TestClientNotReadingIsBounded(t *testing.T) {
	for _, mode := range []string{"loop", "goroutine"} {
		t.Run(mode, func(t *testing.T) { testClientNotReading(t, mode == "goroutine") })
	}
}

func testClientNotReading(t *testing.T, plain bool) {
	var sink testkit.LogSink
	l := startListenerMode(t, Options{OutputTimeout: 2 * time.Second, Log: zerolog.New(&sink)}, nil, plain)
	ping := dialRaw(t, l.addr)
	if got := ping.do(encode("SET", "v", strings.Repeat("x", 1<<20))); string(got) != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rss0 := rssBytes(t)

	c, err := net.Dial("tcp", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
	get := encode("GET", "v")
	if _, err := c.Write(bytes.Repeat(get, 2000)); err != nil {
		t.Fatal(err)
	}
	var peak uint64
	var peakRSS int64
	testkit.Eventually(t, "the non-reading client disconnected", func() bool {
		if got := ping.do(encode("PING")); string(got) != "+PONG\r\n" {
			t.Fatalf("PING while a client does not read: %q", got)
		}
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapInuse)
		peakRSS = max(peakRSS, rssBytes(t))
		return l.srv.C.OutputStalled.Load() == 1
	})
	if grew := int64(peak) - int64(before.HeapInuse); grew > 64<<20 {
		t.Fatalf("heap grew by %d MB for a client that does not read", grew>>20)
	}
	if grew := peakRSS - rss0; grew > 64<<20 {
		t.Fatalf("RSS grew by %d MB for a client that does not read", grew>>20)
	}
	if n := len(sink.Find(t, outputLogMsg)); n != 1 {
		t.Fatalf("%d disconnect log lines, want 1:\n%s", n, sink.String())
	}
	testkit.Eventually(t, "one connection left", func() bool { return l.srv.C.ConnsActive.Load() == 1 })
}

// TestPipelinedLargeRepliesServed: a client that reads gets every reply
// of a pipeline whose replies are far larger than the output limit (its
// later requests wait for the earlier replies instead).
func TestPipelinedLargeRepliesServed(t *testing.T) {
	for _, mode := range []string{"loop", "goroutine"} {
		t.Run(mode, func(t *testing.T) { testPipelinedLarge(t, mode == "goroutine") })
	}
}

func testPipelinedLarge(t *testing.T, plain bool) {
	l := startListenerMode(t, Options{MaxOutputBytes: 4 << 20}, nil, plain)
	c := dialRaw(t, l.addr)
	val := strings.Repeat("y", 1<<20)
	c.do(encode("SET", "v", val))
	const n = 64
	if _, err := c.c.Write(bytes.Repeat(encode("GET", "v"), n)); err != nil {
		t.Fatal(err)
	}
	want := "$1048576\r\n" + val + "\r\n"
	for i := range n {
		if got := c.read(); string(got) != want {
			t.Fatalf("reply %d: %d bytes", i, len(got))
		}
	}
	if l.srv.C.OutputLimit.Load() != 0 {
		t.Fatal("a reading client was disconnected")
	}
}

// TestMGetOverOutputLimit: one command whose reply passes MaxOutputBytes
// (an MGET of many large values) closes the connection, its replies
// dropped, as Redis at its client-output-buffer-limit; one value alone
// never does.
func TestMGetOverOutputLimit(t *testing.T) {
	var sink testkit.LogSink
	l := startListener(t, Options{MaxOutputBytes: 3 << 20, Log: zerolog.New(&sink)}, nil)
	c := dialRaw(t, l.addr)
	c.do(encode("SET", "v", strings.Repeat("z", 1<<20)))
	c.do(encode("SET", "huge", strings.Repeat("h", 5<<20))) // inline: over the 2 MiB slot
	if got := c.do(encode("MGET", "v", "v", "v")); len(got) != 4+3*(10+1<<20+2) {
		t.Fatalf("MGET of 3 MiB: %d bytes", len(got))
	}
	if got := c.do(encode("GET", "huge")); len(got) != 10+5<<20+2 {
		t.Fatalf("GET of a value over the limit: %d bytes", len(got))
	}
	args := []string{"MGET"}
	for range 16 {
		args = append(args, "v")
	}
	if _, err := c.c.Write(encode(args...)); err != nil {
		t.Fatal(err)
	}
	if !c.eof() {
		t.Fatal("MGET of 16 MiB over a 3 MiB limit: connection not closed")
	}
	if got := l.srv.C.OutputLimit.Load(); got != 1 {
		t.Fatalf("output-limit disconnects %d", got)
	}
	if got := dialRaw(t, l.addr).do(encode("PING")); string(got) != "+PONG\r\n" {
		t.Fatalf("PING after: %q", got)
	}
	if n := len(sink.Find(t, outputLogMsg)); n != 1 {
		t.Fatalf("%d disconnect log lines, want 1", n)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(l.srv.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() == "infera_kvd_resp_output_disconnects_total" {
			for _, m := range f.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if got["limit"] != 1 || got["stalled"] != 0 || len(got) != 2 {
		t.Fatalf("infera_kvd_resp_output_disconnects_total: %v", got)
	}
}

// TestAuthFloodNotReadingIsHeld: a client that pipelines password
// guesses without reading the answers gets only about the output hold's
// worth of them tried (plus what the socket buffers take) before its
// input waits, and is then disconnected: a flood of 200,000 guesses in
// one write is not 200,000 tries.
func TestAuthFloodNotReadingIsHeld(t *testing.T) {
	l := startListener(t, Options{Password: "secret", OutputTimeout: time.Second}, nil)
	c, err := net.Dial("tcp", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
	const guesses = 200_000
	go func() { _, _ = c.Write(bytes.Repeat(encode("AUTH", "guess"), guesses)) }() // blocks once kvd stops reading
	testkit.Eventually(t, "the flooding client disconnected", func() bool { return l.srv.C.OutputStalled.Load() == 1 })
	tried := l.srv.C.Commands.Load()
	t.Logf("%d of %d guesses tried", tried, guesses)
	if tried >= guesses/2 {
		t.Fatalf("%d of %d guesses tried by a client that does not read", tried, guesses)
	}
}
