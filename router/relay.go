package router

import (
	"bytes"
	"errors"
	"io"
	"net"
	"slices"
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
//
// A request runs as one or more attempts, each on its own worker, while
// nothing of the answer has reached the client (failover). Each attempt
// holds a policy ticket and an admission slot, released with the attempt's
// outcome (endAttempt), which also feeds the worker's circuit breaker.
type relay struct {
	r        *Router
	ctx      *fasthttp.RequestCtx // the client request (valid until Close)
	route    Route
	start    time.Time
	deadline time.Time // start + RequestTimeout
	scan     openai.Request
	in       PickInput
	id       []byte // request id (pooled backing array)
	body     []byte
	model    *Candidates // all the model's candidates
	sub      Candidates  // the subset offered to the policy (pooled slice)
	tried    []*Worker   // workers already tried (pooled)
	attempts int
	lastErr  error      // why the last failed attempt failed
	lastWhy  failReason // its reason

	ticket   Ticket
	probe    bool      // the ticket's worker admitted this request as its breaker probe
	attStart time.Time // the current attempt's start

	resp   *fasthttp.Response // upstream response while streaming
	src    io.Reader          // its body stream
	conn   *deadlineConn      // its connection, watched while streaming
	status int
	pump   eventPump

	// While WriteTo runs: the client writer (heartbeats), the error of a
	// failed heartbeat, and when the client write deadline was last
	// pushed forward.
	w         io.Writer
	clientErr error
	wdlAt     time.Time

	// readTimedOut: a watched read hit its deadline (fasthttp's chunk
	// parser reports that without wrapping the timeout error).
	readTimedOut bool

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
	rel.deadline = rel.start.Add(r.cfg.RequestTimeout)
	return rel
}

func (rel *relay) reset() {
	buf, id := rel.pump.buf, rel.id[:0]
	scratch := rel.scan
	clear(rel.tried)
	clear(rel.sub.Workers)
	tried, cands := rel.tried[:0], rel.sub.Workers[:0]
	*rel = relay{id: id, pump: eventPump{buf: buf}, tried: tried}
	rel.sub.Workers = cands
	// Keep the scanner's scratch buffer (an escaped model name) too.
	rel.scan = scratch
	rel.scan.Model = nil
}

// proxy serves POST /v1/chat/completions and /v1/completions.
func (r *Router) proxy(ctx *fasthttp.RequestCtx, route Route) {
	rel := acquireRelay(r, route)
	r.metrics.inflight.Inc()
	rel.id = r.setRequestID(ctx, rel.id[:0])

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
	rel.ctx, rel.body, rel.model = ctx, body, c

	for {
		resp, err := rel.connect(true)
		if resp == nil {
			rel.fail(err)
			return
		}
		w := rel.ticket.Worker
		rel.status = resp.StatusCode()
		ctx.SetStatusCode(rel.status)
		if ct := resp.Header.ContentType(); len(ct) > 0 {
			ctx.Response.Header.SetContentTypeBytes(ct)
		}
		if rel.status < 300 && isEventStream(resp.Header.ContentType()) && resp.BodyStream() != nil {
			rel.attach(resp)
			ctx.Response.Header.Set("Cache-Control", "no-cache")
			// The client sees the headers at once, not with the first
			// token: a retry before the first event stays possible (the
			// client has seen no event), and heartbeats can start.
			ctx.Response.ImmediateHeaderFlush = true
			ctx.SetBodyStream(rel, -1)
			return // Close finishes the request
		}
		err = readUnary(ctx, resp, rel.pump.buf)
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
		if err == nil {
			r.finish(rel, statusOutcome(rel.status), rel.status)
			return
		}
		// Nothing has been sent yet: the answer is only buffered.
		ctx.Response.ResetBody()
		why := rel.classify(err)
		r.noteFailure(w, why, err)
		rel.lastErr, rel.lastWhy = err, why
		rel.endAttempt(0, err, verdictFault)
		if !rel.canRetry() {
			rel.fail(err)
			return
		}
	}
}

// canRetry reports whether another attempt is allowed and some candidate
// is left to take it (else the last worker's own answer is worth more
// than a generic error).
func (rel *relay) canRetry() bool {
	if rel.attempts > rel.r.cfg.MaxRetries || !time.Now().Before(rel.deadline) {
		return false
	}
	if !rel.refreshModel() {
		return false
	}
	for _, w := range rel.model.Workers {
		if !slices.Contains(rel.tried, w) {
			return true
		}
	}
	return false
}

// refreshModel replaces the request's candidates with the current fleet
// view's: a retry or a queued request must not go to a worker that was
// removed or started draining since the request arrived. Workers keep their
// identity across views, so the tried list stays valid. It reports false
// when the model has no worker left at all.
func (rel *relay) refreshModel() bool {
	v := rel.r.view.Load()
	if v == nil {
		return true
	}
	c := v.models[rel.model.Model]
	if c == nil {
		return false
	}
	rel.model = c
	return true
}

// connect runs attempts until a worker answers with a status line the
// client may see: below 500, or a 5xx when no retry is left (relayed as
// is). It returns nil and the error that ended the last attempt when no
// worker answered: ErrSaturated, errNoCandidate, or the upstream failure
// (lastWhy says which). queue allows waiting for an admission slot.
func (rel *relay) connect(queue bool) (*fasthttp.Response, error) {
	r := rel.r
	for {
		if err := rel.acquire(queue && rel.attempts == 0); err != nil {
			if rel.attempts > 0 && rel.lastErr != nil {
				return nil, rel.lastErr // no worker left for a retry
			}
			return nil, err
		}
		if rel.attempts > 0 {
			r.metrics.retries[rel.lastWhy].Inc()
		}
		rel.attempts++
		w := rel.ticket.Worker
		resp, err := r.forward(rel, w)
		if err == nil && resp.StatusCode() < 500 {
			return resp, nil
		}
		status, why := 0, reasonStatus5xx
		if err != nil {
			why = rel.classify(err)
		} else {
			status = resp.StatusCode()
			err = errStatus5xx
		}
		r.noteFailure(w, why, err)
		rel.lastErr, rel.lastWhy = err, why
		if !rel.canRetry() {
			if resp != nil {
				return resp, nil // the worker's own 5xx, verdict at finish
			}
			rel.endAttempt(status, err, verdictFault)
			return nil, err
		}
		if resp != nil {
			_ = resp.CloseBodyStream()
			fasthttp.ReleaseResponse(resp)
		}
		rel.endAttempt(status, err, verdictFault)
	}
}

var (
	errStatus5xx    = errors.New("worker answered 5xx")
	errStreamEnded  = errors.New("worker stream ended before its first event")
	errNotEventFeed = errors.New("retried worker did not answer with an event stream")
)

// acquire picks a worker for the next attempt among the model's candidates
// not tried yet, skipping full workers and open breakers, and takes an
// admission slot on it. When every candidate is full and queue is set it
// waits for a free slot (woken by releases) up to QueueTimeout, then fails
// with ErrSaturated. When every free candidate's breaker is open it routes
// anyway: refusing everything would turn a fleet-wide blip into an outage.
func (rel *relay) acquire(queue bool) error {
	r := rel.r
	var (
		wake     <-chan struct{}
		timer    *time.Timer
		counted  bool
		deadline time.Time
	)
	defer func() {
		if counted {
			r.admit.waiting.Add(-1)
		}
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if !rel.refreshModel() {
			return errNoCandidate
		}
		c := rel.model
		now := r.cfg.Now()
		cands := rel.sub.Workers[:0]
		untried, open := 0, 0
		for _, w := range c.Workers {
			if slices.Contains(rel.tried, w) {
				continue
			}
			untried++
			if r.admit.saturated(w) {
				continue
			}
			if !w.breaker.available(now) {
				open++
				continue
			}
			cands = append(cands, w)
		}
		if len(cands) == 0 && open > 0 {
			for _, w := range c.Workers {
				if !slices.Contains(rel.tried, w) && !r.admit.saturated(w) {
					cands = append(cands, w)
				}
			}
		}
		rel.sub.Workers = cands
		if len(cands) > 0 {
			rel.sub.Model, rel.sub.cursor = c.Model, c.cursor
			rel.in = PickInput{Route: rel.route, Body: rel.body, Request: &rel.scan, RequestID: rel.id}
			t, err := r.policy.Pick(&rel.in, &rel.sub)
			rel.in = PickInput{}
			if err != nil || t.Worker == nil {
				return errNoCandidate
			}
			if !r.admit.reserve(t.Worker) {
				// Another request took the last slot since the scan.
				r.policy.Release(t, Result{})
				continue
			}
			rel.ticket, rel.attStart = t, time.Now()
			rel.probe = t.Worker.breaker.admit(now)
			rel.tried = append(rel.tried, t.Worker)
			t.Worker.picks.Inc()
			rel.ctx.Response.Header.Set("X-Infera-Worker", t.Worker.id)
			return nil
		}
		if untried == 0 || !queue {
			return errNoCandidate
		}
		// Every untried candidate is full: queue. Count this waiter before
		// the next scan, so that a slot freed after it wakes us.
		if !counted {
			counted = true
			r.admit.waiting.Add(1)
			deadline = rel.start.Add(r.cfg.QueueTimeout)
			if deadline.After(rel.deadline) {
				deadline = rel.deadline
			}
			wake = r.admit.waitChan()
			continue
		}
		left := time.Until(deadline)
		if left <= 0 {
			return ErrSaturated
		}
		if timer == nil {
			timer = time.NewTimer(left)
		}
		select {
		case <-wake:
			wake = r.admit.waitChan()
		case <-timer.C:
			return ErrSaturated
		}
	}
}

// endAttempt releases the current attempt: the policy's ticket, the
// admission slot, and the verdict for the worker's breaker.
func (rel *relay) endAttempt(status int, err error, v verdict) {
	t := rel.ticket
	w := t.Worker
	if w == nil {
		return
	}
	r := rel.r
	r.policy.Release(t, Result{Status: status, Err: err, Duration: time.Since(rel.start)})
	r.admit.release(w)
	switch w.breaker.record(v, rel.probe, r.cfg.Now(), &r.brk) {
	case breakerTripped:
		r.metrics.breakerTrips.WithLabelValues(w.id).Inc()
		r.log.Warn().Str("worker_id", w.id).Msg("worker circuit breaker opened")
	case breakerRecovered:
		r.log.Info().Str("worker_id", w.id).Msg("worker circuit breaker closed")
	}
	rel.ticket, rel.probe = Ticket{}, false
}

// noteFailure counts and logs one failed attempt.
func (r *Router) noteFailure(w *Worker, why failReason, err error) {
	r.metrics.failures[why].Inc()
	if k, ok := why.timeout(err); ok {
		r.metrics.timeouts[k].Inc()
	}
	r.log.Warn().Str("worker_id", w.id).Str("reason", why.String()).Err(err).Msg("worker attempt failed")
}

// classify names the failure of an attempt.
func (rel *relay) classify(err error) failReason {
	var op *net.OpError
	switch {
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return reasonBusy
	case errors.As(err, &op) && op.Op == "dial", errors.Is(err, fasthttp.ErrDialTimeout):
		return reasonConnect
	case errors.Is(err, fasthttp.ErrTimeout) || isTimeout(err) || rel.readTimedOut:
		switch {
		case !time.Now().Before(rel.deadline):
			return reasonRequestTimeout
		case rel.firstByte:
			return reasonIdleTimeout
		}
		return reasonTTFTTimeout
	}
	return reasonUpstreamError
}

// fail answers a request no worker could serve, before any byte was sent.
func (rel *relay) fail(err error) {
	r, ctx := rel.r, rel.ctx
	if r.cfg.LogPrompts {
		r.log.Debug().Bytes("request_id", rel.id).Bytes("body", rel.body).Msg("failed request")
	}
	switch {
	case errors.Is(err, ErrSaturated):
		ctx.Response.Header.Set("Retry-After", itoa(retryAfterSeconds(r.cfg.QueueTimeout)))
		writeError(ctx, fasthttp.StatusTooManyRequests, "every worker serving model `"+rel.model.Model+"` is at its in-flight limit; retry later", openai.TypeServer, "too_many_requests")
		r.metrics.rejected[rejected429].Inc()
		r.finish(rel, outcomeTooManyRequests, fasthttp.StatusTooManyRequests)
		return
	case errors.Is(err, errNoCandidate):
		writeError(ctx, fasthttp.StatusServiceUnavailable, "no worker available for model `"+rel.model.Model+"`", openai.TypeUnavailable, "no_worker_available")
		r.finish(rel, outcomeNoWorker, fasthttp.StatusServiceUnavailable)
		return
	}
	status, code := fasthttp.StatusBadGateway, "upstream_error"
	switch rel.lastWhy {
	case reasonTTFTTimeout, reasonRequestTimeout:
		status, code = fasthttp.StatusGatewayTimeout, "upstream_timeout"
	case reasonBusy:
		code = "upstream_busy"
	}
	writeError(ctx, status, "request failed after "+itoa(rel.attempts)+" attempt(s): "+err.Error(), openai.TypeServer, code)
	rel.err = err
	r.finish(rel, outcomeUpstreamError, 0)
}

// retryAfterSeconds is the Retry-After hint of a 429: the queue timeout,
// at least a second.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}

// forward sends the request to w and returns its response once the status
// line and headers are in; the body is still to be read (streamed). The
// attempt's deadline caps it: the first-byte timeout (for a unary request
// that is its whole answer) and the request's own.
func (r *Router) forward(rel *relay, w *Worker) (*fasthttp.Response, error) {
	ctx := rel.ctx
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
		// With router API keys the client's Authorization is the router's
		// secret, not the engine's: it stays here.
		if h == "Authorization" && r.keys.enabled() {
			continue
		}
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
	req.SetBodyRaw(rel.body)

	deadline := rel.attStart.Add(r.cfg.TTFTTimeout)
	if rel.deadline.Before(deadline) {
		deadline = rel.deadline
	}
	resp := fasthttp.AcquireResponse()
	if err := w.client.DoDeadline(req, resp, deadline); err != nil {
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

// finish records the end of a request: metrics, the last attempt's
// release; then the relay goes back to the pool.
func (r *Router) finish(rel *relay, o outcome, status int) {
	d := time.Since(rel.start)
	m := r.metrics
	m.request(rel.route, o).Inc()
	m.observe(rel.route, o, status, d)
	m.inflight.Dec()
	if o == outcomeClientGone {
		m.disconnects.Inc()
	}
	if rel.ticket.Worker != nil {
		rel.endAttempt(status, rel.err, verdictOf(o, status))
	}
	rel.reset()
	relayPool.Put(rel)
}

// verdictOf turns a request's outcome into its last worker's verdict.
func verdictOf(o outcome, status int) verdict {
	switch o {
	case outcomeOK:
		return verdictSuccess
	case outcomeUpstreamStatus:
		if status >= 500 {
			return verdictFault
		}
	case outcomeUpstreamError, outcomeStreamError:
		return verdictFault
	}
	return verdictNeutral
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

// attach makes resp the stream being relayed and watches its connection
// (stream deadlines and heartbeats, see deadlineConn).
func (rel *relay) attach(resp *fasthttp.Response) {
	rel.resp, rel.src = resp, resp.BodyStream()
	if c := rel.r.conns.lookup(resp.LocalAddr()); c != nil {
		rel.conn = c
		c.watch.Store(rel)
	}
}

// readDeadline is the hard deadline of the next upstream read of a
// stream: the first-byte deadline of the attempt until the first event
// went out, then the idle timeout from now; never past the request's.
func (rel *relay) readDeadline(now time.Time) time.Time {
	var dl time.Time
	if rel.firstByte {
		dl = now.Add(rel.r.cfg.StreamIdleTimeout)
	} else {
		dl = rel.attStart.Add(rel.r.cfg.TTFTTimeout)
	}
	if rel.deadline.Before(dl) {
		return rel.deadline
	}
	return dl
}

// heartbeat is an SSE comment: clients ignore it, and writing it is how a
// silent stream learns that its client is gone.
var heartbeat = []byte(": keep-alive\n\n")

// heartbeat writes one SSE comment to the client, between events (never
// inside one). A failed write is remembered: WriteTo ends the stream.
func (rel *relay) heartbeat() error {
	if rel.w == nil || rel.pump.midEvent {
		return nil
	}
	if _, err := rel.w.Write(heartbeat); err != nil {
		rel.clientErr = err
		return err
	}
	return nil
}

// keepWriting pushes the client connection's write deadline forward while a
// stream runs, so that ClientWriteTimeout bounds one stalled write rather
// than the whole stream. It runs at most every quarter of the timeout.
func (rel *relay) keepWriting(now time.Time) {
	d := rel.r.cfg.ClientWriteTimeout
	if rel.ctx == nil || now.Sub(rel.wdlAt) < d/4 {
		return
	}
	rel.wdlAt = now
	if c := rel.ctx.Conn(); c != nil {
		_ = c.SetWriteDeadline(now.Add(d))
	}
}

// The relay as fasthttp's response body stream.

// SupportsBodyWriteTo lets fasthttp hand WriteTo its chunked writer instead
// of copying through Read.
func (rel *relay) SupportsBodyWriteTo() bool { return true }

// WriteTo relays the upstream SSE stream to w event by event (see
// eventPump). A failed write (or heartbeat) means the client is gone: the
// upstream body is closed at once, which closes the worker connection so
// that the engine stops generating. A worker that fails before the first
// event reached the client — the stream ends, breaks or times out — is
// replaced by another (retryStream): the client has only seen headers and
// heartbeat comments. After the first event a failure ends the stream with
// one SSE error event, since the status line went out long ago.
func (rel *relay) WriteTo(w io.Writer) (int64, error) {
	rel.done = true // every return below ends the stream and sets the outcome
	rel.w = w
	defer func() { rel.w = nil }()
	var total int64
	for {
		n, rerr, werr := rel.pump.step(w, rel.src)
		total += int64(n)
		if n > 0 && !rel.firstByte {
			rel.firstByte = true
			rel.r.metrics.ttft[rel.route].Observe(time.Since(rel.start).Seconds())
		}
		if werr == nil && rel.clientErr != nil {
			werr = rel.clientErr
		}
		if werr != nil {
			rel.outcome, rel.err = outcomeClientGone, werr
			rel.closeUpstream()
			return total, werr
		}
		if rerr == nil {
			continue
		}
		if rerr == io.EOF && (rel.firstByte || rel.pump.n > 0) {
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
		why := reasonStreamEnded
		if rerr == io.EOF {
			rerr = errStreamEnded
		} else {
			why = rel.classify(rerr)
		}
		if rel.firstByte && why == reasonUpstreamError {
			why = reasonStreamError
		}
		rel.r.noteFailure(rel.ticket.Worker, why, rerr)
		rel.lastErr, rel.lastWhy = rerr, why
		if !rel.firstByte && rel.retryStream() {
			continue
		}
		rel.outcome, rel.err = outcomeStreamError, rel.lastErr
		rel.closeUpstream()
		k, err := w.Write(rel.errorEvent())
		total += int64(k)
		return total, err
	}
}

// errorEvent renders the SSE error event that ends a failed stream, into
// the pump's buffer (the incomplete event there is dropped: half a JSON
// chunk helps no one).
func (rel *relay) errorEvent() []byte {
	rel.pump.n = 0
	code, msg := "upstream_stream_error", "worker failed mid-stream: "
	switch {
	case rel.lastWhy == reasonTTFTTimeout || rel.lastWhy == reasonIdleTimeout || rel.lastWhy == reasonRequestTimeout:
		code, msg = "upstream_timeout", "worker timed out: "
	case !rel.firstByte:
		code, msg = "upstream_error", "no worker produced the stream: "
	}
	ev := append(rel.pump.buf[:0], "data: "...)
	ev = openai.AppendError(ev, msg+rel.lastErr.Error(), openai.TypeServer, code)
	return append(ev, "\n\n"...)
}

// retryStream replaces the failed upstream of a stream that has sent no
// event yet by another worker's stream. It returns false when no retry is
// left or no worker answered with an event stream.
func (rel *relay) retryStream() bool {
	r := rel.r
	rel.closeUpstream()
	rel.pump.n, rel.pump.midEvent = 0, false
	rel.endAttempt(rel.status, rel.lastErr, verdictFault)
	for rel.canRetry() {
		if rel.acquire(false) != nil {
			return false
		}
		rel.readTimedOut = false
		r.metrics.retries[rel.lastWhy].Inc()
		rel.attempts++
		w := rel.ticket.Worker
		resp, err := r.forward(rel, w)
		if err == nil && resp.StatusCode() < 300 && isEventStream(resp.Header.ContentType()) && resp.BodyStream() != nil {
			rel.status = resp.StatusCode()
			rel.attach(resp)
			return true
		}
		status, why, v := 0, reasonUpstreamError, verdictFault
		switch {
		case err != nil:
			why = rel.classify(err)
		default:
			status = resp.StatusCode()
			err = errNotEventFeed
			if status >= 500 {
				why, err = reasonStatus5xx, errStatus5xx
			} else if status >= 400 {
				v = verdictNeutral
			}
			_ = resp.CloseBodyStream()
			fasthttp.ReleaseResponse(resp)
		}
		r.noteFailure(w, why, err)
		rel.lastErr, rel.lastWhy = err, why
		rel.endAttempt(status, err, v)
	}
	return false
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
// is gone (or that its attempt timed out).
func (rel *relay) closeUpstream() {
	if rel.conn != nil {
		// Before the connection can go back to the pool.
		rel.conn.watch.Store(nil)
		rel.conn = nil
	}
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
	// midEvent: part of an oversized event went out, the rest has not;
	// nothing else (a heartbeat) may be written in between.
	midEvent bool
}

// step does one read and the write it enables. It returns the bytes
// written, the read error (io.EOF at the end) and the write error.
func (p *eventPump) step(dst io.Writer, src io.Reader) (written int, readErr, writeErr error) {
	if p.n == len(p.buf) {
		// One event larger than the whole buffer: pass on what there is.
		// The bytes stay exact; only the flush falls inside the event.
		k, err := dst.Write(p.buf[:p.n])
		p.n = 0
		p.midEvent = true
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
	p.midEvent = false
	written += k
	if err != nil {
		return written, readErr, err
	}
	p.n = copy(p.buf, p.buf[end:p.n])
	return written, readErr, nil
}
