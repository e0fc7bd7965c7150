package router_test

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/servetest"
)

// TestUnaryAnswerBeforeBookkeeping: on the goroutine front door a unary
// answer, held for the connection's next read, reaches the client before
// the request's bookkeeping runs (the relay's finish: the attempt's end,
// metrics), which that read runs once the answer has gone (putOff, as for
// a stream's end; issue 36). Without it the answer waits for the policy's
// Release held up here, and the read times out. The connection goes on as
// before once the bookkeeping is free: answers with a request id and the
// worker's name, a stream, pipelined requests.
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

	// The answer arrives while its attempt's end is held up.
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, unary); err != nil {
		t.Fatal(err)
	}
	wantUnary()
	openGate()

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
}
