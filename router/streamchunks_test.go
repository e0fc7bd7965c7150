package router_test

import (
	"errors"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

// chunksCase is one stream for TestStreamChunksAsFasthttp: what the engine
// sends, in parts, and how the client asks and reads.
type chunksCase struct {
	name, path, body string
	http10           bool // the client speaks HTTP/1.0
	// parts are the engine's writes after its status line; after part i
	// it waits until the client has read marks[i] ("": it pauses
	// briefly instead, the client seeing nothing of it: half an event).
	parts, marks []string
	cut          bool          // the engine drops the connection after its parts
	slowRead     time.Duration // the client's pause between its 512-byte reads
	heartbeats   bool          // the router sends heartbeats while the engine is silent
	// exact: the bytes do not depend on timing (how the relay's reads
	// batch the engine's events): compared whole, not only the headers
	// and the body's bytes with the chunks' framing checked.
	exact bool
}

// streamEvent is one chat completion chunk event.
func streamEvent(text, finish string) string {
	return `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` +
		text + `"},"finish_reason":` + finish + `}]}` + "\n\n"
}

func chunkOf(s string) string { return strings.TrimSuffix(oneChunkStream(s), "0\r\n\r\n") }

// TestStreamChunksAsFasthttp: the relay writing a stream's chunks into the
// client connection itself (writehold.go) sends the client what
// fasthttp's chunked writer sent, byte for byte, on both front doors: a
// short stream, large batches, events split across the engine's writes,
// a client slow to read, an Anthropic stream, a stream cut mid-way, an
// HTTP/1.0 client, heartbeats.
func TestStreamChunksAsFasthttp(t *testing.T) {
	big := strings.Repeat(streamEvent("tok", "null"), 40)  // 5.9 KB
	mid := strings.Repeat(streamEvent("more", "null"), 64) // 9.5 KB
	last := streamEvent(".", `"stop"`) + "data: [DONE]\n\n"
	half := len(streamEvent("x", "null")) / 2
	var flood strings.Builder
	for i := range 2000 {
		flood.WriteString(streamEvent("t"+strconv.Itoa(i), "null"))
	}
	cases := []chunksCase{
		{name: "short", parts: []string{oneChunkStream(shortStream)}, exact: true},
		{name: "large batches", parts: []string{chunkOf(big), chunkOf(mid), oneChunkStream(last)},
			marks: []string{big[len(big)-40:], mid[len(mid)-40:]}, exact: true},
		{name: "split events", parts: []string{
			chunkOf(streamEvent("a", "null") + streamEvent("x", "null")[:half]),
			chunkOf(streamEvent("x", "null")[half:]),
			oneChunkStream(last),
		}, marks: []string{"", `"content":"x"`}, exact: true},
		{name: "slow client", parts: []string{chunkOf(flood.String()), oneChunkStream(last)},
			marks: []string{`"t1999"`}, slowRead: time.Millisecond},
		{name: "anthropic", path: "/v1/messages",
			body:  `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hello"}]}`,
			parts: []string{oneChunkStream(shortStream)}, exact: true},
		{name: "anthropic large", path: "/v1/messages",
			body:  `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hello"}]}`,
			parts: []string{chunkOf(big), oneChunkStream(last)}, marks: []string{"message_start"}, exact: true},
		{name: "cut", parts: []string{"b\r\ndata: 1\n\nda\r\n"}, cut: true, exact: true},
		{name: "http/1.0", http10: true, parts: []string{oneChunkStream(shortStream)}, exact: true},
		{name: "heartbeats", parts: []string{"", oneChunkStream(shortStream)}, marks: []string{": keep-alive"}, heartbeats: true, exact: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got [2][2]string // [fasthttp's writer, the relay's][goroutine door, loop door]
			for i, direct := range []bool{false, true} {
				t.Run(map[bool]string{false: "fasthttp", true: "relay"}[direct], func(t *testing.T) {
					was := router.SetStreamChunksDirect(direct)
					t.Cleanup(func() { router.SetStreamChunksDirect(was) }) // after the routers are stopped
					engine, next := chunksEngine(t, tc)
					fd := startFrontDoorsOver(t, chunksConfig(tc), engine)
					got[i][0] = chunksExchange(t, fd.goroutine, tc, next)
					got[i][1] = chunksExchange(t, fd.loop, tc, next)
				})
			}
			for door, name := range []string{"goroutine", "loop"} {
				before, after := got[0][door], got[1][door]
				if before == "" || after == "" {
					t.Fatalf("%s door: no answer", name)
				}
				if tc.exact {
					if before != after {
						t.Errorf("%s door: differs from byte %d:\nfasthttp's writer %q\nthe relay's       %q", name, firstDiff(before, after), before, after)
					}
					continue
				}
				bh, bb := dechunk(t, before)
				ah, ab := dechunk(t, after)
				if bh != ah || bb != ab {
					t.Errorf("%s door: headers or body differ (body from byte %d of %d, %d):\n%q\n%q", name, firstDiff(bb, ab), len(bb), len(ab), bh, ah)
				}
			}
		})
	}
}

