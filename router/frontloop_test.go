package router_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/router"
)

// frontDoors runs two routers over the same fleet (one upstream answering
// chat completions, unary or streamed): one with the goroutine front door
// (Serve), one with the loop front door (ServeLoop).
type frontDoors struct {
	goroutine, loop string // addresses
}

func startFrontDoors(t testing.TB, cfg router.Config) frontDoors {
	return startFrontDoorsAfter(t, cfg, 0)
}

// startFrontDoorsAfter is startFrontDoors over an upstream that answers
// after delay.
func startFrontDoorsAfter(t testing.TB, cfg router.Config, delay time.Duration) frontDoors {
	t.Helper()
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		time.Sleep(delay)
		if bytes.Contains(ctx.PostBody(), []byte(`"stream":true`)) {
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyString("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"cmpl-1","object":"chat.completion","choices":[]}`)
	})
	return startFrontDoorsOver(t, cfg, record(up, "m", discovery.StatusActive))
}

// startFrontDoorsOver is startFrontDoors over the given workers.
func startFrontDoorsOver(t testing.TB, cfg router.Config, workers ...discovery.Record) frontDoors {
	t.Helper()
	cfg.IdleConnTimeout = 50 * time.Millisecond
	var fd frontDoors
	for i, serve := range []func(*router.Router) func(context.Context, net.Listener) error{
		func(r *router.Router) func(context.Context, net.Listener) error { return r.Serve },
		func(r *router.Router) func(context.Context, net.Listener) error {
			return func(ctx context.Context, ln net.Listener) error { return r.ServeLoop(ctx, ln, nil) }
		},
	} {
		log := zerolog.Nop() // a fuzz target may not log through f
		if _, ok := t.(*testing.F); !ok {
			log = testLog(t)
		}
		r, err := router.New(cfg, router.RoundRobin{}, log)
		if err != nil {
			t.Fatal(err)
		}
		r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: workers})
		addr := servetest.Loopback(t, "router", serve(r))
		if i == 0 {
			fd.goroutine = addr
		} else {
			fd.loop = addr
		}
	}
	return fd
}

// exchange writes req to a new connection of addr (in pieces split at
// the given offsets, each after a pause), half-closes it when closeWrite,
// and returns everything the router sends until it closes or wait passes.
func exchange(t testing.TB, addr string, req []byte, splits []int, closeWrite bool, wait time.Duration) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prev := 0
	for _, s := range append(splits, len(req)) {
		if s < prev || s > len(req) {
			continue
		}
		if _, err := c.Write(req[prev:s]); err != nil {
			break
		}
		prev = s
		time.Sleep(5 * time.Millisecond)
	}
	if closeWrite {
		_ = c.(*net.TCPConn).CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	got, _ := io.ReadAll(c)
	return got
}

// What differs between two routers by design: the date, the generated
// request ids (a random prefix, then the sequence number in sixteen hex
// digits: a door that answered one request more than the other is one
// ahead from then on), the models' creation times (the clock's second).
var (
	dateRE    = regexp.MustCompile(`(?m)^Date: [^\r\n]*`)
	reqIDRE   = regexp.MustCompile(`[0-9a-f]{16}-[0-9a-f]{16}`)
	createdRE = regexp.MustCompile(`"created":[0-9]+`)
)

