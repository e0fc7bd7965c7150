package router_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/router"
)

// ioCounter counts the reads and writes made through the accepted
// connections of a listener: the system calls a request costs the router.
// Without socket its connections show no socket (no SyscallConn), so every
// read and write goes through them and is counted; with socket they show
// it as a TCP connection does, and what the front door does on the socket
// itself (held reads and writes, frontheld.go) passes them by.
type ioCounter struct {
	net.Listener
	socket        bool
	reads, writes atomic.Int64
	// deadlines counts the read and write deadlines set on them.
	deadlines atomic.Int64
}

func (l *ioCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &countedConn{Conn: c, l: l}
	if l.socket {
		return &socketConn{cc}, nil
	}
	return cc, nil
}

type countedConn struct {
	net.Conn
	l *ioCounter
}

func (c *countedConn) Read(p []byte) (int, error) {
	c.l.reads.Add(1)
	return c.Conn.Read(p)
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.l.writes.Add(1)
	return c.Conn.Write(p)
}

func (c *countedConn) SetReadDeadline(t time.Time) error {
	c.l.deadlines.Add(1)
	return c.Conn.SetReadDeadline(t)
}

func (c *countedConn) SetWriteDeadline(t time.Time) error {
	c.l.deadlines.Add(1)
	return c.Conn.SetWriteDeadline(t)
}

func (c *countedConn) SetDeadline(t time.Time) error {
	c.l.deadlines.Add(2)
	return c.Conn.SetDeadline(t)
}

// socketConn is a countedConn that shows its socket.
type socketConn struct{ *countedConn }

func (c *socketConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

// socketCountedClient serves the workers on the goroutine front door with
// its client connections counted as they show their sockets (ioCounter),
// and returns a connection to it (closed when the test ends).
func socketCountedClient(t *testing.T, workers ...discovery.Record) (net.Conn, *ioCounter) {
	t.Helper()
	r := unservedRouter(t, router.RoundRobin{}, workers...)
	rc := &ioCounter{socket: true}
	addr := servetest.Loopback(t, "router", func(ctx context.Context, ln net.Listener) error {
		rc.Listener = ln
		return r.Serve(ctx, rc) // the goroutine front door
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c, rc
}

// startCountedRouter is startRouter on the goroutine front door, with the
// client connections' writes counted.
func startCountedRouter(t *testing.T, workers ...discovery.Record) (string, *ioCounter) {
	t.Helper()
	cfg := router.DefaultConfig()
	cfg.IdleConnTimeout = 50 * time.Millisecond
	r, err := router.New(cfg, router.RoundRobin{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: workers})
	wc := &ioCounter{}
	addr := servetest.Loopback(t, "router", func(ctx context.Context, ln net.Listener) error {
		wc.Listener = ln
		return r.Serve(ctx, wc)
	})
	return addr, wc
}

// dialClient connects a client to addr, with 30 s for all it does there.
func dialClient(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// rawPost sends one request on a new connection and returns the response
// read up to the end of its chunked body (or the connection's end).
func rawPost(t *testing.T, addr, path, body string, headers ...string) string {
	t.Helper()
	c := dialClient(t, addr)
	defer c.Close()
	req := "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	for i := 0; i+1 < len(headers); i += 2 {
		req += headers[i] + ": " + headers[i+1] + "\r\n"
	}
	req += "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 4096)
	for !strings.HasSuffix(string(got), "\r\n0\r\n\r\n") {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("reading the answer: %v (got %q)", err, got)
		}
	}
	return string(got)
}

// oneChunkStream is an engine's whole stream, in one chunk of a chunked
// body.
func oneChunkStream(events string) string {
	return strconv.FormatInt(int64(len(events)), 16) + "\r\n" + events + "\r\n0\r\n\r\n"
}

const shortStream = `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}]}` + "\n\n" +
	`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}]}` + "\n\n" +
	"data: [DONE]\n\n"

// TestStreamInOneWrite: a stream whose end comes with its events (a short
// answer, or an engine ahead of the relay) reaches the client in one
// write: the headers, the events and the closing chunk (issue 36); in the
// chat dialect and translated to Anthropic's.
func TestStreamInOneWrite(t *testing.T) {
	up := rawUpstream(t, func(c net.Conn, _ <-chan struct{}) {
		for range 3 {
			readRequest(c)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+oneChunkStream(shortStream))
		}
	})
	addr, wc := startCountedRouter(t, record(up, "m", discovery.StatusActive))

	before := wc.writes.Load()
	got := rawPost(t, addr, "/v1/chat/completions", `{"model":"m","stream":true}`)
	if n := wc.writes.Load() - before; n != 1 {
		t.Fatalf("chat stream in %d writes, want 1", n)
	}
	head, body, _ := strings.Cut(got, "\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.1 200 OK\r\n") || !strings.Contains(head, "Transfer-Encoding: chunked") ||
		body != oneChunkStream(shortStream) {
		t.Fatalf("chat stream answer %q", got)
	}

	// The client's last request (Connection: close): the same one write
	// before the close.
	before = wc.writes.Load()
	got = rawPost(t, addr, "/v1/chat/completions", `{"model":"m","stream":true}`, "Connection", "close")
	if n := wc.writes.Load() - before; n != 1 || !strings.HasSuffix(got, oneChunkStream(shortStream)) {
		t.Fatalf("Connection: close stream in %d writes: %q", n, got)
	}

	before = wc.writes.Load()
	got = rawPost(t, addr, "/v1/messages", `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hello"}]}`, "anthropic-version", "2023-06-01")
	if n := wc.writes.Load() - before; n != 1 {
		t.Fatalf("anthropic stream in %d writes, want 1", n)
	}
	if !strings.Contains(got, "event: message_start") || !strings.Contains(got, `"text":"hi"`) ||
		!strings.Contains(got, "event: message_stop") {
		t.Fatalf("anthropic stream answer %q", got)
	}
}

// TestStreamHeadersBeforeSlowFirstEvent: while the engine computes its
// first event, the client already has the headers (its stream is on);
// the events then come, and the last with the closing chunk: two writes.
func TestStreamHeadersBeforeSlowFirstEvent(t *testing.T) {
	release := make(chan struct{})
	up := rawUpstream(t, func(c net.Conn, stop <-chan struct{}) {
		readRequest(c)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		select {
		case <-release:
		case <-stop:
			return
		}
		_, _ = io.WriteString(c, oneChunkStream(shortStream))
	})
	addr, wc := startCountedRouter(t, record(up, "m", discovery.StatusActive))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req) // returns with the headers: the engine has sent no event yet
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("headers: %d %v", resp.StatusCode, resp.Header)
	}
	close(release)
	var body strings.Builder
	if _, err := io.Copy(&body, bufio.NewReader(resp.Body)); err != nil {
		t.Fatal(err)
	}
	if body.String() != shortStream {
		t.Fatalf("events %q, want %q", body.String(), shortStream)
	}
	if n := wc.writes.Load(); n != 2 {
		t.Fatalf("stream in %d writes, want 2 (headers; events with the closing chunk)", n)
	}
}

