package router

import (
	"bytes"
	"errors"
	"io"

	"github.com/valyala/fasthttp"
)

// A stream's response head, its lines written by the relay (issue 36).
// fasthttp serialises a response's head from its ResponseHeader, and
// every header set there costs a setter (a copy of the value, a scan for
// line breaks, a search of the headers set so far) and its share of the
// serialisation: ~2,100 instructions a stream (callgrind, docs/
// performance.md) for the four a stream of the mixed path carries:
// X-Request-Id and X-Infera-Request-Id (Router.serve), X-Infera-Worker
// (attempt.begin) and Cache-Control (relay.answer). For such a stream
// they are not set on fasthttp's header at all: fasthttp still writes its
// head (status line, Server, Date, Content-Type, Transfer-Encoding, and
// Connection as it decides after the handler), the client connection
// holds it (holdHead, with any earlier pipelined answer flushed with it),
// and the relay writes its four lines into it where fasthttp would have
// put them (addHeadLines), before it goes out: the client gets the bytes
// fasthttp wrote with every header set, Date and Connection fasthttp's own.
//
// A 200 unary answer of the mixed path has its lines written the same way
// (below). Every other answer to such a request (an error, the PD path, a
// NATS leg's, a stream the relay does not write) sets the ids on
// fasthttp's header before any other non-special header (echoID): before
// Allow, Retry-After and Cache-Control, on the PD path's entry, in the
// relay's finish otherwise. A request whose ids
// cannot wait (a 401 sets WWW-Authenticate first, the endpoint picker sets
// its own, a connection not the front door's) has them set at once.

// headLate reports whether the request of ctx may have its ids echoed
// late (by the relay): see above.
func (r *Router) headLate(ctx *fasthttp.RequestCtx, adminAddr bool) bool {
	if !streamDirect || !streamHeadDirect || adminAddr || r.keys.enabled() || r.cfg.Direct {
		return false
	}
	_, ok := ctx.Conn().(*frontConn)
	return ok
}

// streamHeadDirect: a stream's head lines are written by the relay (a
// test compares the bytes with fasthttp's head, off).
var streamHeadDirect = true

// echoID sets the request's ids on fasthttp's header, and the worker's
// X-Infera-Worker after them, if they are still to be set.
func (rel *relay) echoID() {
	if rel.late == nil {
		return
	}
	h := rel.late
	rel.late = nil
	echoRequestID(h, rel.id)
	if rel.lateWorker != nil {
		h.SetCanonical(inferaWorkerKey, rel.lateWorker.idHeader)
	}
}

// The lines fasthttp writes after those the relay adds, by how it decides
// the connection (HTTP/1.1; HTTP/1.0 kept alive; closed), and each with
// the relay's last line before it (Cache-Control): headEnds[i] replaces
// headTails[i] after the relay's other lines.
var (
	headTails = [...][]byte{
		[]byte("\r\nTransfer-Encoding: chunked\r\n\r\n"),
		[]byte("\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"),
		[]byte("\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"),
	}
	headEnds = [...]string{
		"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n",
		"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n",
		"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
	}
)

// addHeadLines writes rel's head lines into the stream head the client
// connection holds (the last bytes held: fasthttp's flush of its head,
// after any answer to an earlier pipelined request), in fasthttp's order:
// the ids, the worker, Cache-Control, before Transfer-Encoding.
func (rel *relay) addHeadLines(c *frontConn) {
	rel.ownHead = false
	bp := c.hold.buf
	if bp == nil {
		return
	}
	b := *bp
	var worker []byte
	if w := rel.lateWorker; w != nil {
		worker = w.headLine
	}
	for i, t := range headTails {
		if bytes.HasSuffix(b, t) {
			*bp = appendHeadLines(b[:len(b)-len(t)+2], rel.id, worker, headEnds[i])
			return
		}
	}
	// Not a head of fasthttp's usual shape: the lines go before the empty
	// line that ends it, whatever came before them.
	if len(b) >= 2 {
		*bp = append(appendHeadLines(b[:len(b)-2], rel.id, worker, "Cache-Control: no-cache\r\n"), '\r', '\n')
	}
}

// appendHeadLines appends the relay's head lines to b, end last.
func appendHeadLines(b, id, worker []byte, end string) []byte {
	b = append(b, "X-Request-Id: "...)
	b = append(b, id...)
	b = append(b, "\r\nX-Infera-Request-Id: "...)
	b = append(b, id...)
	b = append(b, '\r', '\n')
	b = append(b, worker...)
	return append(b, end...)
}

// workerHeadLine is the X-Infera-Worker line of a worker's answers, its
// value as fasthttp's setter leaves it.
func workerHeadLine(id []byte) []byte {
	var h fasthttp.ResponseHeader
	h.SetCanonical(inferaWorkerKey, id)
	line := append([]byte("X-Infera-Worker: "), h.PeekBytes(inferaWorkerKey)...)
	return append(line, '\r', '\n')
}

// A unary answer's head lines, written by the relay too (issue 36): the
// same saving for the three lines of the mixed path's 200 answers (ids and
// X-Infera-Worker: three SetCanonical and their serialisation, less the
// body stream's own path: ~900 instructions a request net, callgrind,
// docs/performance.md). The answer's body is handed to fasthttp as a body
// stream of known length (the connection's unaryAnswer): fasthttp writes
// and flushes its head first (ImmediateHeaderFlush: status line, Server,
// Date, Content-Type, Content-Length, Connection as it decides after the
// handler), the connection holds it (holdHead, after any earlier
// pipelined answer flushed with it), and WriteTo adds the relay's lines
// where fasthttp would have put them — after Content-Length, its last
// special header, and before Connection — then the body, and sends the
// whole as fasthttp would have sent the answer (writeAnswer: held for
// the next read on the goroutine door). Any other answer (an error, a
// status not 200, PD, a connection not the front door's) has its ids set
// on fasthttp's header by echoID, in finish at the latest.

