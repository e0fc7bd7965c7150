package resp

import (
	"bufio"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHugeBulkHeaderCostsWhatArrived: a 500 MB bulk header followed by
// three bytes, on eight connections, grows the heap and the resident set
// by what arrived, not by what the header claims.
func TestHugeBulkHeaderCostsWhatArrived(t *testing.T) {
	l := startListener(t, Options{}, nil)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rss0 := rssBytes(t)
	for range 8 {
		c := dialRaw(t, l.addr)
		if _, err := c.c.Write([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$500000000\r\nabc")); err != nil {
			t.Fatal(err)
		}
	}
	// Each connection is answered in turn: a PING after them all means
	// every header was read.
	if got := dialRaw(t, l.addr).do(encode("PING")); string(got) != "+PONG\r\n" {
		t.Fatalf("PING: %q", got)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapSys) - int64(before.HeapSys); grew > 64<<20 {
		t.Fatalf("heap grew by %d MB for eight 500 MB headers", grew>>20)
	}
	if grew := rssBytes(t) - rss0; grew > 64<<20 {
		t.Fatalf("RSS grew by %d MB for eight 500 MB headers", grew>>20)
	}
}

// rssBytes is this process's resident set (VmRSS).
func rssBytes(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// TestDrippedMultibulk: a request of 100,000 tiny arguments sent 4 KiB
// at a time over a real socket is answered correctly, and another
// client's PING keeps answering meanwhile. That its parse is incremental
// is TestDrippedMultibulkParsedIncrementally; the PING latency is
// BenchmarkPingWhileDripping (a figure, not asserted here).
func TestDrippedMultibulk(t *testing.T) {
	l := startListener(t, Options{}, nil)
	const n = 100_000
	var b strings.Builder
	b.WriteString("*" + strconv.Itoa(n+1) + "\r\n$6\r\nEXISTS\r\n")
	for range n {
		b.WriteString("$1\r\nx\r\n")
	}
	req := b.String()
	slow, err := net.Dial("tcp", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	done := make(chan error, 1)
	go func() {
		for i := 0; i < len(req); i += 4096 {
			if _, err := slow.Write([]byte(req[i:min(i+4096, len(req))])); err != nil {
				done <- err
				return
			}
			time.Sleep(100 * time.Microsecond)
		}
		done <- nil
	}()
	ping := dialRaw(t, l.addr)
	for sent := false; !sent; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			sent = true
		default:
		}
		if got := ping.do(encode("PING")); string(got) != "+PONG\r\n" {
			t.Fatalf("PING: %q", got)
		}
	}
	r := &rconn{t: t, c: slow, r: bufio.NewReader(slow)}
	if got := r.read(); string(got) != ":0\r\n" {
		t.Fatalf("EXISTS of %d args: %q", n, got)
	}
}