// TestStreamLargeBatchInOneWrite: a batch of events larger than fasthttp's
// 4 KiB response writer (an engine ahead of the relay) reaches the client
// in one write, with the headers for a stream's first batch, not in the
// writer's pieces (two or three writes).
func TestStreamLargeBatchInOneWrite(t *testing.T) {
	ev := func(text, finish string) string {
		return `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` +
			text + `"},"finish_reason":` + finish + `}]}` + "\n\n"
	}
	first := strings.Repeat(ev("tok", "null"), 40) // 5.9 KB
	mid := strings.Repeat(ev("more", "null"), 64)  // 9.5 KB
	last := ev(".", `"stop"`) + "data: [DONE]\n\n"
	chunk := func(s string) string { return strings.TrimSuffix(oneChunkStream(s), "0\r\n\r\n") }
	next := make(chan struct{})
	up := rawUpstream(t, func(c net.Conn, stop <-chan struct{}) {
		readRequest(c)
		for _, part := range []string{
			"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(first),
			chunk(mid),
			oneChunkStream(last),
		} {
			_, _ = io.WriteString(c, part)
			select {
			case <-next:
			case <-stop:
				return
			}
		}
	})
	addr, wc := startCountedRouter(t, record(up, "m", discovery.StatusActive))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i, part := range []string{first, mid} {
		got := make([]byte, len(part))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != part {
			t.Fatalf("batch %d: %v %q", i, err, got)
		}
		if n := wc.writes.Load(); n != int64(i+1) {
			t.Fatalf("batch %d (%d B) in %d writes so far, want %d", i, len(part), n, i+1)
		}
		next <- struct{}{}
	}
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != last {
		t.Fatalf("end: %v %q", err, rest)
	}
	if n := wc.writes.Load(); n != 3 {
		t.Fatalf("stream in %d writes, want 3", n)
	}
}

// unservedRouter is a router over workers that the test serves its own
// way (a front door of its choice, a listener of its own).
func unservedRouter(t *testing.T, policy router.Policy, workers ...discovery.Record) *router.Router {
	t.Helper()
	cfg := router.DefaultConfig()
	cfg.IdleConnTimeout = 50 * time.Millisecond
	r, err := router.New(cfg, policy, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: workers})
	return r
}

