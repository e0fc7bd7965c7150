package router

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/openai"
)

const (
	// relayBufSize is the pooled read buffer of one response. An SSE event
	// from an engine is a few hundred bytes; one larger than this is passed
	// on in pieces (still byte-exact).
	relayBufSize = 32 << 10
	// maxUnaryResponseBytes caps a buffered (non-streaming) worker answer.
	maxUnaryResponseBytes = 64 << 20
)

// forwardHeaders are the client headers a worker gets; the rest (hop-by-hop,
// cookies, the client's Host) stay here.
var forwardHeaders = [...]string{"Authorization", "Accept", "User-Agent", "OpenAI-Organization", "OpenAI-Project"}

// relay is the per-request state of a proxied request, pooled. For a
// stream it is also the response body fasthttp writes: fasthttp calls
// WriteTo with its chunked writer, which flushes each write to the client
// socket, and calls Close when the response is done (or abandoned).
type relay struct {
	r      *Router
	route  Route
	start  time.Time
	scan   openai.Request
	in     PickInput
	id     []byte // request id (pooled backing array)
	ticket Ticket
	resp   *fasthttp.Response // upstream response while streaming
	src    io.Reader          // its body stream
	status int
	pump   eventPump

	firstByte bool
	done      bool // the stream reached its end (or failed) in WriteTo/Read
	outcome   outcome
	err       error
}

var relayPool = sync.Pool{New: func() any {
	return &relay{
		id:   make([]byte, 0, maxRequestIDBytes),
		pump: eventPump{buf: make([]byte, relayBufSize)},
	}
}}

func acquireRelay(r *Router, route Route) *relay {
	rel := relayPool.Get().(*relay)
	rel.r = r
	rel.route = route
	rel.start = time.Now()
	return rel
}

func (rel *relay) reset() {
	buf, id := rel.pump.buf, rel.id[:0]
	scratch := rel.scan
	*rel = relay{id: id, pump: eventPump{buf: buf}}
	// Keep the scanner's scratch buffer (an escaped model name) too.
	rel.scan = scratch
	rel.scan.Model = nil
}

// proxy serves POST /v1/chat/completions and /v1/completions.
func (r *Router) proxy(ctx *fasthttp.RequestCtx, route Route) {
	rel := acquireRelay(r, route)
	r.metrics.inflight.Inc()
	rel.id = r.appendRequestID(rel.id[:0], ctx.Request.Header.Peek("X-Request-Id"))
	ctx.Response.Header.SetBytesV("X-Request-Id", rel.id)

	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "use POST for "+route.Path(), openai.TypeInvalidRequest, "method_not_allowed")
		r.finish(rel, outcomeMethodNotAllowed, fasthttp.StatusMethodNotAllowed)
		return
	}
	body := ctx.PostBody()
	if err := openai.Scan(body, &rel.scan); err != nil {
		code := "invalid_json"
		var fe *openai.FieldError
		switch {
		case errors.As(err, &fe):
			code = "invalid_field"
		case errors.Is(err, openai.ErrMissingModel):
			code = "missing_model"
		case errors.Is(err, openai.ErrNotObject):
			code = "invalid_body"
		}
		writeError(ctx, fasthttp.StatusBadRequest, "invalid request body: "+err.Error(), openai.TypeInvalidRequest, code)
		r.finish(rel, outcomeBadRequest, fasthttp.StatusBadRequest)
		return
	}
	v := r.view.Load()
	if v == nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "the fleet view is not loaded yet", openai.TypeUnavailable, "not_ready")
		r.finish(rel, outcomeNotReady, fasthttp.StatusServiceUnavailable)
		return
	}
	c := v.models[string(rel.scan.Model)]
	if c == nil {
		writeError(ctx, fasthttp.StatusNotFound, "The model `"+clip(rel.scan.Model)+"` does not exist.", openai.TypeNotFound, "model_not_found")
		r.finish(rel, outcomeModelNotFound, fasthttp.StatusNotFound)
		return
	}
	if len(c.Workers) == 0 {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "no active worker serves model `"+c.Model+"`", openai.TypeUnavailable, "no_worker_available")
		r.finish(rel, outcomeNoWorker, fasthttp.StatusServiceUnavailable)
		return
	}
	rel.in = PickInput{Route: route, Body: body, Request: &rel.scan, RequestID: rel.id}
	t, err := r.policy.Pick(&rel.in, c)
	rel.in = PickInput{}
	if err != nil || t.Worker == nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "no worker available for model `"+c.Model+"`", openai.TypeUnavailable, "no_worker_available")
		r.finish(rel, outcomeNoWorker, fasthttp.StatusServiceUnavailable)
		return
	}
	rel.ticket = t
	w := t.Worker
	w.inflight.Add(1)
	w.picks.Inc()
	ctx.Response.Header.Set("X-Infera-Worker", w.id)

	// One attempt. Retries (another Pick, then forward again) belong here
	// once they exist: nothing has reached the client until forward returns.
	resp, err := r.forward(ctx, rel, w, body)
	if err != nil {
		r.log.Warn().Str("worker_id", w.id).Bytes("request_id", rel.id).Err(err).Msg("worker request failed")
		status, code := fasthttp.StatusBadGateway, "upstream_error"
		switch {
		case errors.Is(err, fasthttp.ErrTimeout) || isTimeout(err):
			code = "upstream_timeout"
		case errors.Is(err, fasthttp.ErrNoFreeConns):
			code = "upstream_busy"
		}
		writeError(ctx, status, "worker "+w.id+" failed: "+err.Error(), openai.TypeServer, code)
		rel.err = err
		r.finish(rel, outcomeUpstreamError, 0)
		return
	}
	rel.status = resp.StatusCode()
	ctx.SetStatusCode(rel.status)
	if ct := resp.Header.ContentType(); len(ct) > 0 {
		ctx.Response.Header.SetContentTypeBytes(ct)
	}
	if isEventStream(resp.Header.ContentType()) && resp.BodyStream() != nil {
		rel.resp, rel.src = resp, resp.BodyStream()
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		// The client sees the headers at once, not with the first token.
		ctx.Response.ImmediateHeaderFlush = true
		ctx.SetBodyStream(rel, -1)
		return // Close finishes the request
	}
	err = readUnary(ctx, resp, rel.pump.buf)
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)
	if err != nil {
		r.log.Warn().Str("worker_id", w.id).Bytes("request_id", rel.id).Err(err).Msg("reading worker response failed")
		ctx.Response.ResetBody()
		writeError(ctx, fasthttp.StatusBadGateway, "worker "+w.id+" failed: "+err.Error(), openai.TypeServer, "upstream_error")
		rel.err = err
		r.finish(rel, outcomeUpstreamError, 0)
		return
	}
	r.finish(rel, statusOutcome(rel.status), rel.status)
}

