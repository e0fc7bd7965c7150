package router_test

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/servetest"
)

// TestUnaryAnswerBeforeBookkeeping: on the goroutine front door a unary
// answer, held for the connection's next read, goes out before the
// request's own bookkeeping (metrics, tracing, the relay's reset), which
// that read runs once the answer has gone and before it waits (putOff, as
// for a stream's end; issue 36), and the attempt's end before the answer
// (the policy's Release: the first answer arrives only once it is free).
// The connection goes on as before (a stream, pipelined requests), and
// every request is counted once, none left in flight, by the time the
// next request on the connection is read.
func TestUnaryAnswerBeforeBookkeeping(t *testing.T) {
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
	addr := servetest.Loopback(t, "router", r.Serve)
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
	wantUnary := func() {
		t.Helper()
		if head, body := readAnswer(t, br); head != "200 OK " || body != "{}" {
			t.Fatalf("unary answer %q %q", head, body)
		}
	}

	// The answer waits for its attempt's end, held up.
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, unary); err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{})
	go func() {
		defer close(got)
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, _ = br.Peek(1)
	}()
	<-got
	if br.Buffered() != 0 {
		t.Fatal("the answer went out before its attempt ended")
	}
	openGate()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	wantUnary()

	for _, req := range []string{unary, stream, unary + unary + stream + unary} {
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		for rest := req; rest != ""; {
			if len(rest) >= len(stream) && rest[:len(stream)] == stream {
				if head, body := readAnswer(t, br); head != "200 OK chunked" || body != shortStream {
					t.Fatalf("stream answer %q %q", head, body)
				}
				rest = rest[len(stream):]
				continue
			}
			wantUnary()
			rest = rest[len(unary):]
		}
	}
	if br.Buffered() != 0 {
		t.Fatalf("bytes after the last answer: %d", br.Buffered())
	}
	// 5 unary requests and 2 streams, each counted once by now.
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_, metrics := readAnswer(t, br)
	for _, want := range []string{
		`infera_requests_total{outcome="ok",route="chat_completions"} 7`,
		`infera_requests_in_flight 0`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}
