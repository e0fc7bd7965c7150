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
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				chunk := make([]byte, 16<<10)
				for {
					if _, err := c.Write(chunk); err != nil {
						_ = c.Close()
						return
					}
				}
			}()
		}
	}()
	tb.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
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
	b.Run("burst", func(b *testing.B) {
		var set Set
		defer set.CloseAll()
		c := dial(b, burstServer(b), &set)
		buf := make([]byte, 256)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("watched", func(b *testing.B) {
		var set Set
		defer set.CloseAll()
		c := dial(b, burstServer(b), &set)
		c.Watch(&WatchSlot{Watcher: steadyWatcher{}})
		buf := make([]byte, 256)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
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
