package upstream

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/internal/epoll"
	"github.com/valyala/fasthttp"
)

// streamServer is an HTTP server whose /stream answers with a chunked body
// of three parts and whose /slow answers after release is closed; it
// counts the connections it accepted and keeps the last request line's
// target and Host header as they arrived.
type streamServer struct {
	addr     string
	accepted atomic.Int64
	release  chan struct{}
	target   atomic.Pointer[string]
	host     atomic.Pointer[string]
}

type countingLn struct {
	net.Listener
	n *atomic.Int64
}

func (l countingLn) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func startStreamServer(t *testing.T) *streamServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &streamServer{addr: ln.Addr().String(), release: make(chan struct{})}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		target, host := string(ctx.Request.Header.RequestURI()), string(ctx.Request.Header.Host())
		s.target.Store(&target)
		s.host.Store(&host)
		switch string(ctx.Path()) {
		case "/stream":
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				for i := range 3 {
					_, _ = w.WriteString("data: " + string(rune('a'+i)) + "\n\n")
					_ = w.Flush()
				}
			})
		case "/sized":
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyString("data: sized\n\n")
		case "/slow":
			<-s.release
			ctx.SetBodyString("late")
		default:
			ctx.SetBodyString("whole")
		}
	}}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(countingLn{ln, &s.accepted}) }()
	t.Cleanup(func() {
		select {
		case <-s.release:
		default:
			close(s.release)
		}
		_ = srv.Shutdown()
		<-done
	})
	return s
}

// exchangeClient returns a pool of up to 4 connections to addr that Dial
// makes (tracked in set), its configuration first edited by edit (close
// it with Close).
func exchangeClient(set *Set, addr string, edit ...func(*PoolConfig)) *Pool {
	cfg := PoolConfig{
		Addr:                addr,
		MaxConns:            4,
		MaxResponseBodySize: 1 << 20,
		Dial: func(addr string) (net.Conn, error) {
			return Dial(set, addr, time.Second, 5*time.Second, nil)
		},
	}
	for _, e := range edit {
		e(&cfg)
	}
	return NewPool(cfg)
}

func exchangeOnce(t *testing.T, x *Exchange, hc *Pool, addr, path string, stream bool) (*fasthttp.Response, error) {
	t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI("http://" + addr + path)
	return exchangeRequest(x, hc, req, stream)
}

// exchangeRequest sends req (a POST of {}) on x and returns its answer
// (release it with fasthttp.ReleaseResponse).
func exchangeRequest(x *Exchange, hc *Pool, req *fasthttp.Request, stream bool) (*fasthttp.Response, error) {
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetBodyString("{}")
	resp := fasthttp.AcquireResponse()
	resp.StreamBody = stream
	x.Begin()
	if err := x.Do(hc, req, resp, time.Now().Add(5*time.Second), nil); err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, err
	}
	return resp, nil
}

// readStreamToEnd reads x's stream to its end, fails t unless it is want,
// and ends the exchange and its answer.
func readStreamToEnd(t *testing.T, x *Exchange, resp *fasthttp.Response, want string) {
	t.Helper()
	b, err := io.ReadAll(x)
	if err != nil || string(b) != want {
		t.Fatalf("stream body %q, %v; want %q", b, err, want)
	}
	x.Release()
	fasthttp.ReleaseResponse(resp)
}

// TestExchangeStreamReadToEndReusesConnection: streams read to their end
// and whole answers share one pooled connection, every stream read through
// the connection's own reader (Conn.buffers), not a pooled one; a stream
// left unread is closed, not pooled.
func TestExchangeStreamReadToEndReusesConnection(t *testing.T) {
	s := startStreamServer(t)
	var set Set
	hc := exchangeClient(&set, s.addr)
	var x Exchange
	var first *bufio.Reader
	for i := range 3 {
		resp, err := exchangeOnce(t, &x, hc, s.addr, "/stream", true)
		if err != nil {
			t.Fatal(err)
		}
		c := x.Conn()
		if c == nil {
			t.Fatal("a streamed exchange does not expose its connection")
		}
		if c.br == nil || x.br != c.br || x.pooledReader {
			t.Fatalf("stream %d reads through %p, want its connection's own reader", i, x.br)
		}
		if first == nil {
			first = x.br
		} else if x.br != first {
			t.Fatalf("stream %d on the same connection got a new reader", i)
		}
		if resp.BodyStream() != &x.chunked {
			t.Fatalf("a chunked stream reads through %T, want the exchange's chunkedBody", resp.BodyStream())
		}
		readStreamToEnd(t, &x, resp, "data: a\n\ndata: b\n\ndata: c\n\n")
		resp, err = exchangeOnce(t, &x, hc, s.addr, "/whole", false)
		if err != nil || string(resp.Body()) != "whole" {
			t.Fatalf("whole answer %v", err)
		}
		fasthttp.ReleaseResponse(resp)
	}
	if n := s.accepted.Load(); n != 1 {
		t.Fatalf("server accepted %d connections for 6 exchanges, want 1 (pooled)", n)
	}
	// A stream released before its end: its connection is closed.
	resp, err := exchangeOnce(t, &x, hc, s.addr, "/stream", true)
	if err != nil {
		t.Fatal(err)
	}
	x.Release()
	fasthttp.ReleaseResponse(resp)
	if n := set.Len(); n != 0 {
		t.Fatalf("%d connections open after an unfinished stream was released, want 0", n)
	}
	hc.Close()
}