func normalise(b []byte) string {
	b = dateRE.ReplaceAll(b, []byte("Date: -"))
	b = createdRE.ReplaceAll(b, []byte(`"created":0`))
	return string(reqIDRE.ReplaceAll(b, []byte("ID")))
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`

const streamBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}`

func chatReq(extra string) string { return postReq(chatBody, extra) }

func postReq(body, extra string) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// frontDoorSeeds are the cases of the front-door tests: keep-alive and
// pipelining, Expect: 100-continue, chunked bodies, smuggling attempts,
// bare LF, oversized headers and bodies, HEAD, HTTP/1.0, streams.
var frontDoorSeeds = []string{
	chatReq(""),
	chatReq("") + chatReq("") + chatReq("Connection: close\r\n"),
	chatReq("Expect: 100-continue\r\n"),
	"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(chatBody)), 16) + "\r\n" + chatBody + "\r\n0\r\n\r\n",
	"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
	"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
	"GET /health HTTP/1.1\nHost: x\n\n",
	"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 20000) + "\r\n\r\n",
	"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n{",
	"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /v1/models HTTP/1.0\r\n\r\n",
	"GET /v1/models HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
	postReq(streamBody, ""),
	postReq(streamBody, "") + chatReq(""),
	"GARBAGE\r\n\r\n",
	"\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n",
}

// FuzzFrontDoorsAgree: the same bytes, sent the same way, get the same
// answer from both front doors (date and request ids aside).
func FuzzFrontDoorsAgree(f *testing.F) {
	for _, s := range frontDoorSeeds {
		f.Add([]byte(s), uint16(0), uint16(0))
		f.Add([]byte(s), uint16(len(s)/2), uint16(0))
	}
	fd := startFrontDoorsAgree(f)
	f.Fuzz(func(t *testing.T, req []byte, split1, split2 uint16) {
		if len(req) > 64<<10 {
			return
		}
		splits := []int{int(split1), int(split2)}
		if split2 <= split1 {
			splits = splits[:1]
		}
		if a, b := fd.agree(t, req, splits); a != b {
			t.Fatalf("front doors disagree on %q:\ngoroutine: %q\nloop:      %q", req, a, b)
		}
		if (split1+split2)%4 != 0 {
			return // a quarter of the inputs: the slow pair's exchanges take the idle timeout
		}
		if a, b := fd.agreeSlow(t, req, splits); a != b {
			t.Fatalf("front doors over the slow upstream disagree on %q:\ngoroutine: %q\nloop:      %q", req, a, b)
		}
	})
}

// agreeSlowDelay is how long the agreement tests' slow upstream takes to
// answer: within the span in which a unary request's client watch starts
// (clientWatchDelay/2 to clientWatchDelay after the request), and longer
// than exchange's pause between two pieces (5 ms), so that a pipelined
// request's second piece is in before the first answer goes.
const agreeSlowDelay = 15 * time.Millisecond

// agreeDoors is the front doors FuzzFrontDoorsAgree and
// TestFrontDoorsAgreeMutated compare: over an upstream that answers at
// once, and over one that answers after agreeSlowDelay.
type agreeDoors struct{ fast, slow frontDoors }

// startFrontDoorsAgree starts the front doors that FuzzFrontDoorsAgree
// and TestFrontDoorsAgreeMutated compare.
func startFrontDoorsAgree(t testing.TB) agreeDoors {
	cfg := router.DefaultConfig()
	cfg.MaxBodyBytes = 1 << 20
	cfg.MaxHeaderBytes = 4096
	cfg.ClientHeaderTimeout = time.Second
	cfg.ClientReadTimeout = time.Second
	fast := startFrontDoors(t, cfg)
	// The slow pair's exchanges end when the router closes: a
	// keep-alive connection after its idle timeout.
	cfg.ClientIdleTimeout = 200 * time.Millisecond
	return agreeDoors{fast: fast, slow: startFrontDoorsAfter(t, cfg, agreeSlowDelay)}
}

// agree sends req the same way to both doors over the instant upstream,
// half-closing after it, and returns their answers, normalised.
func (fd agreeDoors) agree(t testing.TB, req []byte, splits []int) (goroutine, loop string) {
	return normalise(exchange(t, fd.fast.goroutine, req, splits, true, 5*time.Second)),
		normalise(exchange(t, fd.fast.loop, req, splits, true, 5*time.Second))
}

// agreeSlow is agree over the slow upstream, without the half-close: a
// client watch that has started takes the end of its client's side for
// the client leaving (clientWatch.look), so whether a half-closing
// client is answered depends on which of its request's watch and answer
// comes first, by design; what the watch finds of a pipelined request
// must not change the answers.
func (fd agreeDoors) agreeSlow(t testing.TB, req []byte, splits []int) (goroutine, loop string) {
	return normalise(exchange(t, fd.slow.goroutine, req, splits, false, 5*time.Second)),
		normalise(exchange(t, fd.slow.loop, req, splits, false, 5*time.Second))
}

// TestFrontLoopKeepAlive: one connection carries many requests one after
// the other, each answered in full, through the loop front door.
func TestFrontLoopKeepAlive(t *testing.T) {
	fd := startFrontDoors(t, router.DefaultConfig())
	c, err := net.Dial("tcp", fd.loop)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i := range 50 {
		req := chatReq("")
		if i%2 == 1 {
			req = postReq(streamBody, "")
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || resp.Close {
			t.Fatalf("request %d: %d close=%v %q %v", i, resp.StatusCode, resp.Close, body, err)
		}
		if i%2 == 1 && !bytes.Contains(body, []byte("data: [DONE]")) {
			t.Fatalf("request %d: stream %q", i, body)
		}
	}
}

// TestFrontLoopConcurrentKeepAlive: many keep-alive connections at once,
// unary and streamed requests, some pipelined in pairs: every answer comes
// whole and in order through both doors (with the loop door, serving
// goroutines take most of these requests on their turns, not from the
// loop goroutine).
func TestFrontLoopConcurrentKeepAlive(t *testing.T) {
	fd := startFrontDoors(t, router.DefaultConfig())
	for _, addr := range []string{fd.goroutine, fd.loop} {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for c := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- keepAliveClient(addr, c, 30)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("%s: %v", addr, err)
			}
		}
	}
}