// forward sends the request to w and returns its response once the status
// line and headers are in; the body is still to be read (streamed).
func (r *Router) forward(ctx *fasthttp.RequestCtx, rel *relay, w *Worker, body []byte) (*fasthttp.Response, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI(w.uri[rel.route])
	req.Header.SetMethod(fasthttp.MethodPost)
	if ct := ctx.Request.Header.ContentType(); len(ct) > 0 {
		req.Header.SetContentTypeBytes(ct)
	} else {
		req.Header.SetContentType("application/json")
	}
	for _, h := range forwardHeaders {
		if v := ctx.Request.Header.Peek(h); len(v) > 0 {
			req.Header.SetBytesV(h, v)
		}
	}
	req.Header.SetBytesV("X-Request-Id", rel.id)
	if rel.ticket.PinRank {
		var rank [20]byte
		req.Header.SetBytesV("X-Data-Parallel-Rank", strconv.AppendInt(rank[:0], int64(rel.ticket.DPRank), 10))
	}
	// The body goes out byte for byte, without a copy; it stays valid
	// because Do has written it all when it returns.
	req.SetBodyRaw(body)

	resp := fasthttp.AcquireResponse()
	if err := w.client.Do(req, resp); err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, err
	}
	return resp, nil
}

// readUnary copies a complete (non-SSE) worker answer into the client
// response.
func readUnary(ctx *fasthttp.RequestCtx, resp *fasthttp.Response, buf []byte) error {
	src := resp.BodyStream()
	if src == nil {
		ctx.SetBody(resp.Body())
		return nil
	}
	total := 0
	for {
		n, err := src.Read(buf)
		if n > 0 {
			total += n
			if total > maxUnaryResponseBytes {
				return errUnaryTooLarge
			}
			ctx.Response.AppendBody(buf[:n])
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

var errUnaryTooLarge = errors.New("worker response exceeds " + itoa(maxUnaryResponseBytes) + " bytes")

// finish records the end of a request: metrics, policy release, in-flight
// accounting; then the relay goes back to the pool.
func (r *Router) finish(rel *relay, o outcome, status int) {
	d := time.Since(rel.start)
	m := r.metrics
	m.request(rel.route, o).Inc()
	m.duration[rel.route].Observe(d.Seconds())
	m.inflight.Dec()
	if w := rel.ticket.Worker; w != nil {
		r.policy.Release(rel.ticket, Result{Status: status, Err: rel.err, Duration: d})
		w.inflight.Add(-1)
	}
	rel.reset()
	relayPool.Put(rel)
}

func statusOutcome(status int) outcome {
	if status >= 200 && status < 300 {
		return outcomeOK
	}
	return outcomeUpstreamStatus
}

func isEventStream(ct []byte) bool {
	return bytes.HasPrefix(ct, []byte("text/event-stream"))
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// The relay as fasthttp's response body stream.

// SupportsBodyWriteTo lets fasthttp hand WriteTo its chunked writer instead
// of copying through Read.
func (rel *relay) SupportsBodyWriteTo() bool { return true }

// WriteTo relays the upstream SSE stream to w event by event (see
// eventPump). A failed write means the client is gone: the upstream body is
// closed at once, which closes the worker connection so that the engine
// stops generating. A failed read means the worker broke mid-stream: the
// client gets an SSE error event, since the status line went out long ago.
func (rel *relay) WriteTo(w io.Writer) (int64, error) {
	rel.done = true // every return below ends the stream and sets the outcome
	var total int64
	for {
		n, rerr, werr := rel.pump.step(w, rel.src)
		total += int64(n)
		if n > 0 && !rel.firstByte {
			rel.firstByte = true
			rel.r.metrics.ttft[rel.route].Observe(time.Since(rel.start).Seconds())
		}
		if werr != nil {
			rel.outcome, rel.err = outcomeClientGone, werr
			rel.closeUpstream()
			return total, werr
		}
		if rerr == nil {
			continue
		}
		if rerr == io.EOF {
			if rel.pump.n > 0 { // a last event without its blank line
				k, err := w.Write(rel.pump.buf[:rel.pump.n])
				total += int64(k)
				rel.pump.n = 0
				if err != nil {
					rel.outcome, rel.err = outcomeClientGone, err
					return total, err
				}
			}
			rel.outcome = statusOutcome(rel.status)
			return total, nil
		}
		rel.outcome, rel.err = outcomeStreamError, rerr
		rel.closeUpstream()
		rel.r.log.Warn().Str("worker_id", rel.ticket.Worker.id).Bytes("request_id", rel.id).Err(rerr).Msg("worker stream failed")
		// The incomplete event is dropped: half a JSON chunk helps no one.
		rel.pump.n = 0
		ev := append(rel.pump.buf[:0], "data: "...)
		ev = openai.AppendError(ev, "worker "+rel.ticket.Worker.id+" failed mid-stream: "+rerr.Error(), openai.TypeServer, "upstream_stream_error")
		ev = append(ev, "\n\n"...)
		k, err := w.Write(ev)
		total += int64(k)
		return total, err
	}
}

// Read is the plain fallback should fasthttp read the body instead of
// calling WriteTo: bytes pass through unchanged.
func (rel *relay) Read(p []byte) (int, error) {
	if rel.src == nil {
		return 0, io.EOF
	}
	n, err := rel.src.Read(p)
	if n > 0 && !rel.firstByte {
		rel.firstByte = true
		rel.r.metrics.ttft[rel.route].Observe(time.Since(rel.start).Seconds())
	}
	switch {
	case err == io.EOF:
		rel.done, rel.outcome = true, statusOutcome(rel.status)
	case err != nil:
		rel.done, rel.outcome, rel.err = true, outcomeStreamError, err
	}
	return n, err
}

// Close ends a streamed request; fasthttp calls it once the body is written
// or abandoned.
func (rel *relay) Close() error {
	if !rel.done {
		// Closed before the stream ended: the client went away (or the
		// server is shutting down) before fasthttp could write it.
		rel.outcome = outcomeClientGone
	}
	rel.closeUpstream()
	rel.r.finish(rel, rel.outcome, rel.status)
	return nil
}

// closeUpstream closes the worker's body stream; unless it was read to the
// end this closes the connection, which is how the engine learns the client
// is gone.
func (rel *relay) closeUpstream() {
	if rel.resp == nil {
		return
	}
	_ = rel.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(rel.resp)
	rel.resp, rel.src = nil, nil
}

// eventPump moves an SSE stream from src to dst one read at a time: every
// complete event in the buffer goes out in one write as soon as it is
// complete (fasthttp's chunked writer flushes each write), an incomplete
// one waits for its next bytes. Nothing is allocated.
type eventPump struct {
	buf []byte
	n   int // bytes buffered: the start of an incomplete event
}

// step does one read and the write it enables. It returns the bytes
// written, the read error (io.EOF at the end) and the write error.
func (p *eventPump) step(dst io.Writer, src io.Reader) (written int, readErr, writeErr error) {
	if p.n == len(p.buf) {
		// One event larger than the whole buffer: pass on what there is.
		// The bytes stay exact; only the flush falls inside the event.
		k, err := dst.Write(p.buf[:p.n])
		p.n = 0
		if err != nil {
			return k, nil, err
		}
		written = k
	}
	m, readErr := src.Read(p.buf[p.n:])
	if m <= 0 {
		return written, readErr, nil
	}
	p.n += m
	end := 0
	for {
		k := openai.NextEvent(p.buf[end:p.n])
		if k < 0 {
			break
		}
		end += k
	}
	if end == 0 {
		return written, readErr, nil
	}
	k, err := dst.Write(p.buf[:end])
	written += k
	if err != nil {
		return written, readErr, err
	}
	p.n = copy(p.buf, p.buf[end:p.n])
	return written, readErr, nil
}
