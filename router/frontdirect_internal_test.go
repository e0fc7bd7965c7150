package router

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// directCtx is a request ctx on fc answered with status and body, as the
// relay leaves a unary answer (before answerDirect).
func directCtx(fc *frontConn, req string, status int, body []byte) *fasthttp.RequestCtx {
	ctx := new(fasthttp.RequestCtx)
	ctx.Init2(fc, nil, false)
	if err := ctx.Request.Read(bufioReader(req)); err != nil {
		panic(err)
	}
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.Header.SetCanonical(requestIDKey, []byte("id-1"))
	ctx.Response.Header.SetCanonical(inferaWorkerKey, []byte("w1"))
	ctx.Response.SetBody(body)
	return ctx
}

const directReq = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"

// fasthttpAnswer is what fasthttp's writer sends for ctx's response.
func fasthttpAnswer(ctx *fasthttp.RequestCtx) string {
	var b bytes.Buffer
	w := bufioWriter(&b)
	if err := ctx.Response.Write(w); err != nil {
		panic(err)
	}
	_ = w.Flush()
	return b.String()
}

// answerDirect takes the body out of a 200 answer and leaves fasthttp
// the head with the body's length and the mark; the connection writes
// fasthttp's head without the mark's line, then the body: the bytes
// fasthttp's writer sent (Connection: close included).
func TestAnswerDirect(t *testing.T) {
	for _, closeConn := range []bool{false, true} {
		body := []byte(`{"id":"c1","choices":[]}`)
		want := directCtx(&frontConn{Conn: &recordConn{}}, directReq, 200, body)
		if closeConn {
			want.Response.Header.SetConnectionClose()
		}
		rc := &recordConn{}
		fc := &frontConn{Conn: rc}
		ctx := directCtx(fc, directReq, 200, body)
		answerDirect(ctx, 200)
		if !fc.direct.pending || !ctx.Response.SkipBody || len(ctx.Response.Body()) != 0 || string(fc.direct.body) != string(body) {
			t.Fatalf("not direct: pending %v, skip %v, body %q", fc.direct.pending, ctx.Response.SkipBody, fc.direct.body)
		}
		if closeConn {
			ctx.Response.Header.SetConnectionClose() // as fasthttp does after the handler
		}
		head := ctx.Response.Header.Header()
		if !bytes.Contains(head, directMark) {
			t.Fatalf("no mark in %q", head)
		}
		mustWrite(t, fc, string(head))
		if got, w := strings.Join(rc.writes, "|"), fasthttpAnswer(want); got != w {
			t.Fatalf("close %v: wrote %q, fasthttp's writer %q", closeConn, got, w)
		}
		if fc.direct.pending || fc.direct.body != nil || cap(fc.direct.spare) == 0 {
			t.Fatalf("direct state after the write: %+v", fc.direct)
		}
	}
}

// answerDirect leaves the answers it cannot write as they are.
func TestAnswerDirectNotApplied(t *testing.T) {
	body := []byte("{}")
	cases := []struct {
		name, req string
		status    int
		body      []byte
		pending   bool
		off       bool
	}{
		{name: "status 404", req: directReq, status: 404, body: body},
		{name: "status 201", req: directReq, status: 201, body: body},
		{name: "HEAD", req: "HEAD /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n", status: 200, body: body},
		{name: "HTTP/1.0", req: "POST /v1/chat/completions HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}", status: 200, body: body},
		{name: "empty body", req: directReq, status: 200},
		{name: "above the kept hold", req: directReq, status: 200, body: make([]byte, maxKeptHold+1)},
		{name: "one pending", req: directReq, status: 200, body: body, pending: true},
		{name: "off", req: directReq, status: 200, body: body, off: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fc := &frontConn{Conn: &recordConn{}}
			fc.direct.pending = tc.pending
			if tc.off {
				was := unaryDirect
				unaryDirect = false
				defer func() { unaryDirect = was }()
			}
			ctx := directCtx(fc, tc.req, tc.status, tc.body)
			answerDirect(ctx, tc.status)
			if ctx.Response.SkipBody || len(ctx.Response.Body()) != len(tc.body) || len(ctx.Response.Header.PeekCanonical(directKey)) != 0 {
				t.Fatalf("made direct: skip %v, body %d bytes", ctx.Response.SkipBody, len(ctx.Response.Body()))
			}
			if fc.direct.pending != tc.pending {
				t.Fatal("pending changed")
			}
		})
	}
}

// The head may come in pieces and after other answers (pipelined ones
// fasthttp's writer held), and other answers after it: cut anywhere, the
// bytes are the answers in their order, the direct one with its body.
func TestFrontConnWriteDirectCut(t *testing.T) {
	body := []byte(strings.Repeat("b", 300))
	prev := "HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nno\n"
	next := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	for _, end := range directEnds {
		head := "HTTP/1.1 200 OK\r\nContent-Length: 300\r\nX-Infera-Worker: w1" + string(directMark) + string(end)
		want := prev + strings.Replace(head, string(directMark), "\r\n", 1) + string(body) + next
		all := prev + head + next
		for i := 0; i <= len(all); i++ {
			for _, j := range []int{i, min(i+1, len(all)), min(i+len(directMark), len(all)), len(all)} {
				rc := &recordConn{}
				fc := &frontConn{Conn: rc}
				fc.direct.pending, fc.direct.body = true, body
				for _, part := range []string{all[:i], all[i:j], all[j:]} {
					if len(part) > 0 {
						mustWrite(t, fc, part)
					}
				}
				if got := strings.Join(rc.writes, ""); got != want {
					t.Fatalf("cut at %d and %d: wrote %q, want %q", i, j, got, want)
				}
				if fc.direct.pending || fc.direct.carry != nil {
					t.Fatalf("cut at %d and %d: still pending", i, j)
				}
			}
		}
	}
}

// A head whose mark is followed by something fasthttp does not write
// there fails the write: the connection's framing is lost.
func TestFrontConnWriteDirectMismatch(t *testing.T) {
	fc := &frontConn{Conn: &recordConn{}}
	fc.direct.pending, fc.direct.body = true, []byte("x")
	head := "HTTP/1.1 200 OK" + string(directMark) + "Set-Cookie: a=b\r\n\r\n"
	if _, err := fc.Write([]byte(head)); !errors.Is(err, errDirectMismatch) {
		t.Fatalf("write: %v", err)
	}
}

// A direct answer, from the relay's answerDirect to the connection's write,
// allocates nothing.
func TestAnswerDirectAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	cc := &countConn{}
	fc := &frontConn{Conn: cc}
	body := []byte(strings.Repeat(`{"choices":[]}`, 40))
	ctx := directCtx(fc, directReq, 200, body)
	var head []byte
	run := func() {
		ctx.Response.SetBody(body)
		answerDirect(ctx, 200)
		head = ctx.Response.Header.AppendBytes(head[:0])
		_, _ = fc.Write(head)
		ctx.Response.SkipBody = false
		ctx.Response.Header.DelBytes(directKey)
	}
	run()
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("a direct answer allocates %.1f times, want 0", n)
	}
	if cc.writes != 102 {
		t.Fatalf("%d writes for 102 answers", cc.writes)
	}
}

func bufioReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }

func bufioWriter(w io.Writer) *bufio.Writer { return bufio.NewWriter(w) }