// keepAliveClient sends n requests on one connection (every third a pair
// in one write) and checks every answer.
func keepAliveClient(addr string, c, n int) error {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i := 0; i < n; {
		stream := (c+i)%2 == 1
		req := chatReq("")
		if stream {
			req = postReq(streamBody, "")
		}
		k := 1
		if i%3 == 2 && i+1 < n {
			req, k = req+req, 2
		}
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(conn, req); err != nil {
			return fmt.Errorf("connection %d request %d: %w", c, i, err)
		}
		for range k {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return fmt.Errorf("connection %d request %d: %w", c, i, err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || resp.Close {
				return fmt.Errorf("connection %d request %d: %d close=%v %q %v", c, i, resp.StatusCode, resp.Close, body, err)
			}
			if stream != bytes.Contains(body, []byte("data: [DONE]")) {
				return fmt.Errorf("connection %d request %d: stream %v, body %q", c, i, stream, body)
			}
			i++
		}
	}
	return nil
}

// TestFrontLoopSlowHeaders: a client that sends its headers a byte at a
// time is cut at the header timeout, as by the goroutine front door, and
// a keep-alive connection that stays silent is closed at the idle timeout.
func TestFrontLoopSlowHeaders(t *testing.T) {
	cfg := router.DefaultConfig()
	cfg.ClientHeaderTimeout = 300 * time.Millisecond
	cfg.ClientIdleTimeout = 300 * time.Millisecond
	fd := startFrontDoors(t, cfg)
	for _, addr := range []string{fd.goroutine, fd.loop} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		trickle(c, "GET /health HTTP/1.1\r\nHost: x\r\n", 50*time.Millisecond, 5*time.Second)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, _ := io.ReadAll(c)
		c.Close()
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("%s: slow headers not cut after %v (got %q)", addr, el, got)
		}
		// Idle keep-alive.
		c, err = net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		askHealth(t, c, bufio.NewReader(c))
		start = time.Now()
		var b [1]byte
		if _, err := c.Read(b[:]); err != io.EOF {
			t.Fatalf("%s: idle connection: read %v, want EOF", addr, err)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("%s: idle connection closed after %v", addr, el)
		}
		c.Close()
	}
}