// unaryHeadDirect: a unary answer's head lines are written by the relay
// (a test compares the bytes with fasthttp's head, off).
var unaryHeadDirect = true

// unaryAnswer is a frontConn's unary answer whose head lines the relay
// writes, and the answer's body stream for fasthttp: its body and lines,
// kept by the connection since the relay goes back to its pool before
// fasthttp writes the answer. Only the connection's serving goroutine
// touches it. (Not the frontConn itself as the stream: fasthttp closes a
// body stream that is an io.Closer, and a frontConn is one.)
type unaryAnswer struct {
	c *frontConn
	// body is the answer's body, swapped out of the worker's response; its
	// buffer stays with the connection for the next answer's swap (as
	// small keeps the request body's).
	body  []byte
	lines []byte // the ids' and the worker's lines
}

// maxOwnUnaryBody bounds the body of a unary answer whose head lines the
// relay writes: the head and the body are copied into the connection's
// hold buffer (8 KiB pooled, kept up to maxKeptHold), where fasthttp
// writes a larger answer's head and body with one writev and no copy.
const maxOwnUnaryBody = 16 << 10

// ownUnaryHead hands the 200 answer whose body src holds whole (the
// worker's response resp, or ctx's own after a read through the exchange
// or a translation) to the client connection, which writes it with rel's
// head lines into fasthttp's head (see above). false: the answer's head is
// fasthttp's (its ids not yet set, resp not the relay's own, a status not
// 200, a connection not the front door's, a body too large); nothing was
// done.
func (rel *relay) ownUnaryHead(ctx *fasthttp.RequestCtx, resp, src *fasthttp.Response) bool {
	if rel.late == nil || resp != rel.uresp || !streamDirect || ctx.Response.StatusCode() != fasthttp.StatusOK || len(src.Body()) > maxOwnUnaryBody {
		return false
	}
	fc, ok := rel.clientConn()
	if !ok {
		return false
	}
	u := &fc.una
	u.c = fc
	var worker []byte
	if w := rel.lateWorker; w != nil {
		worker = w.headLine
	}
	u.lines = appendHeadLines(u.lines[:0], rel.id, worker, "")
	rel.late = nil
	// Given back at full length, as readUnary does: fasthttp's pool sizes
	// what it keeps by it.
	u.body = src.SwapBody(u.body[:cap(u.body)])
	fc.holdHead()
	ctx.Response.ImmediateHeaderFlush = true
	ctx.SetBodyStream(u, len(u.body))
	return true
}

// answerBody returns the body of the answer resp holds for the client
// without draining a unary answer's body stream: Body() would copy it
// through WriteTo before fasthttp writes the head, which then finds no
// head held and sends errUnaryHeadLost as the answer (every kv-aware unary
// answer did: the divergence alarm reads the usage in finish).
func answerBody(resp *fasthttp.Response) []byte {
	if u, ok := resp.BodyStream().(*unaryAnswer); ok {
		return u.body
	}
	return resp.Body()
}

// Read is never called: fasthttp writes the body with WriteTo.
func (u *unaryAnswer) Read([]byte) (int, error) { return 0, io.EOF }

// SupportsBodyWriteTo lets fasthttp hand the body to WriteTo.
func (u *unaryAnswer) SupportsBodyWriteTo() bool { return true }

// The lines fasthttp writes after those the relay adds to a unary head:
// the connection's, as it decides it (HTTP/1.0 kept alive; closed), or
// only the empty line.
var (
	unaryKeepAlive = []byte("Connection: keep-alive\r\n\r\n")
	unaryClose     = []byte("Connection: close\r\n\r\n")
)

// WriteTo adds the relay's lines to fasthttp's head, which the connection
// holds (its last bytes), appends the body and sends them.
func (u *unaryAnswer) WriteTo(io.Writer) (int64, error) {
	c := u.c
	h := &c.hold
	bp := h.buf
	h.buf, h.on, h.head = nil, false, false
	body := u.body
	if bp == nil {
		return 0, errUnaryHeadLost
	}
	b := *bp
	if len(b) < len(unaryKeepAlive) {
		c.putHoldBuf(bp, b)
		return 0, errUnaryHeadLost
	}
	// Most heads end with Content-Length's digits and the empty line; the
	// connection's lines end in 'e'.
	tail := "\r\n"
	if b[len(b)-5] == 'e' {
		switch {
		case bytes.HasSuffix(b, unaryKeepAlive):
			tail = "Connection: keep-alive\r\n\r\n"
		case bytes.HasSuffix(b, unaryClose):
			tail = "Connection: close\r\n\r\n"
		}
	}
	b = append(b[:len(b)-len(tail)], u.lines...)
	b = append(b, tail...)
	b = append(b, body...)
	_, err := c.writeAnswer(b)
	if cap(body) > maxKeptHold {
		// The worker's response had grown its buffer for a larger answer
		// once: an idle keep-alive connection does not keep that much.
		u.body = nil
	}
	c.putHoldBuf(bp, b)
	if err != nil {
		return 0, err
	}
	return int64(len(body)), nil
}

// errUnaryHeadLost: fasthttp did not flush a unary answer's head into the
// connection's hold before its body (it always does: an invariant).
var errUnaryHeadLost = errors.New("router: a unary answer's head was not held for its lines")
