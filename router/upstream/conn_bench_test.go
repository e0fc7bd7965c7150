package upstream

import (
	"io"
	"net"
	"testing"
	"time"
)

// burstServer accepts connections and writes to each, without pause,
// until the test ends: a connection's reads nearly always find bytes.
func burstServer(tb testing.TB) string {
	return serveEach(tb, func(c net.Conn) {
		chunk := make([]byte, 16<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
}

// steadyWatcher is a stream's watcher in the steady state, with serve's
// defaults: a heartbeat every second, the stream's idle timeout of 30 s.
type steadyWatcher struct{}

func (steadyWatcher) BeforeRead(now time.Time) (time.Time, time.Duration) {
	return now.Add(30 * time.Second), time.Second
}
func (steadyWatcher) Heartbeat() error { return nil }
func (steadyWatcher) NoteReadTimeout() {}

// BenchmarkConnRead is the worker-side read: burst reads 256 bytes at a
// time from a worker that never pauses (a read that finds its bytes at
// once, as a streamed answer's often does), exchange writes a request held
// for its read and reads the echo (a read that waits), both unwatched with
// stall ticks on; watched reads the burst under a watcher.
func BenchmarkConnRead(b *testing.B) {
	dial := func(b *testing.B, addr string, set *Set) *Conn {
		c, err := Dial(set, addr, time.Second, 5*time.Minute, &countProgress{tick: 500 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	for _, watched := range []bool{false, true} {
		name := "burst"
		if watched {
			name = "watched"
		}
		b.Run(name, func(b *testing.B) {
			var set Set
			defer set.CloseAll()
			c := dial(b, burstServer(b), &set)
			if watched {
				c.Watch(&WatchSlot{Watcher: steadyWatcher{}})
			}
			buf := make([]byte, 256)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("exchange", func(b *testing.B) {
		var set Set
		defer set.CloseAll()
		c := dial(b, echoServer(b), &set)
		msg, buf := make([]byte, 64), make([]byte, 64)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			c.HoldWrites()
			if _, err := c.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}