// TestFrontDoorsAgreeEndWithBytes: a cut request whose end of stream (the
// client's half-close) reaches the router in the same segment as its last
// bytes, as a busy loop finds them, is answered alike by both doors: the
// goroutine door reads the end at once (fasthttp: 400); the loop door once
// stopped at its short read, had no edge left for the end and answered 408
// at the header timeout (the agreement tests' rare 408 under load). On a
// new connection, and on a keep-alive one after an answer.
func TestFrontDoorsAgreeEndWithBytes(t *testing.T) {
	cfg := router.DefaultConfig()
	cfg.ClientHeaderTimeout = time.Second
	cfg.ClientReadTimeout = time.Second
	fd := startFrontDoors(t, cfg)
	for _, keepAlive := range []bool{false, true} {
		for _, cut := range []string{"GET /v1/models HTTP/1.0\r", "GET /v", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"} {
			var got [2]string
			for i, addr := range []string{fd.goroutine, fd.loop} {
				got[i] = normalise(endWithBytes(t, addr, keepAlive, cut))
			}
			if got[0] != got[1] || strings.Contains(got[1], " 408 ") {
				t.Errorf("%q (keep-alive %v) with the end of stream:\ngoroutine: %q\nloop:      %q", cut, keepAlive, got[0], got[1])
			}
		}
	}
}

// endWithBytes sends cut and the end of the client's side in one TCP
// segment (TCP_CORK holds cut back until the FIN joins it) on a new
// connection of addr, after a request answered when keepAlive, each after
// a pause (in which the loop door takes the connection back), and returns
// what the router sends after that answer until it closes.
func endWithBytes(t *testing.T, addr string, keepAlive bool, cut string) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	if keepAlive {
		askHealth(t, c, br)
	}
	time.Sleep(20 * time.Millisecond)
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK, 1)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	if _, err := io.WriteString(c, cut); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(br)
	return got
}

// TestFrontDoorsTimeoutsNotEarly: neither door cuts a request's headers
// before the header timeout, nor closes a keep-alive connection before the
// idle timeout (the loop door's wheel once rounded a deadline down to the
// tick: a 1 s header timeout could end at 875 ms, and a request whose
// rest came in time got 408 where the goroutine door answered it).
// Connections open across a tick, so that the loop sees them at every
// phase of its clock. One-sided: a busy machine can only make a cut come
// later after the client's dial.
func TestFrontDoorsTimeoutsNotEarly(t *testing.T) {
	const timeout = 400 * time.Millisecond // the loop's tick: 50 ms
	cfg := router.DefaultConfig()
	cfg.ClientHeaderTimeout = timeout
	cfg.ClientReadTimeout = timeout
	cfg.ClientIdleTimeout = timeout
	fd := startFrontDoors(t, cfg)
	const conns = 8
	var wg sync.WaitGroup
	errs := make(chan error, 4*conns)
	for _, addr := range []string{fd.goroutine, fd.loop} {
		for i := range conns {
			wg.Add(2)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i) * timeout / 8 / conns)
				errs <- cutNotEarly(addr, "GET /health HTTP/1.1\r\nHost: x\r\n", false, timeout)
			}()
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i) * timeout / 8 / conns)
				errs <- cutNotEarly(addr, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", true, timeout)
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// cutNotEarly sends req on a new connection of addr and reads until the
// router closes it: a request timeout (408) when the headers are cut, else
// an answer (200) and then the idle close; either no sooner than timeout
// after the client dialled (the router's clock starts later: at the
// opening, or once the answer is out).
func cutNotEarly(addr, req string, answered bool, timeout time.Duration) error {
	start := time.Now()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return err
	}
	br := bufio.NewReader(c)
	if answered {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: answer %d, want 200", addr, resp.StatusCode)
		}
	}
	got, err := io.ReadAll(br)
	el := time.Since(start)
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", addr, err)
	case answered && len(got) > 0:
		return fmt.Errorf("%s: idle connection sent %q", addr, got)
	case !answered && !bytes.HasPrefix(got, []byte("HTTP/1.1 408 ")):
		return fmt.Errorf("%s: cut headers answered %q, want 408", addr, got)
	case el < timeout:
		return fmt.Errorf("%s: closed %v after the dial, before its timeout (%v); answer %v", addr, el, timeout, answered)
	}
	return nil
}

