package router

import (
	"bufio"
	"bytes"
	"strconv"

	"github.com/valyala/fasthttp"
)

// A request's upstream request written by the relay (issue 36). fasthttp's
// Request is built header by header (each value copied and cleaned of line
// breaks, the set scanned for the name), then serialised into the
// connection's writer; a tracked stream's body was first copied aside with
// "return_token_ids" asked for (askIDs). A request on the mixed path, a
// stream's or a unary one's, writes itself instead
// (upstream.Exchange.DoWriter): its worker's request line and Host header
// as they were rendered when the worker was added, the headers appended
// straight into the connection's writer, and the body written as it lies
// (a stream's with the field between its first byte and the rest). The
// answer is read into the relay's own response as before. The bytes the
// engine receives are fasthttp's: the same lines in the same order
// (TestOwnRequestBytes). A disaggregated pair's legs write themselves too
// (sendLeg: their shaped bodies as they are, X-Request-Id the legs' own
// when the protocol forges one; TestPDLegRequestBytes), except a
// concurrent prefill, sent from a goroutine of its own. Requests it does not cover —
// a continuation's body, a traced request (the tracer sets its own
// headers), a leg over NATS, a concurrent prefill — are fasthttp's as
// before.

// upstreamUserAgent is the User-Agent a worker gets when the client sent
// none (the worker pools' Name: upstream.Pool sets it on fasthttp's).
const upstreamUserAgent = "infera"

// ownRequest is attempt a's request when it writes itself
// (upstream.RequestWriter): valid while the relay's send runs.
type ownRequest struct {
	rel  *relay
	a    *attempt
	body []byte // the body, cache hints in, before the ids are asked for
	// tail, when set, is what follows body: the cache hints and the
	// closing brace (appendHintTail), body the client's as it lies up to
	// them: the client's body is copied once, into what goes out. Set
	// only where no field is asked for.
	tail []byte
	at   int // where field goes in body
	// field: `"return_token_ids":true` (with its comma), asked for at
	// body[at]; empty: the body goes as it is.
	field string
	// id is a PD leg's X-Request-Id when its protocol forges one (pdLegs);
	// empty: the request's.
	id string
}

// writesRequest: a's request can write itself (ownRequest).
func (rel *relay) writesRequest(a *attempt) bool {
	return a.body == nil && !a.exact && !a.nats && rel.pd == nil &&
		!a.span.On() && !rel.r.overNATS(a.ticket.Worker)
}

// ownRequest readies rel.oreq as a's request.
func (rel *relay) ownRequest(a *attempt) *ownRequest {
	s := &rel.oreq
	s.rel, s.a, s.id = rel, a, ""
	if !rel.asksIDs(a) {
		s.body, s.tail = rel.hintedTail(a)
		s.at, s.field = 0, ""
		return s
	}
	s.body, s.tail = rel.hintedBody(a), nil
	s.at, s.field = rel.askIDsAt(a, s.body) // migrate.go
	return s
}

// hintedTail is hintedBody in two parts, the client's body up to the
// cache hints and the hints after it (appendHintTail; nil: the body goes
// as it is), so that the body is not copied aside first.
func (rel *relay) hintedTail(a *attempt) (body, tail []byte) {
	body = rel.body
	if rec := a.ticket.Worker.Record(); rec != nil && rel.route.generates() {
		var end int
		var ok bool
		a.hintBuf, a.hintTmp, end, ok = appendHintTail(a.hintBuf[:0], a.hintTmp, body, &rel.scan, rec.Engine)
		if ok {
			return body[:end], a.hintBuf
		}
	}
	return body, nil
}

// writesLeg: PD leg a's request, sent from the request's goroutine, can
// write itself (ownRequest; its body is shaped: a.body).
func (rel *relay) writesLeg(a *attempt) bool {
	return !a.exact && !a.nats && !a.span.On()
}

// ownLeg readies rel.oreq as PD leg a's request: its shaped body as it is
// (none: a decode-only leg's, the mixed path's body), the legs'
// X-Request-Id.
func (rel *relay) ownLeg(a *attempt) *ownRequest {
	if a.body == nil {
		s := rel.ownRequest(a)
		s.id = rel.pd.legs.requestID
		return s
	}
	s := &rel.oreq
	s.rel, s.a, s.id = rel, a, rel.pd.legs.requestID
	s.body, s.tail, s.at, s.field = a.body, nil, 0, ""
	return s
}

// WriteRequest writes the request into the worker connection's writer as
// fasthttp's Request.Write would: the head (appendHead), then the body.
// The head is appended where the writer's free space begins and written
// in place (bufio.Writer.AvailableBuffer); bufio's errors stick: the last
// write's is every write's.
func (s *ownRequest) WriteRequest(bw *bufio.Writer) error {
	bw.Write(s.appendHead(bw.AvailableBuffer()))
	if len(s.field) == 0 { // a unary request, a stream not tracked
		bw.Write(s.body)
		_, err := bw.Write(s.tail)
		return err
	}
	bw.Write(s.body[:s.at])
	bw.WriteString(s.field)
	_, err := bw.Write(s.body[s.at:])
	return err
}

