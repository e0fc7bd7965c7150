package resp

import (
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd"
)

// TestLargeReplyBackpressure: replies larger than the socket takes at
// once are kept and written as the client reads (EPOLLOUT), in order, and
// the connection is read again afterwards.
func TestLargeReplyBackpressure(t *testing.T) {
	l := startListener(t, Options{}, nil)
	c := dialRaw(t, l.addr)
	big := bytes.Repeat([]byte("0123456789abcdef"), 512<<10) // 8 MiB: inline, larger than the slot
	if got := c.do(encode("SET", "big", string(big))); string(got) != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	var req []byte
	for range 4 {
		req = append(req, encode("GET", "big")...)
	}
	req = append(req, encode("PING")...)
	if _, err := c.c.Write(req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the server fills the socket and waits
	want := appendBulk(nil, big)
	for i := range 4 {
		if got := c.read(); !bytes.Equal(got, want) {
			t.Fatalf("GET %d: %d bytes, want %d", i, len(got), len(want))
		}
	}
	if got := c.read(); string(got) != "+PONG\r\n" {
		t.Fatalf("PING after the large replies: %q", got)
	}
	if got := c.do(encode("GET", "nope")); string(got) != "$-1\r\n" {
		t.Fatalf("GET after: %q", got)
	}
}

// TestQuitFlushesAndCloses: QUIT's reply follows the replies before it,
// and nothing after it is answered.
func TestQuitFlushesAndCloses(t *testing.T) {
	l := startListener(t, Options{}, nil)
	c := dialRaw(t, l.addr)
	req := append(append(append(encode("SET", "a", "b"), encode("GET", "a")...), encode("QUIT")...), encode("PING")...)
	if _, err := c.c.Write(req); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"+OK\r\n", "$1\r\nb\r\n", "+OK\r\n"} {
		if got := c.read(); string(got) != want {
			t.Fatalf("reply %q, want %q", got, want)
		}
	}
	if !c.eof() {
		t.Fatal("connection open after QUIT")
	}
	waitConns(t, l.srv, 0)
}

func waitConns(t *testing.T, s *Server, n int64) {
	t.Helper()
	testkit.Eventually(t, strconv.FormatInt(n, 10)+" connections active", func() bool { return s.C.ConnsActive.Load() == n })
}

// TestConcurrentClients: many clients on the loops at once, each reading
// back its own values, several loops or one.
func TestConcurrentClients(t *testing.T) {
	for _, loops := range []int{1, 3} {
		// 4 KiB slots: every client's keys fit (no eviction between SET and GET).
		l := startListener(t, Options{Loops: loops}, func(o *kvd.StoreOptions) { o.SlotBytes = 4096 })
		var wg sync.WaitGroup
		for i := range 16 {
			c := dialRaw(t, l.addr)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 200 {
					k := "k" + strconv.Itoa(i) + ":" + strconv.Itoa(j%7)
					v := k + "=" + strconv.Itoa(j)
					if _, err := c.c.Write(append(encode("SET", k, v), encode("GET", k)...)); err != nil {
						t.Error(err)
						return
					}
					if got := c.read(); string(got) != "+OK\r\n" {
						t.Errorf("SET %s: %q", k, got)
						return
					}
					if got := c.read(); string(got) != string(appendBulkString(nil, v)) {
						t.Errorf("GET %s: %q, want %q", k, got, v)
						return
					}
				}
			}()
		}
		wg.Wait()
		if n := l.srv.C.ConnsActive.Load(); n != 16 {
			t.Errorf("loops %d: %d connections active, want 16", loops, n)
		}
	}
}

// plainListener hands out connections that are not syscall.Conns, which
// the event loops cannot take: they are served from a goroutine each.
type plainListener struct{ net.Listener }

type plainConn struct{ net.Conn }

func (p plainListener) Accept() (net.Conn, error) {
	c, err := p.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return plainConn{c}, nil
}

// TestGoroutineFallback: a connection that is not a socket is served the
// same, and closed at shutdown.
func TestGoroutineFallback(t *testing.T) {
	st, err := kvd.NewStore(kvd.StoreOptions{MaxBytes: 64 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := NewServer(st, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, plainListener{ln}) }()
	c := dialRaw(t, ln.Addr().String())
	if got := c.do(append(encode("SET", "k", "v"), encode("GET", "k")...)); string(got) != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	if got := c.read(); string(got) != "$1\r\nv\r\n" {
		t.Fatalf("GET: %q", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := c.r.ReadByte(); err != io.EOF {
		t.Fatalf("after shutdown: %v, want EOF", err)
	}
}

// TestShutdownClosesLoopConns: Serve's return closes the connections the
// loops hold.
func TestShutdownClosesLoopConns(t *testing.T) {
	st, err := kvd.NewStore(kvd.StoreOptions{MaxBytes: 64 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := NewServer(st, Options{Log: zerolog.Nop(), Loops: 2})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	var cs []*rconn
	for range 3 {
		c := dialRaw(t, ln.Addr().String())
		if got := c.do(encode("PING")); string(got) != "+PONG\r\n" {
			t.Fatalf("PING: %q", got)
		}
		cs = append(cs, c)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if !c.eof() {
			t.Fatal("connection open after shutdown")
		}
	}
	if n := srv.C.ConnsActive.Load(); n != 0 {
		t.Fatalf("%d connections active after shutdown", n)
	}
}