// TestFrontLoopDrain: at shutdown a request in flight is answered (with
// Connection: close) and idle connections are closed.
func TestFrontLoopDrain(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		entered <- struct{}{}
		<-release
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"cmpl-1"}`)
	})
	cfg := router.DefaultConfig()
	cfg.IdleConnTimeout = 50 * time.Millisecond
	cfg.ShutdownTimeout = 10 * time.Second
	r, err := router.New(cfg, router.RoundRobin{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{record(up, "m", discovery.StatusActive)}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.ServeLoop(ctx, ln, nil) }()
	idle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	busy, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if _, err := io.WriteString(busy, chatReq("")); err != nil {
		t.Fatal(err)
	}
	<-entered
	cancel()
	_ = idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	if _, err := idle.Read(b[:]); err != io.EOF {
		t.Fatalf("idle connection at shutdown: %v, want EOF", err)
	}
	close(release)
	_ = busy.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close || string(body) != `{"id":"cmpl-1"}` {
		t.Fatalf("in-flight answer at shutdown: %d close=%v %q", resp.StatusCode, resp.Close, body)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestFrontDoorsAgreeMutated: FuzzFrontDoorsAgree's check over a fixed
// set of mutations of its seeds (flipped bytes, cut requests, split
// writes), in every test run.
func TestFrontDoorsAgreeMutated(t *testing.T) {
	fd := startFrontDoorsAgree(t)
	// Each seed whole, its second half sent a pause after the first
	// (in while the slow upstream works on a pipelined request).
	for _, s := range frontDoorSeeds {
		splits := []int{len(s) / 2}
		if a, b := fd.agreeSlow(t, []byte(s), splits); a != b {
			t.Errorf("front doors over the slow upstream disagree on %q (split %v):\ngoroutine: %q\nloop:      %q", s, splits, a, b)
		}
	}
	rng := rand.New(rand.NewPCG(36, 1))
	for i := range 120 {
		s := []byte(frontDoorSeeds[rng.IntN(len(frontDoorSeeds))])
		for k := rng.IntN(4); k >= 0; k-- {
			s[rng.IntN(len(s))] = byte(rng.IntN(256))
		}
		if rng.IntN(3) == 0 {
			s = s[:rng.IntN(len(s))]
		}
		splits := []int{rng.IntN(len(s) + 1)}
		if a, b := fd.agree(t, s, splits); a != b {
			t.Errorf("front doors disagree on %q (split %v):\ngoroutine: %q\nloop:      %q", s, splits, a, b)
		}
		if i%4 != 0 {
			continue // a quarter of the cases: the slow pair's exchanges take the idle timeout
		}
		if a, b := fd.agreeSlow(t, s, splits); a != b {
			t.Errorf("front doors over the slow upstream disagree on %q (split %v):\ngoroutine: %q\nloop:      %q", s, splits, a, b)
		}
	}
}

// BenchmarkFrontDoor: unary chat completions over 16 keep-alive
// connections through each front door (client, router and upstream in
// this process: compare the two, not with other figures).
func BenchmarkFrontDoor(b *testing.B) {
	fd := startFrontDoors(b, router.DefaultConfig())
	for _, c := range []struct{ name, addr string }{{"goroutine", fd.goroutine}, {"loop", fd.loop}} {
		b.Run(c.name, func(b *testing.B) {
			req := []byte(chatReq(""))
			cpu0 := processCPU()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				conn, err := net.Dial("tcp", c.addr)
				if err != nil {
					b.Error(err)
					return
				}
				defer conn.Close()
				br := bufio.NewReader(conn)
				var resp fasthttp.Response
				for pb.Next() {
					if _, err := conn.Write(req); err != nil {
						b.Error(err)
						return
					}
					if err := resp.Read(br); err != nil || resp.StatusCode() != 200 {
						b.Errorf("%v %d", err, resp.StatusCode())
						return
					}
				}
			})
			// The process's CPU (client, router and upstream) per request:
			// on a busy machine a steadier comparison than the wall time.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkFrontDoorSerial is the concurrency-1 path: one keep-alive
// connection, one request at a time (each starts with the connection
// waiting in its loop).
func BenchmarkFrontDoorSerial(b *testing.B) {
	fd := startFrontDoors(b, router.DefaultConfig())
	for _, c := range []struct{ name, addr string }{{"goroutine", fd.goroutine}, {"loop", fd.loop}} {
		b.Run(c.name, func(b *testing.B) {
			req := []byte(chatReq(""))
			conn, err := net.Dial("tcp", c.addr)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			var resp fasthttp.Response
			cpu0 := processCPU()
			b.ResetTimer()
			for range b.N {
				if _, err := conn.Write(req); err != nil {
					b.Fatal(err)
				}
				if err := resp.Read(br); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("%v %d", err, resp.StatusCode())
				}
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is this process's user+system CPU time in nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// TestFrontDoorShutdownRace: shutdowns racing keep-alive connections that
// have just been answered and new connections arriving end promptly with
// every connection closed, through both front doors. (The loop door once
// let a serving goroutine that had just answered wait for the next
// request while draining: the drain waited the whole ShutdownTimeout.)
func TestFrontDoorShutdownRace(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if bytes.Contains(ctx.PostBody(), []byte(`"stream":true`)) {
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyString("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"cmpl-1"}`)
	})
	cfg := router.DefaultConfig()
	cfg.IdleConnTimeout = 50 * time.Millisecond
	cfg.ShutdownTimeout = 30 * time.Second // far beyond the bound below
	for _, door := range []string{"goroutine", "loop"} {
		for round := range 12 {
			if !shutdownRace(t, up, cfg, door) {
				t.Fatalf("%s door, round %d: see above", door, round)
			}
		}
	}
}

