package router_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/router"
)

// refusal reads one HTTP answer from a raw connection and checks it is an
// OpenAI error with Retry-After and the given status.
func refusal(t *testing.T, c net.Conn, status int, code string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if resp.StatusCode != status || resp.Header.Get("Retry-After") == "" || json.Unmarshal(body, &e) != nil || e.Error.Code != code {
		t.Fatalf("refusal = %d %v %s, want %d with Retry-After and code %s", resp.StatusCode, resp.Header, body, status, code)
	}
}

// Over --max-connections-per-ip a connection gets 429 in the OpenAI
// envelope; over --max-connections 503; a closed connection frees its
// place.
func TestFrontDoorConnectionLimits(t *testing.T) {
	cfg := router.DefaultConfig()
	cfg.MaxConnections = 3
	cfg.MaxConnectionsPerIP = 2
	tr := startRouter(t, router.RoundRobin{}, cfg)
	addr := strings.TrimPrefix(tr.url, "http://")
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// Two from 127.0.0.1 are served (one request each shows it).
	a, b := dial(), dial()
	for _, c := range []net.Conn{a, b} {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		askHealth(t, c, bufio.NewReader(c))
	}
	refusal(t, dial(), http.StatusTooManyRequests, "too_many_connections")

	// From another loopback address the global cap applies.
	other := func() net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c3 := other()
	_ = c3.SetDeadline(time.Now().Add(10 * time.Second))
	askHealth(t, c3, bufio.NewReader(c3))
	refusal(t, other(), http.StatusServiceUnavailable, "too_many_connections")

	// Closing one frees its place.
	a.Close()
	testkit.Eventually(t, "a place freed", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return false
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		return err == nil && resp.StatusCode == 200
	})
}

// A body that does not fit the budget is refused with 503 and Retry-After
// before it is read; one that fits is served, and its share comes back.
func TestFrontDoorBodyBudget(t *testing.T) {
	up := jsonUpstream(t)
	cfg := router.DefaultConfig()
	cfg.MaxBodyBytes = 1 << 20
	cfg.BodyBudgetBytes = 1 << 20
	tr := startRouter(t, router.RoundRobin{}, cfg, record(up, "m", discovery.StatusActive))
	big := func(n int) string {
		head := `{"model":"m","messages":[{"role":"user","content":"x"}]`
		return head + strings.Repeat(" ", n-len(head)-1) + "}"
	}
	// Held open: a 900 KiB body whose sender stalls after 16 KiB holds
	// its reservation while it is read. Should it arrive while a probe
	// holds its share, it is refused itself; then it is sent again.
	addr := strings.TrimPrefix(tr.url, "http://")
	var c net.Conn
	stall := func() {
		var err error
		if c, err = net.Dial("tcp", addr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 921600\r\n\r\n{"+strings.Repeat(" ", 16<<10)); err != nil {
			t.Fatal(err)
		}
	}
	stall()
	defer func() { c.Close() }()
	testkit.Eventually(t, "the budget to bind", func() bool {
		resp, body := tr.do(t, "POST", "/v1/chat/completions", big(200<<10))
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" && bytes.Contains(body, []byte(`"server_busy"`)) {
			return true
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
		if n, _ := c.Read(make([]byte, 1)); n > 0 {
			c.Close() // the stalled body was refused: send it again
			stall()
		}
		return false
	})
	// The stalled client leaves: its share returns.
	c.Close()
	testkit.Eventually(t, "the share to return", func() bool {
		resp, _ := tr.do(t, "POST", "/v1/chat/completions", big(900<<10))
		return resp.StatusCode == http.StatusOK
	})
	// Many sequential large bodies do not leak the budget.
	for i := range 20 {
		if resp, body := tr.do(t, "POST", "/v1/chat/completions", big(900<<10)); resp.StatusCode != http.StatusOK {
			t.Fatalf("body %d: %d %s", i, resp.StatusCode, body)
		}
	}
}

// A unary answer on the goroutine front door is held until fasthttp reads
// for the next request (frontheld.go): answers small and larger than what
// is held (epoll.MaxHeld), one after another on a keep-alive connection,
// each come whole before the next request is sent; an answer to a request
// that says Connection: close comes whole before the close.
func TestFrontDoorHeldAnswers(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		// The answer's size is the request's max_tokens.
		b := ctx.PostBody()
		i := bytes.Index(b, []byte(`"max_tokens":`)) + len(`"max_tokens":`)
		j := i + bytes.IndexByte(b[i:], '}')
		n, _ := strconv.Atoi(string(b[i:j]))
		ctx.SetContentType("application/json")
		ctx.SetBody(bytes.Repeat([]byte("x"), n))
	})
	cfg := router.DefaultConfig()
	cfg.IdleConnTimeout = 50 * time.Millisecond
	r, err := router.New(cfg, router.RoundRobin{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{record(up, "m", discovery.StatusActive)}})
	addr := servetest.Loopback(t, "router", r.Serve)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	sizes := []int{10, 60 << 10, 200 << 10, 10, 100 << 10, 10}
	for i, n := range sizes {
		extra := ""
		if i == len(sizes)-1 {
			extra = "Connection: close\r\n"
		}
		req := postReq(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":`+strconv.Itoa(n)+`}`, extra)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d (%d bytes): %v", i, n, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || len(body) != n {
			t.Fatalf("answer %d: %d, %d bytes of %d, %v", i, resp.StatusCode, len(body), n, err)
		}
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after Connection: close: %v, want EOF", err)
	}
}