// releaseGate is round-robin whose Release waits for open to close: the
// request's bookkeeping after its answer (the attempt's end) held up.
type releaseGate struct {
	router.RoundRobin
	open chan struct{}
}

func (p *releaseGate) Release(t router.Ticket, res router.Result) {
	<-p.open
	p.RoundRobin.Release(t, res)
}

// readAnswer reads one response off br up to the end of its body (chunked
// or by Content-Length), within the deadline already set on its connection.
func readAnswer(t *testing.T, br *bufio.Reader) (head, body string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading an answer's body: %v", err)
	}
	return resp.Status + " " + strings.Join(resp.TransferEncoding, ","), string(b)
}

// TestStreamEndBeforeBookkeeping: a stream's last events and its closing
// chunk reach the client before the request's bookkeeping runs (the
// relay's finish: the attempt's end, metrics, tracing), not after it
// (issue 36): on the loop front door (where the end cannot wait for the
// connection's next read) they are sent at once, also before fasthttp's
// work after the handler; on the goroutine door the end waits for the
// next read, which sends it and then runs the bookkeeping before it waits
// (putOff). And the keep-alive connection goes on as before: more
// streams, a unary answer, requests sent before the last answer came
// (pipelined).
func TestStreamEndBeforeBookkeeping(t *testing.T) {
	t.Run("loop", func(t *testing.T) {
		testStreamEndBeforeBookkeeping(t, func(r *router.Router) func(context.Context, net.Listener) error {
			return func(ctx context.Context, ln net.Listener) error { return r.ServeLoop(ctx, ln, nil) }
		})
	})
	t.Run("goroutine", func(t *testing.T) {
		testStreamEndBeforeBookkeeping(t, func(r *router.Router) func(context.Context, net.Listener) error {
			return r.Serve
		})
	})
}

func testStreamEndBeforeBookkeeping(t *testing.T, serve func(*router.Router) func(context.Context, net.Listener) error) {
	up := rawUpstream(t, func(c net.Conn, _ <-chan struct{}) {
		serveRequests(c, func(stream bool) bool {
			if !stream {
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
				return true
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+oneChunkStream(shortStream))
			return true
		})
	})
	gate := &releaseGate{open: make(chan struct{})}
	var once sync.Once
	openGate := func() { once.Do(func() { close(gate.open) }) }
	r := unservedRouter(t, gate, record(up, "m", discovery.StatusActive))
	addr := servetest.Loopback(t, "router", serve(r))
	t.Cleanup(openGate) // before the router stops (cleanups run last first)

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	post := func(body string) string {
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	stream, unary := post(`{"model":"m","stream":true}`), post(`{"model":"m"}`)
	wantStream := func(head, body string) {
		t.Helper()
		if head != "200 OK chunked" || body != shortStream {
			t.Fatalf("stream answer %q %q", head, body)
		}
	}

	// The whole stream arrives while its attempt's end is held up.
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, stream); err != nil {
		t.Fatal(err)
	}
	wantStream(readAnswer(t, br))
	openGate()

	for _, req := range []string{stream, unary, stream, stream + stream + unary + stream} {
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		for rest := req; rest != ""; {
			head, body := readAnswer(t, br)
			switch {
			case strings.HasPrefix(rest, stream):
				wantStream(head, body)
				rest = rest[len(stream):]
			default:
				if head != "200 OK " || body != "{}" {
					t.Fatalf("unary answer %q %q", head, body)
				}
				rest = rest[len(unary):]
			}
		}
	}
	if br.Buffered() != 0 {
		t.Fatalf("bytes after the last answer: %d", br.Buffered())
	}
}

// TestStreamEndAloneHeldForTheNextRead: when the engine writes its last
// events apart from the end of its stream, the response's closing chunk is
// still held for the connection's next read on the goroutine front door
// (sent from inside its wait), so that read does not try the socket for
// nothing first, as it does not when the end comes with events (issue 36).
func TestStreamEndAloneHeldForTheNextRead(t *testing.T) {
	release := make(chan struct{})
	up := rawUpstream(t, func(c net.Conn, stop <-chan struct{}) {
		br := bufio.NewReader(c)
		var req fasthttp.Request
		if req.Read(br) != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
			strconv.FormatInt(int64(len(shortStream)), 16)+"\r\n"+shortStream+"\r\n")
		select {
		case <-release:
		case <-stop:
			return
		}
		_, _ = io.WriteString(c, "0\r\n\r\n")
		if req.Read(br) != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	})
	c, rc := socketCountedClient(t, record(up, "m", discovery.StatusActive))
	post := func(body string) {
		t.Helper()
		if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
			strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
			t.Fatal(err)
		}
	}
	post(`{"model":"m","stream":true}`)
	var got []byte
	buf := make([]byte, 4096)
	readUntil := func(suffix string) {
		t.Helper()
		for !strings.HasSuffix(string(got), suffix) {
			n, err := c.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				t.Fatalf("reading the answer: %v (got %q)", err, got)
			}
		}
	}
	readUntil("data: [DONE]\n\n\r\n") // every event; the engine has not ended its stream
	close(release)
	readUntil("\r\n0\r\n\r\n")
	post(`{"model":"m"}`)
	got = nil
	readUntil("\r\n\r\n{}")
	if n := rc.reads.Load(); n != 1 {
		t.Fatalf("%d reads through the connection, want 1 (the first request's; the next one's held)", n)
	}
}

