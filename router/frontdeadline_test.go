package router_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

// TestFrontDoorDeadlinesSetWhenTheyApply: on the goroutine front door a
// keep-alive connection's deadlines reach its socket only when a read or a
// write begins, and the idle wait's stays set across requests
// (frontdeadline.go): fasthttp asks for four a request (idle, headers,
// body, write), none of which a request that arrives whole and an answer
// the socket takes at once wait under (issue 36).
func TestFrontDoorDeadlinesSetWhenTheyApply(t *testing.T) {
	up := rawUpstream(t, func(c net.Conn, _ <-chan struct{}) {
		br := bufio.NewReader(c)
		var req fasthttp.Request
		for {
			if req.Read(br) != nil {
				return
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
				return
			}
		}
	})
	c, rc := socketCountedClient(t, record(up, "m", discovery.StatusActive))
	br := bufio.NewReader(c)
	const requests = 20
	for range requests {
		if _, err := io.WriteString(c, chatReq("")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "{}" {
			t.Fatalf("answer %d %q, want 200 {}", resp.StatusCode, body)
		}
	}
	// The first request's header deadline, the second's idle wait (later
	// ones fall within its slack).
	if n := rc.deadlines.Load(); n > 3 {
		t.Fatalf("%d deadlines set on the socket for %d requests, want at most 3", n, requests)
	}
}

// TestFrontDoorKeepAliveSlowHeaders: a keep-alive request's headers sent a
// byte at a time are cut at the header timeout from its first byte, on
// both front doors; the idle wait before it is far longer. The goroutine
// front door applies the timeout itself (frontConn.requestBegins), not
// fasthttp.
func TestFrontDoorKeepAliveSlowHeaders(t *testing.T) {
	cfg := router.DefaultConfig()
	cfg.ClientHeaderTimeout = 300 * time.Millisecond
	cfg.ClientIdleTimeout = time.Minute
	fd := startFrontDoors(t, cfg)
	for _, addr := range []string{fd.goroutine, fd.loop} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(c)
		askHealth(t, c, br)
		start := time.Now()
		trickle(c, "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "+strings.Repeat("a", 200), 20*time.Millisecond, 5*time.Second)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, _ := io.ReadAll(br)
		c.Close()
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("%s: a keep-alive request's slow headers not cut after %v (got %q)", addr, el, got)
		}
	}
}

// trickle writes s to c a byte at a time, every interval, until a write
// fails or giveUp has passed.
func trickle(c net.Conn, s string, every, giveUp time.Duration) {
	start := time.Now()
	for i := 0; i < len(s) && time.Since(start) < giveUp; i++ {
		if _, err := c.Write([]byte{s[i]}); err != nil {
			return
		}
		time.Sleep(every)
	}
}

// TestFrontDoorStalledAnswerWriteCut: a unary answer its client does not
// read is cut at the write timeout rather than waiting for the client. The
// goroutine front door applies the timeout itself (frontConn.requestBegins),
// not fasthttp.
func TestFrontDoorStalledAnswerWriteCut(t *testing.T) {
	const size = 32 << 20 // beyond what the sockets' buffers take
	big := append(append([]byte(`{"id":"cmpl-1","pad":"`), bytes.Repeat([]byte("a"), size)...), `"}`...)
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(big)
	})
	cfg := router.DefaultConfig()
	cfg.ClientWriteTimeout = 300 * time.Millisecond
	tr := startRouter(t, router.RoundRobin{}, cfg, record(up, "m", discovery.StatusActive))
	c, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(64 << 10)
	}
	if _, err := io.WriteString(c, chatReq("")); err != nil {
		t.Fatal(err)
	}
	// The write stalls past its timeout: wait until the answer has begun
	// to arrive and stopped growing in this socket's receive queue (the
	// router's write is blocked then), then 3× the timeout. A fixed sleep
	// from the request was not enough on a loaded box: under -race the
	// router may take seconds to read the 32 MiB answer before writing.
	waitReceiveQueueStalled(t, c, 20*time.Second)
	time.Sleep(3 * cfg.ClientWriteTimeout)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, _ := io.Copy(io.Discard, c)
	if n >= int64(len(big)) {
		t.Fatalf("a stalled answer went out whole (%d bytes) after its write timeout", n)
	}
}

// waitReceiveQueueStalled waits until c's receive queue holds bytes and has
// not grown for 200 ms: its peer's write is blocked on the unread bytes.
func waitReceiveQueueStalled(t *testing.T, c net.Conn, limit time.Duration) {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	queued := func() int {
		var n int
		var ierr error
		if err := raw.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
			t.Fatal(err)
		}
		if ierr != nil {
			t.Fatal(ierr)
		}
		return n
	}
	last, still := -1, 0
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		n := queued()
		if n > 0 && n == last {
			if still++; still == 4 {
				return
			}
		} else {
			still = 0
		}
		last = n
	}
	t.Fatalf("the answer did not stall in the receive queue within %s (%d bytes queued)", limit, last)
}