func chunksConfig(tc chunksCase) router.Config {
	cfg := router.DefaultConfig()
	// Heartbeats only where the case wants them: a slow client's wait for
	// the rest of its stream could last a beat.
	cfg.HeartbeatInterval = time.Minute
	if tc.heartbeats {
		cfg.HeartbeatInterval = 30 * time.Millisecond
	}
	return cfg
}

// chunksEngine is an engine answering every request with tc's parts; a
// send on next lets it go on after a mark.
func chunksEngine(t *testing.T, tc chunksCase) (discovery.Record, chan<- struct{}) {
	next := make(chan struct{})
	up := rawUpstream(t, func(c net.Conn, stop <-chan struct{}) {
		readRequest(c)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i, part := range tc.parts {
			_, _ = io.WriteString(c, part)
			if i >= len(tc.marks) {
				continue
			}
			if tc.marks[i] == "" {
				time.Sleep(20 * time.Millisecond) // (the bytes do not depend on it: half an event is not written)
				continue
			}
			select {
			case <-next:
			case <-stop:
				return
			}
		}
		if !tc.cut {
			readRequest(c) // (until the router closes or reuses the connection)
		}
	})
	return record(up, "m", discovery.StatusActive), next
}

// chunksVarying are the headers that differ from one answer to the next.
var chunksVarying = regexp.MustCompile(`\r\n(Date|X-Request-Id|X-Infera-Request-Id|X-Infera-Worker): [^\r]*`)

// chunksExchange sends tc's request on a new connection and returns what
// came back (its varying headers blanked: chunksVarying), read up to the
// end of the chunked body or of the connection.
func chunksExchange(t *testing.T, addr string, tc chunksCase, next chan<- struct{}) string {
	t.Helper()
	c := dialClient(t, addr)
	defer c.Close()
	path, body := tc.path, tc.body
	if path == "" {
		path, body = "/v1/chat/completions", `{"model":"m","stream":true}`
	}
	proto, extra := "HTTP/1.1", ""
	if tc.http10 {
		proto, extra = "HTTP/1.0", "Connection: keep-alive\r\n"
	}
	req := "POST " + path + " " + proto + "\r\nHost: x\r\nContent-Type: application/json\r\nanthropic-version: 2023-06-01\r\n" + extra +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	marks := tc.marks
	var got []byte
	buf := make([]byte, 512)
	for {
		for len(marks) > 0 && (marks[0] == "" || strings.Contains(string(got), marks[0])) {
			if marks[0] != "" {
				next <- struct{}{}
			}
			marks = marks[1:]
		}
		if len(marks) == 0 && strings.HasSuffix(string(got), "\r\n0\r\n\r\n") {
			break
		}
		if tc.slowRead > 0 {
			time.Sleep(tc.slowRead)
		}
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading the answer: %v (got %q)", err, got)
		}
	}
	s := chunksVarying.ReplaceAllString(string(got), "\r\n$1: -")
	if tc.heartbeats {
		beat := "e\r\n: keep-alive\n\n\r\n" // how many the silence lasted is timing
		for strings.Contains(s, beat+beat) {
			s = strings.ReplaceAll(s, beat+beat, beat)
		}
	}
	return s
}

// dechunk splits a chunked answer into its headers and its body's bytes,
// failing where the framing is not fasthttp's (lower-case hex lengths
// without leading zeros, no extensions, no empty chunk but the last).
func dechunk(t *testing.T, s string) (head, body string) {
	t.Helper()
	head, rest, ok := strings.Cut(s, "\r\n\r\n")
	if !ok {
		t.Fatalf("no headers in %q", s)
	}
	var b strings.Builder
	for {
		line, after, ok := strings.Cut(rest, "\r\n")
		if !ok || line == "" || (len(line) > 1 && line[0] == '0') || strings.ToLower(line) != line {
			t.Fatalf("bad chunk size line %q", line)
		}
		n, err := strconv.ParseUint(line, 16, 32)
		if err != nil {
			t.Fatalf("bad chunk size line %q", line)
		}
		if n == 0 {
			if after != "\r\n" {
				t.Fatalf("after the last chunk: %q", after)
			}
			return head, b.String()
		}
		if uint64(len(after)) < n+2 || after[n:n+2] != "\r\n" {
			t.Fatalf("chunk of %d bytes cut: %q", n, after)
		}
		b.WriteString(after[:n])
		rest = after[n+2:]
	}
}

func firstDiff(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}
