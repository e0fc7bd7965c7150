package router_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
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
