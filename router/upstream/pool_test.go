package upstream

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/internal/testkit"
)

// waiting is how many exchanges wait for a free connection of p.
func (p *Pool) waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiters)
}

// holdStream starts a stream on a fresh exchange of p, holding its
// connection until the returned exchange's Release.
func holdStream(t *testing.T, p *Pool, addr string) (*Exchange, *fasthttp.Response) {
	t.Helper()
	x := new(Exchange)
	resp, err := exchangeOnce(t, x, p, addr, "/stream", true)
	if err != nil {
		t.Fatal(err)
	}
	return x, resp
}

// waitAtCap starts a unary exchange on p, at its cap, and returns once it
// waits for a free connection; its error comes on the channel.
func waitAtCap(t *testing.T, p *Pool, addr string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		var y Exchange
		r, err := exchangeOnce(t, &y, p, addr, "/whole", false)
		if err == nil {
			fasthttp.ReleaseResponse(r)
		}
		done <- err
	}()
	testkit.Eventually(t, "the second exchange to wait at the cap", func() bool { return p.waiting() == 1 })
	return done
}

// TestPoolWaitsForFreeConnection: at the cap (one connection) an
// exchange waits for the connection in use, and takes it once the stream
// holding it is read to its end: no second connection is dialed.
func TestPoolWaitsForFreeConnection(t *testing.T) {
	s := startStreamServer(t)
	var set Set
	p := exchangeClient(&set, s.addr, func(c *PoolConfig) { c.MaxConns, c.MaxConnWait = 1, 5*time.Second })
	defer p.Close()
	x, resp := holdStream(t, p, s.addr)
	done := waitAtCap(t, p, s.addr)
	if n := p.Open(); n != 1 {
		t.Fatalf("%d connections open at a cap of 1", n)
	}
	readStreamToEnd(t, x, resp, "data: a\n\ndata: b\n\ndata: c\n\n")
	if err := <-done; err != nil {
		t.Fatalf("waiting exchange: %v", err)
	}
	if n := s.accepted.Load(); n != 1 {
		t.Fatalf("server accepted %d connections, want 1 (handed to the waiter)", n)
	}
	if n := p.Idle(); n != 1 {
		t.Fatalf("%d idle connections after both exchanges, want 1", n)
	}
}

// TestPoolClosedConnectionFreesSlot: a connection closed at the cap (a
// stream released before its end) gives its slot to the exchange waiting,
// which dials its own.
func TestPoolClosedConnectionFreesSlot(t *testing.T) {
	s := startStreamServer(t)
	var set Set
	p := exchangeClient(&set, s.addr, func(c *PoolConfig) { c.MaxConns, c.MaxConnWait = 1, 5*time.Second })
	defer p.Close()
	x, resp := holdStream(t, p, s.addr)
	done := waitAtCap(t, p, s.addr)
	x.Release() // unfinished: closed
	fasthttp.ReleaseResponse(resp)
	if err := <-done; err != nil {
		t.Fatalf("waiting exchange: %v", err)
	}
	if n := s.accepted.Load(); n != 2 {
		t.Fatalf("server accepted %d connections, want 2 (the cut one, the waiter's)", n)
	}
	if n, idle := p.Open(), p.Idle(); n != 1 || idle != 1 {
		t.Fatalf("%d open, %d idle connections, want 1 and 1", n, idle)
	}
}

