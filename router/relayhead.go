package router

import (
	"bytes"

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
// Every other answer to such a request (an error, a unary answer, the PD
// path, a stream the relay does not write) sets the ids on fasthttp's
// header before any other non-special header (echoID): after the scan for
// a unary request, before Allow, Retry-After and Cache-Control, on the PD
// path's entry, in the relay's finish otherwise. A request whose ids
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