// splitChunkEngine answers one stream with a single chunk of events that
// it sends in two writes, the first ending inside the chunk's data (after
// the first event, inside the second), as a zero-latency engine whose
// answer outgrows its 4 KiB writer does; between them it waits for
// resume.
func splitChunkEngine(t *testing.T, resume <-chan struct{}) *upstream {
	t.Helper()
	ev0, _, _ := strings.Cut(shortStream, "\n\n")
	cut := len(ev0) + 2 + 20 // the first event and part of the second
	return rawUpstream(t, func(c net.Conn, stop <-chan struct{}) {
		readRequest(c)
		whole := oneChunkStream(shortStream)
		head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
		at := strings.Index(whole, "\r\n") + 2 + cut
		_, _ = io.WriteString(c, head+whole[:at])
		select {
		case <-resume:
		case <-stop:
			return
		}
		_, _ = io.WriteString(c, whole[at:])
	})
}

// TestStreamChunkInTwoPiecesOneWrite: events whose engine chunk comes in
// two pieces (the engine's writer full before the chunk's end) reach the
// client in one write with the rest of the chunk, not one write a piece
// (issue 36): the first piece's events wait for the rest, which is on its
// way. The engine pauses between its pieces, so that the relay reads the
// first alone.
func TestStreamChunkInTwoPiecesOneWrite(t *testing.T) {
	resume := make(chan struct{})
	up := splitChunkEngine(t, resume)
	addr, wc := startCountedRouter(t, record(up, "m", discovery.StatusActive))
	go func() {
		// Long enough for the relay to read, relay and wait on the
		// first piece alone; the count, not the time, is checked.
		time.Sleep(100 * time.Millisecond)
		close(resume)
	}()
	got := rawPost(t, addr, "/v1/chat/completions", `{"model":"m","stream":true}`)
	if events := chunkedEvents(t, got); events != shortStream {
		t.Fatalf("events %q, want %q", events, shortStream)
	}
	if n := wc.writes.Load(); n != 1 {
		t.Fatalf("stream in %d writes, want 1 (headers, both pieces' events and the closing chunk)", n)
	}
}

// TestStreamChunkPieceHeldNoLongerThanABeat: when the rest of an engine's
// chunk does not come, the events of its first piece, held for it, reach
// the client with the next heartbeat; the rest follows when it comes.
func TestStreamChunkPieceHeldNoLongerThanABeat(t *testing.T) {
	resume := make(chan struct{})
	up := splitChunkEngine(t, resume)
	cfg := router.DefaultConfig()
	cfg.IdleConnTimeout = 50 * time.Millisecond
	cfg.HeartbeatInterval = 20 * time.Millisecond
	r, err := router.New(cfg, router.RoundRobin{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{record(up, "m", discovery.StatusActive)}})
	addr := servetest.Loopback(t, "router", func(ctx context.Context, ln net.Listener) error { return r.Serve(ctx, ln) })
	c := dialClient(t, addr)
	defer c.Close()
	body := `{"model":"m","stream":true}`
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	ev0, _, _ := strings.Cut(shortStream, "\n\n")
	var got []byte
	buf := make([]byte, 4096)
	for !strings.Contains(string(got), ev0+"\n\n") { // the engine waits: only a beat sends it
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("reading the first event: %v (got %q)", err, got)
		}
	}
	close(resume)
	for !strings.HasSuffix(string(got), "\r\n0\r\n\r\n") {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("reading the rest: %v (got %q)", err, got)
		}
	}
	events := chunkedEvents(t, string(got))
	if want := ev0 + "\n\n"; !strings.HasPrefix(events, want) ||
		strings.ReplaceAll(events, ": keep-alive\n\n", "") != shortStream {
		t.Fatalf("events %q, want %q (heartbeats aside)", events, shortStream)
	}
}

// chunkedEvents returns the body of the chunked answer got (a response
// read to its end), its chunks joined.
func chunkedEvents(t *testing.T, got string) string {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got)), nil)
	if err != nil {
		t.Fatalf("answer %q: %v", got, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("answer %q: %v", got, err)
	}
	return string(b)
}