// TestExchangeAbort: Abort cuts an exchange waiting for its answer (the
// connection is closed, Do fails with ErrAborted), and refuses the next
// Do until Begin.
func TestExchangeAbort(t *testing.T) {
	s := startStreamServer(t)
	var set Set
	hc := exchangeClient(&set, s.addr)
	var x Exchange
	done := make(chan error, 1)
	go func() {
		_, err := exchangeOnce(t, &x, hc, s.addr, "/slow", false)
		done <- err
	}()
	for set.Len() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // the request is written and awaited
	x.Abort()
	select {
	case err := <-done:
		if !errors.Is(err, ErrAborted) {
			t.Fatalf("aborted exchange: %v, want ErrAborted", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Abort did not cut the exchange")
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI("http://" + s.addr + "/whole")
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := x.Do(hc, req, resp, time.Now().Add(time.Second), nil); !errors.Is(err, ErrAborted) {
		t.Fatalf("Do after Abort without Begin: %v, want ErrAborted", err)
	}
	close(s.release)
	hc.Close()
}

// TestExchangeOriginFormGoesAsBuilt: a request given its Host header and
// an origin-form target goes out with both as they are (the relay's, built
// once per worker), while one given a full URI is still parsed as
// hc.DoDeadline would (here: its path normalized).
func TestExchangeOriginFormGoesAsBuilt(t *testing.T) {
	s := startStreamServer(t)
	var set Set
	hc := exchangeClient(&set, s.addr)
	defer hc.Close()
	var x Exchange
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetHost("Upstream.Example")
	req.Header.SetRequestURI("/v1/../whole")
	resp, err := exchangeRequest(&x, hc, req, false)
	if err != nil {
		t.Fatal(err)
	}
	fasthttp.ReleaseResponse(resp)
	if target, host := *s.target.Load(), *s.host.Load(); target != "/v1/../whole" || host != "Upstream.Example" {
		t.Fatalf("origin form went out as %q, Host %q; want it as built", target, host)
	}
	resp, err = exchangeOnce(t, &x, hc, s.addr, "/v1/../whole", false)
	if err != nil {
		t.Fatal(err)
	}
	fasthttp.ReleaseResponse(resp)
	if target, host := *s.target.Load(), *s.host.Load(); target != "/whole" || host != s.addr {
		t.Fatalf("full URI went out as %q, Host %q; want /whole, %s", target, host, s.addr)
	}
}

// TestExchangeSizedStreamReadsThroughFasthttp: a streamed answer with a
// Content-Length is read by fasthttp's body stream, not the chunked
// decoder, and read to its end gives its connection back.
func TestExchangeSizedStreamReadsThroughFasthttp(t *testing.T) {
	s := startStreamServer(t)
	var set Set
	hc := exchangeClient(&set, s.addr)
	defer hc.Close()
	var x Exchange
	for range 2 {
		resp, err := exchangeOnce(t, &x, hc, s.addr, "/sized", true)
		if err != nil {
			t.Fatal(err)
		}
		if resp.BodyStream() == nil || resp.BodyStream() == &x.chunked {
			t.Fatalf("a sized stream reads through %T, want fasthttp's body stream", resp.BodyStream())
		}
		readStreamToEnd(t, &x, resp, "data: sized\n\n")
	}
	if n := s.accepted.Load(); n != 1 {
		t.Fatalf("server accepted %d connections for 2 sized streams, want 1 (pooled)", n)
	}
}

// TestExchangeStreamCutMidChunk: a worker that closes its connection
// inside a chunk's data gives the data that came, then
// io.ErrUnexpectedEOF; the exchange closes the connection on Release.
func TestExchangeStreamCutMidChunk(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		_, _ = c.Read(buf) // the request
		_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\nb\r\ndata"))
	}()
	defer func() { _ = ln.Close(); <-served }()
	var set Set
	hc := exchangeClient(&set, ln.Addr().String())
	defer hc.Close()
	var x Exchange
	resp, err := exchangeOnce(t, &x, hc, ln.Addr().String(), "/stream", true)
	if err != nil {
		t.Fatal(err)
	}
	defer fasthttp.ReleaseResponse(resp)
	b, err := io.ReadAll(&x)
	if string(b) != "data: a\n\ndata" || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("cut stream: %q, %v; want the data that came and io.ErrUnexpectedEOF", b, err)
	}
	x.Release()
	if n := set.Len(); n != 0 {
		t.Fatalf("%d connections open after a cut stream was released, want 0", n)
	}
}

// TestExchangeOtherDialTakesPooledBuffers: an exchange on a connection
// that is not Dial's (a plain dial) reads through a reader
// taken from the Pool's, as fasthttp would; one on a Dial'd
// connection reads through the connection's own
// (TestExchangeStreamReadToEndReusesConnection).
func TestExchangeOtherDialTakesPooledBuffers(t *testing.T) {
	s := startStreamServer(t)
	var set Set
	plain := exchangeClient(&set, s.addr, func(c *PoolConfig) {
		c.Dial = func(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) }
	})
	defer plain.Close()
	var x Exchange
	resp, err := exchangeOnce(t, &x, plain, s.addr, "/stream", true)
	if err != nil {
		t.Fatal(err)
	}
	if x.Conn() != nil || !x.pooledReader || x.br == nil {
		t.Fatal("an exchange on a connection not Dial's does not read through a pooled reader")
	}
	readStreamToEnd(t, &x, resp, "data: a\n\ndata: b\n\ndata: c\n\n")
}