// TestPoolWaitTimeouts: at the cap an exchange fails with
// fasthttp.ErrNoFreeConns once MaxConnWait passes, with fasthttp.ErrTimeout
// when its own deadline comes first, and at once without MaxConnWait; the
// exchanges given up wait no longer.
func TestPoolWaitTimeouts(t *testing.T) {
	s := startStreamServer(t)
	for _, tc := range []struct {
		name     string
		wait     time.Duration // MaxConnWait
		deadline time.Duration // the exchange's
		want     error
	}{
		{"pool wait", 20 * time.Millisecond, 5 * time.Second, fasthttp.ErrNoFreeConns},
		{"deadline", 5 * time.Second, 20 * time.Millisecond, fasthttp.ErrTimeout},
		{"no wait", 0, 5 * time.Second, fasthttp.ErrNoFreeConns},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var set Set
			p := exchangeClient(&set, s.addr, func(c *PoolConfig) { c.MaxConns, c.MaxConnWait = 1, tc.wait })
			defer p.Close()
			x, resp := holdStream(t, p, s.addr)
			req := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(req)
			req.SetRequestURI("http://" + s.addr + "/whole")
			r := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseResponse(r)
			var y Exchange
			y.Begin()
			if err := y.Do(p, req, r, time.Now().Add(tc.deadline), nil); !errors.Is(err, tc.want) {
				t.Fatalf("exchange at the cap: %v, want %v", err, tc.want)
			}
			if n := p.waiting(); n != 0 {
				t.Fatalf("%d exchanges still wait after giving up", n)
			}
			readStreamToEnd(t, x, resp, "data: a\n\ndata: b\n\ndata: c\n\n")
			if n := p.Idle(); n != 1 {
				t.Fatalf("%d idle connections, want 1", n)
			}
		})
	}
}

// TestPoolIdleExpiry: an idle connection outlives two sweeper ticks (it may
// have gone idle just before the first) and is closed on the third, once
// idle at least IdleTimeout; one reused meanwhile starts again.
func TestPoolIdleExpiry(t *testing.T) {
	s := startStreamServer(t)
	var set Set
	// The sweeper's own ticks never come during the test: expire is called
	// by hand.
	p := exchangeClient(&set, s.addr, func(c *PoolConfig) { c.IdleTimeout = time.Hour })
	defer p.Close()
	var x Exchange
	one := func() {
		resp, err := exchangeOnce(t, &x, p, s.addr, "/whole", false)
		if err != nil {
			t.Fatal(err)
		}
		fasthttp.ReleaseResponse(resp)
	}
	one()
	p.expire()
	p.expire()
	one() // reused: idle from now
	p.expire()
	p.expire()
	if n := p.Idle(); n != 1 || set.Len() != 1 {
		t.Fatalf("%d idle, %d open connections after two ticks, want 1 and 1", n, set.Len())
	}
	p.expire()
	if n, open := p.Idle(), p.Open(); n != 0 || open != 0 || set.Len() != 0 {
		t.Fatalf("%d idle, %d open (%d tracked) after three ticks, want none", n, open, set.Len())
	}
	if n := s.accepted.Load(); n != 1 {
		t.Fatalf("server accepted %d connections, want 1", n)
	}
}

// TestPoolSweeperClosesIdle: the pool's own sweeper closes a connection
// idle past IdleTimeout.
func TestPoolSweeperClosesIdle(t *testing.T) {
	s := startStreamServer(t)
	var set Set
	p := exchangeClient(&set, s.addr, func(c *PoolConfig) { c.IdleTimeout = 10 * time.Millisecond })
	defer p.Close()
	var x Exchange
	resp, err := exchangeOnce(t, &x, p, s.addr, "/whole", false)
	if err != nil {
		t.Fatal(err)
	}
	fasthttp.ReleaseResponse(resp)
	testkit.Eventually(t, "the sweeper to close the idle connection", func() bool { return set.Len() == 0 })
	if n := p.Open(); n != 0 {
		t.Fatalf("%d connections counted open after the sweep", n)
	}
}

// TestPoolClose: Close closes the idle connections and stops the sweeper
// (goleak, TestMain); a connection given back afterwards is closed, not
// kept.
func TestPoolClose(t *testing.T) {
	s := startStreamServer(t)
	var set Set
	p := exchangeClient(&set, s.addr)
	y, sresp := holdStream(t, p, s.addr)
	var x Exchange
	resp, err := exchangeOnce(t, &x, p, s.addr, "/whole", false)
	if err != nil {
		t.Fatal(err)
	}
	fasthttp.ReleaseResponse(resp)
	if n := set.Len(); n != 2 {
		t.Fatalf("%d connections open, want 2", n)
	}
	p.Close()
	if n := set.Len(); n != 1 {
		t.Fatalf("%d connections open after Close, want 1 (the stream's)", n)
	}
	readStreamToEnd(t, y, sresp, "data: a\n\ndata: b\n\ndata: c\n\n")
	if n, open := set.Len(), p.Open(); n != 0 || open != 0 {
		t.Fatalf("%d connections open (%d counted) after the stream's end, want none", n, open)
	}
	p.Close() // idempotent
}