// shutdownRace runs one round of TestFrontDoorShutdownRace: keep-alive
// clients and dialers send requests until one of them, just answered,
// stops the router.
func shutdownRace(t *testing.T, up *upstream, cfg router.Config, door string) bool {
	r, err := router.New(cfg, router.RoundRobin{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{record(up, "m", discovery.StatusActive)}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		if door == "loop" {
			done <- r.ServeLoop(ctx, ln, nil)
		} else {
			done <- r.Serve(ctx, ln)
		}
	}()
	const bound = 15 * time.Second // generous: a sound shutdown takes milliseconds
	var (
		answered atomic.Int64
		mu       sync.Mutex
		conns    []net.Conn
		hung     atomic.Int64 // connections neither answered nor closed
		wg       sync.WaitGroup
	)
	// client sends requests on one connection (keepAlive: many) until it
	// is closed; the 40th answer overall stops the router.
	client := func(keepAlive bool) bool {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return false // the listener is closed
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		br := bufio.NewReader(c)
		// Streams: the relay's work after an answer's last byte widens
		// the window between that byte and the next read.
		req := postReq(streamBody, "")
		if !keepAlive {
			req = postReq(streamBody, "Connection: close\r\n")
		}
		for {
			_ = c.SetDeadline(time.Now().Add(bound))
			if _, err := io.WriteString(c, req); err != nil {
				return true
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					hung.Add(1)
				}
				return true
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 {
				return true
			}
			if answered.Add(1) == 40 {
				cancel()
			}
			if resp.Close || ctx.Err() != nil {
				// The server closes it next.
				if _, err := br.ReadByte(); errors.Is(err, os.ErrDeadlineExceeded) {
					hung.Add(1)
				}
				return true
			}
		}
	}
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); client(true) }()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for client(false) {
			}
		}()
	}
	ok := true
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%s door: serve: %v", door, err)
			ok = false
		}
	case <-time.After(bound):
		t.Errorf("%s door: no shutdown %v after the stop, with no request in flight", door, bound)
		ok = false
	}
	wg.Wait()
	if n := hung.Load(); n > 0 {
		t.Errorf("%s door: %d connections neither answered nor closed at shutdown", door, n)
		ok = false
	}
	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	mu.Unlock()
	if !ok {
		<-done
	}
	return ok
}
