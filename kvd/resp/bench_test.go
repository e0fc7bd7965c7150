package resp

import (
	"bytes"
	"io"
	"strconv"
	"testing"
)

// roundTrip is one client request over a real socket to the listener and
// its whole reply, read into a reused buffer: the client allocates
// nothing, so allocations counted around it are the server's.
type roundTrip struct {
	c     *rconn
	req   []byte
	reply []byte
	want  []byte
}

func newRoundTrip(t testing.TB, l *listener, req, want []byte) *roundTrip {
	t.Helper()
	rt := &roundTrip{c: dialRaw(t, l.addr), req: req, reply: make([]byte, len(want)), want: want}
	rt.do(t)
	if !bytes.Equal(rt.reply, want) {
		t.Fatalf("reply %q, want %q", rt.reply[:min(len(rt.reply), 64)], want[:min(len(want), 64)])
	}
	return rt
}

func (rt *roundTrip) do(t testing.TB) {
	if _, err := rt.c.c.Write(rt.req); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(rt.c.c, rt.reply); err != nil {
		t.Fatal(err)
	}
}

// hotPath is the GET/SET/MSET round trips of redis-benchmark -d size (it
// sets and gets one key, "key:__rand_int__", and MSET sets it ten times).
func hotPath(t testing.TB, l *listener, size int) map[string]*roundTrip {
	value := string(bytes.Repeat([]byte{'x'}, size))
	key := "key:__rand_int__"
	mset := []string{"MSET"}
	for range 10 {
		mset = append(mset, key, value)
	}
	return map[string]*roundTrip{
		"SET":  newRoundTrip(t, l, encode("SET", key, value), []byte("+OK\r\n")),
		"GET":  newRoundTrip(t, l, encode("GET", key), appendBulkString(nil, value)),
		"MSET": newRoundTrip(t, l, encode(mset...), []byte("+OK\r\n")),
	}
}

// TestSocketRoundTripAlloc: GET, SET (of a key that exists, as
// redis-benchmark's) and MSET of 1 KiB and 64 KiB values allocate nothing
// end to end — parse, store or copy out, and the event loop's read and
// write.
func TestSocketRoundTripAlloc(t *testing.T) {
	l := startListener(t, Options{}, nil)
	for _, size := range []int{1024, 65536} {
		for name, rt := range hotPath(t, l, size) {
			if n := testing.AllocsPerRun(200, func() { rt.do(t) }); n != 0 {
				t.Errorf("%s -d %d: %.2f allocations per request", name, size, n)
			}
			if !bytes.Equal(rt.reply, rt.want) {
				t.Errorf("%s -d %d: reply changed", name, size)
			}
		}
	}
}

// BenchmarkRoundTrip: one client's request/reply latency over a real
// socket (the server's CPU per request dominates it; compare ns/op with
// redis-server's through scripts/resp-bench.sh).
func BenchmarkRoundTrip(b *testing.B) {
	l := startListener(b, Options{}, nil)
	for _, size := range []int{1024, 65536} {
		rts := hotPath(b, l, size)
		for _, name := range []string{"SET", "GET", "MSET"} {
			rt := rts[name]
			b.Run(name+"-d"+strconv.Itoa(size), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(size))
				for b.Loop() {
					rt.do(b)
				}
			})
		}
	}
}
