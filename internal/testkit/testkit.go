package testkit

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/internal/freeport"
)

// EventuallyTimeout is how long Eventually waits. It is generous: tests
// share a few cores with other work, and what they wait for is an outcome,
// not a timing.
const EventuallyTimeout = 30 * time.Second

// Eventually polls cond every few milliseconds until it holds, and fails
// the test ("timed out waiting for what") after EventuallyTimeout.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(EventuallyTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago and that
// this process has not handed out before (freeport's ledger).
//
// It is drawn at random from below the kernel's ephemeral range, not from
// a listen on port 0: the kernel gives ephemeral ports to every outgoing
// connection on the box, so one picked from that range could be taken by
// any test's client before the server it was picked for binds it (seen in
// CI: etcd's "bind: address already in use"). Below that range only
// another process picking the same way at the same moment can take it.
func FreePort(t testing.TB) int {
	t.Helper()
	lo, hi := freePortRange()
	for i := 0; i < 200 && hi > lo; i++ {
		p := lo + rand.IntN(hi-lo)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		ln.Close()
		if freeport.Claim(p, 1) {
			return p
		}
	}
	// The range is crowded or too small: let the kernel choose.
	p, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// freePortFloor is the lowest port FreePort draws: well-known services'
// ports (etcd, NATS, Redis, Prometheus) lie below it.
const freePortFloor = 20000

// freePortRange is [freePortFloor, the first ephemeral port), from
// /proc/sys/net/ipv4/ip_local_port_range (Linux's default 32768 when
// unreadable).
func freePortRange() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 0 {
				hi = n
			}
		}
	}
	if hi < freePortFloor+1000 {
		return hi, hi // empty: FreePort falls back to the kernel's choice
	}
	return freePortFloor, hi
}

// TCPPair returns both ends of a loopback TCP connection, closed when the
// test ends.
func TCPPair(t testing.TB) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		s.Close()
	})
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// FreeAddr returns FreePort as a "127.0.0.1:port" address.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(FreePort(t))
}

// FreePortPair returns a loopback port p such that p and p+1 were both
// free a moment ago: kvd's --peer-listen serves the arena's bytes on the
// port after it.
func FreePortPair(t testing.TB) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		next, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		ln.Close()
		if err == nil {
			next.Close()
			return p
		}
	}
	t.Fatal("no two adjacent free loopback ports")
	return 0
}

// LogSink is an io.Writer safe for concurrent writers and readers: hand it
// to a logger, read what was written from the test.
type LogSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (s *LogSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

// String returns everything written so far.
func (s *LogSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// Count is how many zerolog JSON lines so far carry the message msg.
func (s *LogSink) Count(msg string) int {
	return strings.Count(s.String(), `"message":"`+msg+`"`)
}

// Entries parses every complete JSON log line written so far, failing the
// test on a line that is not JSON.
func (s *LogSink) Entries(t testing.TB) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(s.String(), "\n") {
		if line == "" {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// Find returns the JSON log entries whose message equals msg.
func (s *LogSink) Find(t testing.TB, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, e := range s.Entries(t) {
		if e["message"] == msg {
			out = append(out, e)
		}
	}
	return out
}