// TestPoolDialError: a dial's error is the exchange's, as it is, and frees
// its slot.
func TestPoolDialError(t *testing.T) {
	errRefused := errors.New("refused")
	p := NewPool(PoolConfig{Addr: "127.0.0.1:1", MaxConns: 1, Dial: func(string) (net.Conn, error) { return nil, errRefused }})
	defer p.Close()
	var x Exchange
	for range 2 {
		if _, err := exchangeOnce(t, &x, p, "127.0.0.1:1", "/whole", false); !errors.Is(err, errRefused) {
			t.Fatalf("exchange on a failing dial: %v, want its error", err)
		}
	}
	if n := p.Open(); n != 0 {
		t.Fatalf("%d connections counted open after failed dials", n)
	}
}

// TestPoolConnectionClose: a request sent with Connection: close, and an
// aborted exchange, leave their connection closed, not pooled.
func TestPoolConnectionClose(t *testing.T) {
	s := startStreamServer(t)
	var set Set
	p := exchangeClient(&set, s.addr)
	defer p.Close()
	var x Exchange
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI("http://" + s.addr + "/whole")
	req.SetConnectionClose()
	resp, err := exchangeRequest(&x, p, req, false)
	if err != nil {
		t.Fatal(err)
	}
	fasthttp.ReleaseResponse(resp)
	if n, open := p.Idle(), p.Open(); n != 0 || open != 0 || set.Len() != 0 {
		t.Fatalf("%d idle, %d open (%d tracked) after Connection: close, want none", n, open, set.Len())
	}
	// Aborted while the answer is awaited.
	done := make(chan error, 1)
	go func() {
		_, err := exchangeOnce(t, &x, p, s.addr, "/slow", false)
		done <- err
	}()
	testkit.Eventually(t, "the slow exchange to hold a connection", func() bool {
		x.mu.Lock()
		defer x.mu.Unlock()
		return x.conn != nil
	})
	x.Abort()
	if err := <-done; !errors.Is(err, ErrAborted) {
		t.Fatalf("aborted exchange: %v, want ErrAborted", err)
	}
	if n, open := p.Idle(), p.Open(); n != 0 || open != 0 {
		t.Fatalf("%d idle, %d open after an abort, want none", n, open)
	}
}

// TestPoolTLS: a TLS pool talks TLS to its worker (verified against
// TLSConfig's roots, for the host of Addr), through pooled buffers, and
// reuses the connection.
func TestPoolTLS(t *testing.T) {
	ca := testkit.NewCA(t)
	server := ca.Issue(t, "worker", x509.ExtKeyUsageServerAuth)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	tln := tls.NewListener(countingLn{ln, &accepted}, &tls.Config{
		Certificates: []tls.Certificate{server.TLS()},
		MinVersion:   tls.VersionTLS12,
	})
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("whole") }, Logger: quietLogger{}}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(tln) }()
	defer func() { _ = srv.Shutdown(); <-served }()
	addr := ln.Addr().String()
	var set Set
	p := exchangeClient(&set, addr, func(c *PoolConfig) {
		c.TLS, c.TLSConfig = true, &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	})
	defer p.Close()
	var x Exchange
	for range 2 {
		resp, err := exchangeOnce(t, &x, p, addr, "/whole", false)
		if err != nil {
			t.Fatal(err)
		}
		if b := string(resp.Body()); b != "whole" {
			t.Fatalf("answer over TLS %q", b)
		}
		fasthttp.ReleaseResponse(resp)
	}
	if n := accepted.Load(); n != 1 {
		t.Fatalf("TLS worker accepted %d connections, want 1 (pooled)", n)
	}
	// Without the roots the worker's certificate is refused.
	q := exchangeClient(&set, addr, func(c *PoolConfig) { c.TLS = true })
	defer q.Close()
	if _, err := exchangeOnce(t, &x, q, addr, "/whole", false); err == nil {
		t.Fatal("a TLS pool accepted a certificate of unknown authority")
	}
}

// quietLogger drops a server's logs (the refused handshake's).
type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}