// A unary exchange on a pooled connection Dial made allocates nothing:
// the connection's lease, its own reader and writer, the request written
// and the answer read. The worker is a plain socket that answers every
// request ending in "{}" (a fasthttp server in the process would count
// its own allocations).
func TestExchangeUnaryAllocs(t *testing.T) {
	var accepted atomic.Int64
	addr := answerServer(t, &accepted)
	var set Set
	hc := exchangeClient(&set, addr)
	defer hc.Close()
	run, done := unaryExchange(hc, addr)
	defer done()
	exchange := func() {
		if err := run(); err != nil {
			t.Fatal(err)
		}
	}
	exchange()
	if n := testing.AllocsPerRun(200, exchange); n != 0 {
		t.Fatalf("unary exchange: %v allocations", n)
	}
	if n := accepted.Load(); n != 1 {
		t.Fatalf("worker accepted %d connections, want 1 (pooled)", n)
	}
}

// appendedRequest is a RequestWriter that appends itself (a POST of {}
// to /whole) where its connection holds its writes, and counts how it
// went out.
type appendedRequest struct {
	max             int // MaxRequestLen
	appends, writes int
}

const appendedRequestBytes = "POST /whole HTTP/1.1\r\nHost: upstream\r\nContent-Length: 2\r\n\r\n{}"

func (r *appendedRequest) MaxRequestLen() int { return r.max }

func (r *appendedRequest) AppendRequest(b []byte) []byte {
	r.appends++
	return append(b, appendedRequestBytes...)
}

func (r *appendedRequest) WriteRequest(bw *bufio.Writer) error {
	r.writes++
	_, err := bw.WriteString(appendedRequestBytes)
	return err
}

// TestExchangeAppendedRequestHeld: a request that appends itself is
// framed where a Dial connection holds its writes (Conn.holdRequest), not
// written into the connection's writer and copied again; one that would
// not be held (over epoll.MaxHeld), or on a connection that holds nothing
// (not Dial's), is written as before. Every one gets its answer.
func TestExchangeAppendedRequestHeld(t *testing.T) {
	var accepted atomic.Int64
	addr := answerServer(t, &accepted)
	var set Set
	held := exchangeClient(&set, addr)
	defer held.Close()
	plain := exchangeClient(&set, addr, func(c *PoolConfig) {
		c.Dial = func(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) }
	})
	defer plain.Close()
	for _, tc := range []struct {
		name            string
		pool            *Pool
		max             int
		appends, writes int
	}{
		{"held", held, len(appendedRequestBytes), 1, 0},
		{"over MaxHeld", held, epoll.MaxHeld + 1, 0, 1},
		{"only writes itself", held, 0, 0, 1},
		{"not Dial's", plain, len(appendedRequestBytes), 0, 1},
	} {
		req := &appendedRequest{max: tc.max}
		resp := fasthttp.AcquireResponse()
		var x Exchange
		x.Begin()
		err := x.DoWriter(tc.pool, req, resp, time.Now().Add(5*time.Second), nil)
		if err != nil || string(resp.Body()) != "whole" {
			t.Errorf("%s: answer %q, %v; want whole", tc.name, resp.Body(), err)
		}
		fasthttp.ReleaseResponse(resp)
		if req.appends != tc.appends || req.writes != tc.writes {
			t.Errorf("%s: appended %d times, written %d; want %d, %d", tc.name, req.appends, req.writes, tc.appends, tc.writes)
		}
	}
}
