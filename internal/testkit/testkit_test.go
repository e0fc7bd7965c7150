package testkit

import (
	"net"
	"strconv"
	"sync"
	"testing"
)

func TestLogSinkConcurrent(t *testing.T) {
	var s LogSink
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				_, _ = s.Write([]byte(`{"message":"m"}` + "\n"))
			}
		}()
	}
	n := 0
	Eventually(t, "all writes", func() bool { n = s.Count("m"); return n == 200 })
	wg.Wait()
	if s.Count("other") != 0 {
		t.Fatal("counted a message never written")
	}
}

func TestLogSinkEntries(t *testing.T) {
	var s LogSink
	_, _ = s.Write([]byte(`{"message":"a","n":1}` + "\n" + `{"message":"b"}` + "\n"))
	if got := s.Find(t, "a"); len(got) != 1 || got[0]["n"] != 1.0 {
		t.Fatalf("Find(a) = %v", got)
	}
	if n := len(s.Entries(t)); n != 2 {
		t.Fatalf("%d entries, want 2", n)
	}
}

// TestFreePortBelowEphemeral: FreePort's ports lie below the kernel's
// ephemeral range (where outgoing connections cannot take them), are
// bindable, and are not handed out twice by one process.
func TestFreePortBelowEphemeral(t *testing.T) {
	lo, hi := freePortRange()
	if hi <= lo {
		t.Fatalf("no room below the ephemeral range [%d, %d) on this machine", lo, hi)
	}
	seen := map[int]bool{}
	for range 50 {
		p := FreePort(t)
		if p < lo || p >= hi {
			t.Fatalf("FreePort = %d, outside [%d, %d)", p, lo, hi)
		}
		if seen[p] {
			t.Fatalf("FreePort handed out %d twice", p)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("FreePort = %d, not bindable: %v", p, err)
		}
		ln.Close()
	}
}