// AppendRequest appends the request as WriteRequest writes it: on a
// worker connection that holds its writes the request is framed where it
// waits for the read that sends it (upstream.Conn.holdRequest), and the
// body is copied once, not into the connection's writer and then again
// into what is held.
func (s *ownRequest) AppendRequest(b []byte) []byte {
	b = append(s.appendHead(b), s.body[:s.at]...)
	b = append(b, s.field...)
	return append(append(b, s.body[s.at:]...), s.tail...)
}

// MaxRequestLen bounds what AppendRequest appends: the body, the worker's
// request and Host lines, the ids, what the client's header block can
// give the forwarded values (each one of its lines at most), and
// ownHeadSlack for the names and the lines the router writes itself.
func (s *ownRequest) MaxRequestLen() int {
	w := s.a.ticket.Worker
	return len(s.body) + len(s.tail) + len(s.field) + len(w.reqLine[s.rel.route]) + len(w.hostLine) +
		len(s.rel.id) + len(s.id) + len(s.rel.ctx.Request.Header.RawHeaders()) + ownHeadSlack
}

// ownHeadSlack is more than the header names and the router's own lines
// of an upstream request take (the longest values aside): User-Agent,
// Content-Type, Content-Length, the forwarded headers' names, X-Request-Id,
// Traceparent, Tracestate, X-Data-Parallel-Rank and the head's end.
const ownHeadSlack = 512

// appendHead appends the request's head, as fasthttp's
// RequestHeader.AppendBytes would (the request line, User-Agent, Host,
// Content-Type, Content-Length, then the headers in the order
// upstreamRequest sets them), its empty line included.
func (s *ownRequest) appendHead(b []byte) []byte {
	rel, a := s.rel, s.a
	w, h := a.ticket.Worker, &rel.ctx.Request.Header
	b = append(b, w.reqLine[rel.route]...)
	if ua := h.UserAgent(); len(ua) > 0 {
		b = appendHeaderLine(b, "User-Agent: ", ua)
	} else {
		b = append(b, "User-Agent: "+upstreamUserAgent+"\r\n"...)
	}
	b = append(b, w.hostLine...)
	if ct := h.ContentType(); len(ct) > 0 {
		b = appendHeaderLine(b, "Content-Type: ", ct)
	} else {
		b = append(b, "Content-Type: application/json\r\n"...)
	}
	b = append(b, "Content-Length: "...)
	b = strconv.AppendUint(b, uint64(len(s.body)+len(s.tail)+len(s.field)), 10)
	b = append(b, '\r', '\n')
	for _, k := range forwardHeaders {
		if string(k) == fasthttp.HeaderUserAgent ||
			string(k) == fasthttp.HeaderAuthorization && rel.r.keys.enabled() {
			continue // User-Agent: above; Authorization: see upstreamRequest
		}
		if v := h.PeekCanonical(k); len(v) > 0 {
			b = append(b, k...)
			b = appendHeaderLine(b, ": ", v)
		}
	}
	if s.id == "" {
		// The id is the router's own or a client's it checked
		// (appendRequestID): no line break in it.
		b = append(b, "X-Request-Id: "...)
		b = append(b, rel.id...)
		b = append(b, '\r', '\n')
	} else {
		b = appendHeaderLine(b, "X-Request-Id: ", s.id)
	}
	// Tracing off, the client's trace context passes through (traceInject;
	// a traced request builds fasthttp's, writesRequest).
	if tp := h.PeekCanonical(traceparentKey); len(tp) > 0 {
		b = appendHeaderLine(b, "Traceparent: ", tp)
		if ts := h.PeekCanonical(tracestateKey); len(ts) > 0 {
			b = appendHeaderLine(b, "Tracestate: ", ts)
		}
	}
	if a.ticket.PinRank {
		b = append(b, "X-Data-Parallel-Rank: "...)
		b = strconv.AppendInt(b, int64(a.ticket.DPRank), 10)
		b = append(b, '\r', '\n')
	}
	b = append(b, '\r', '\n')
	return b
}

// appendHeaderLine appends name (with its ": ") and a client's value, its
// line breaks turned into spaces as fasthttp's setters turn them.
func appendHeaderLine[V string | []byte](b []byte, name string, v V) []byte {
	b = append(b, name...)
	n := len(b)
	b = append(b, v...)
	if bytes.IndexByte(b[n:], '\r') >= 0 || bytes.IndexByte(b[n:], '\n') >= 0 {
		for i, c := range b[n:] {
			if c == '\r' || c == '\n' {
				b[n+i] = ' '
			}
		}
	}
	return append(b, '\r', '\n')
}
