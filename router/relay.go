package router

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/anthropic"
	"github.com/infera/infera/continuation"
	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/openai"
	"github.com/infera/infera/router/upstream"
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
// cookies, the client's Host) stay here. They are spelled as fasthttp's
// parser stores names (normalized), so that they are looked up and set as
// they are (PeekCanonical, SetCanonical): no request copies and normalizes
// them again.
var forwardHeaders = [...][]byte{[]byte("Authorization"), []byte("Accept"), []byte("User-Agent"), []byte("Openai-Organization"), []byte("Openai-Project")}

// The names of the headers the relay sets on every request, in fasthttp's
// normalized form (see forwardHeaders).
var (
	inferaWorkerKey     = []byte("X-Infera-Worker")
	cacheControlKey     = []byte("Cache-Control")
	noCache             = []byte("no-cache")
	dataParallelRankKey = []byte("X-Data-Parallel-Rank")
	traceparentKey      = []byte("Traceparent")
	tracestateKey       = []byte("Tracestate")
)

// relay is one client request being proxied, pooled. For a stream it is
// also the response body fasthttp writes: fasthttp calls WriteTo with its
// chunked writer, which flushes each write to the client socket, and calls
// Close when the response is done (or abandoned).
//
// A request owns its attempts (attempt.go): each is one leg on one worker,
// begun with begin and ended, whatever happened, by endAttempt. The
// relayed answer comes from att; while nothing of it has reached the
// client a failed att is replaced by a new one on another worker
// (failover: serial attempts). A route that needs two legs at once
// (prefill/decode) begins a second attempt of its own next to att.
//
// Files: relay.go the request (entry, failure answers, finish),
// attempt.go an attempt (pick, forward, end, failover), stream.go the
// streamed answer (pump, heartbeats, error event), dialect.go the route's
// API translation.
type relay struct {
	// relayRequest is what one request sets: reset clears it whole, in
	// one clear, and puts back the few buffers inside it (the attempt's
	// hint buffers and exchange, the watch's slot, the candidates' slice).
	relayRequest

	// The rest is the pooled relay's own, kept across its requests:
	// buffers (emptied by reset), methods bound once, the continuation
	// state (emptied after a stream), the upstream request and response.

	id     []byte    // request id (pooled backing array)
	reqBuf []byte    // the translated body's pooled buffer
	tried  []*Worker // workers already tried (pooled)
	// legs and handoff are a PD request's pooled buffers (pd.go): the
	// prefill leg's body and edits, the decode leg's, and a serial
	// prefill's hand-off. Each lives while its pair does; a later pair's
	// overwrites the ended pair's. Reset leaves legs as they are (each
	// part is written before it is read: clearing them would cost every
	// request ~2 KB of stores).
	legs    [2]pdScratch
	handoff []byte
	// pdWalk is the legs' walk of the client's body (pdLegs.walk), its
	// buffer pooled likewise; reset leaves it too (once a PD request set
	// scan.Walk to it, each Scan Resets and records it: servePD).
	pdWalk jsonx.Walk
	// scan: the client body's fields (openai.Scan); reset empties it and
	// keeps its scratch buffer (an escaped model name).
	scan openai.Request
	pump eventPump

	// xlate translates a stateful dialect's stream (Anthropic); xlateEvent
	// is its Event method value, bound once per pooled relay.
	xlate      anthropic.Stream
	xlateEvent func(dst, ev []byte) []byte

	// mig is a stream's continuation state (migrate.go); trackEvent its
	// Tracker as the pump's transform, bound once per pooled relay. It is
	// a pointer so that reset empties it in place: by value its ~1.5 KB
	// Tracker was copied twice per request.
	mig        *migration
	trackEvent func(dst, ev []byte) []byte

	// ureq and uresp are the relayed attempt's upstream request and
	// response, the relay's own (relayBlock): no pool's Get and Put a
	// request. urespOut: uresp is in use (attempt.exchange until
	// releaseResponse).
	ureq     *fasthttp.Request
	uresp    *fasthttp.Response
	urespOut bool
}

// relayRequest is the part of a relay one request sets (see relay).
type relayRequest struct {
	r        *Router
	ctx      *fasthttp.RequestCtx // the client request (valid until Close)
	route    Route
	dialect  *dialect
	start    time.Time
	deadline time.Time // start + RequestTimeout
	in       PickInput
	body     []byte      // the body the workers get (the client's, or the dialect's translation)
	model    *Candidates // all the model's candidates
	sub      Candidates  // the subset offered to the policy (pooled slice)
	attempts int
	lastErr  error      // why the last failed attempt failed
	lastWhy  failReason // its reason

	oreq   ownRequest // the request while it is sent, when it writes itself (ownrequest.go)
	direct DirectPick // the worker (or PD pair) an endpoint picker named (direct.go)

	watch  clientWatch // a unary request's client, while its answer is awaited (unary.go)
	att    attempt     // the attempt whose answer is relayed
	pd     *pdRequest  // a disaggregated request's prefill leg (pd.go); nil: none
	status int         // the status line the client got

	// While WriteTo runs: the client writer (heartbeats), the error of a
	// failed heartbeat, and when the client write deadline was last
	// pushed forward.
	w         io.Writer
	clientErr error
	wdlAt     time.Time
	// held: the client connection holds the stream's last writes for
	// its closing chunk (writehold.go), until Close; nil: none.
	held *frontConn
	// chunks: the client connection the relay writes its chunks into
	// (writeChunk) in place of fasthttp's chunked writer; nil: that one.
	chunks *frontConn

	// late: the response header whose request ids (and X-Infera-Worker:
	// lateWorker) are not set yet, the relay's head lines may carry them
	// (relayhead.go); nil: set. ownHead: the client connection holds the
	// stream's head for addHeadLines; headNow: it goes out at once then,
	// not with the first chunk.
	late       *fasthttp.ResponseHeader
	lateWorker *Worker
	ownHead    bool
	headNow    bool

	streaming bool // a stream's status line went out: only a stream may replace it
	firstByte bool // an event reached the client
	done      bool // the stream reached its end (or failed) in WriteTo/Read
	outcome   outcome
	err       error
	trace     reqTrace // tracing.go
}

// trackerLayouts lends the relays' continuation trackers their chunk
// layouts one stream at a time: a stream's first chunk finds a set that
// the last stream to end on its processor left in the cache, not its
// relay's own, last used 64 streams ago at 64 concurrent streams.
var trackerLayouts continuation.LayoutPool

// relayBlock is a pooled relay with the parts every request touches,
// allocated as one and kept across requests: the exchange, the upstream
// request and response, the continuation state. A request takes one
// object from a pool where it took three (the relay, fasthttp's request
// and response), each a Get and a Put (~200 instructions a request, issue
// 36, docs/performance.md). The block stays pooled, not a connection's:
// kept by a connection it was as cold at 64 connections as the pool's,
// and held ~40 KB an open connection.
type relayBlock struct {
	rel  relay
	x    upstream.Exchange
	mig  migration
	req  fasthttp.Request
	resp fasthttp.Response
}

var relayPool = sync.Pool{New: func() any {
	b := &relayBlock{}
	rel := &b.rel
	rel.id = make([]byte, 0, maxRequestIDBytes)
	rel.pump = eventPump{buf: make([]byte, relayBufSize)}
	rel.xlateEvent = rel.xlate.Event
	rel.mig = &b.mig
	rel.mig.track.Pool = &trackerLayouts
	rel.trackEvent = rel.trackedEvent
	rel.att.x = &b.x
	rel.ureq, rel.uresp = &b.req, &b.resp
	rel.watch.init()
	return rel
}}

func acquireRelay(r *Router, route Route) *relay {
	rel := relayPool.Get().(*relay)
	rel.r = r
	rel.route = route
	rel.dialect = r.dialects[route]
	rel.start = time.Now()
	rel.deadline = rel.start.Add(r.cfg.RequestTimeout)
	rel.att.rel = rel
	return rel
}

// now is the time now, read as the monotonic time since the request's
// start: one clock read, where time.Now reads two (wall and monotonic).
// Its wall reading follows the start's, which is what a duration or a
// comparison with another time of this process needs.
func (rel *relay) now() time.Time {
	return rel.start.Add(time.Since(rel.start))
}

// breakerNow is the circuit breakers' time now: wall, the request's
// clock read by the caller, unless the Config brought its own clock.
func (rel *relay) breakerNow(wall time.Time) time.Time {
	if rel.r.ownClock {
		return rel.r.cfg.Now()
	}
	return wall
}

func (rel *relay) reset() {
	if rel.scan.Stream {
		// Only a request that asked for a stream writes its migration
		// (startMigration, askIDs, the pump, a break: a streamed answer
		// needs scan.Stream): after a unary one it is as the last reset
		// left it, and its cache line stays untouched.
		rel.mig.empty()
	}
	// The relay's own part: buffers emptied in place; xlate is reset by
	// the stream that uses it (attach), mig above, ureq and uresp by
	// their exchange. A response still out (never released) stays out:
	// not handed again.
	dropWorkers(rel.tried)
	rel.id, rel.reqBuf, rel.tried, rel.handoff = rel.id[:0], rel.reqBuf[:0], rel.tried[:0], rel.handoff[:0]
	rel.scan.Reset()
	rel.pump.reset()
	// The request's part in one clear, in place (a literal with fields
	// would be built aside and copied), then its buffers put back.
	dropWorkers(rel.sub.Workers)
	cands, slot, peek := rel.sub.Workers[:0], rel.watch.slot, rel.watch.peek.fn
	hintBuf, hintTmp, x := rel.att.hintBuf[:0], rel.att.hintTmp[:0], rel.att.x
	rel.relayRequest = relayRequest{}
	rel.sub.Workers, rel.watch.slot, rel.watch.peek.fn = cands, slot, peek
	rel.att.hintBuf, rel.att.hintTmp, rel.att.x = hintBuf, hintTmp, x
}

// dropWorkers sets ws's (a request's few) workers to nil, so that a pooled
// buffer holds no removed worker. A counted loop: clear and the range
// idiom call memclrHasPointers, ~45 instructions for one or two pointers.
func dropWorkers(ws []*Worker) {
	for i := 0; i < len(ws); i++ {
		ws[i] = nil
	}
}

// proxy serves the generating routes (chat, completions, messages,
// embeddings, responses); id is the request's id (Router.serve), late: not
// yet set on the response (relayhead.go).
func (r *Router) proxy(ctx *fasthttp.RequestCtx, route Route, id []byte, late bool) {
	rel := acquireRelay(r, route)
	r.traceStart(rel, ctx) // tracing.go
	r.metrics.inflight.Add(1)
	rel.id = append(rel.id[:0], id...)
	werr := rel.dialect.writeError
	if late {
		rel.late = &ctx.Response.Header
	}

	if !ctx.IsPost() {
		rel.echoID()
		ctx.Response.Header.Set("Allow", "POST")
		werr(ctx, fasthttp.StatusMethodNotAllowed, "use POST for "+route.Path(), openai.TypeInvalidRequest, "method_not_allowed")
		r.finish(rel, outcomeMethodNotAllowed, fasthttp.StatusMethodNotAllowed)
		return
	}
	body := ctx.PostBody()
	var err error
	if rel.dialect.request != nil {
		rel.reqBuf, err = rel.dialect.request(rel.reqBuf[:0], body)
		body = rel.reqBuf
	}
	if err == nil {
		err = openai.Scan(body, &rel.scan)
	}
	if err != nil {
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
		werr(ctx, fasthttp.StatusBadRequest, "invalid request body: "+err.Error(), openai.TypeInvalidRequest, code)
		r.finish(rel, outcomeBadRequest, fasthttp.StatusBadRequest)
		return
	}
	if !rel.scan.Stream && !unaryHeadDirect {
		// A unary answer's head is fasthttp's (otherwise its lines are the
		// relay's, or echoID sets them where the answer is made: finish).
		rel.echoID()
	}
	if ceil := r.cfg.MaxTokensCeiling; ceil > 0 && rel.scan.MaxTokens > ceil {
		// Refused here: an engine may size buffers or loops by it (a
		// simulator that pre-generates, an overflowing context check), and
		// a retry would hand it to the next engine too.
		werr(ctx, fasthttp.StatusBadRequest, "max_tokens "+strconv.FormatInt(rel.scan.MaxTokens, 10)+
			" exceeds this router's ceiling of "+strconv.FormatInt(ceil, 10)+" tokens", openai.TypeInvalidRequest, "max_tokens_too_large")
		r.finish(rel, outcomeBadRequest, fasthttp.StatusBadRequest)
		return
	}
	v := r.view.Load()
	if v == nil {
		werr(ctx, fasthttp.StatusServiceUnavailable, "the fleet view is not loaded yet", openai.TypeUnavailable, "not_ready")
		r.finish(rel, outcomeNotReady, fasthttp.StatusServiceUnavailable)
		return
	}
	c := v.models[string(rel.scan.Model)]
	if c == nil {
		werr(ctx, fasthttp.StatusNotFound, "The model `"+clip(rel.scan.Model)+"` does not exist.", openai.TypeNotFound, "model_not_found")
		r.finish(rel, outcomeModelNotFound, fasthttp.StatusNotFound)
		return
	}
	if r.cfg.Direct {
		if rel.direct = pickDirect(&ctx.Request.Header, c); rel.direct.Refusal != "" {
			werr(ctx, fasthttp.StatusServiceUnavailable, rel.direct.Refusal, openai.TypeUnavailable, "no_worker_available")
			r.finish(rel, outcomeNoWorker, fasthttp.StatusServiceUnavailable)
			return
		}
	}
	rel.ctx, rel.body, rel.model = ctx, body, c
	rel.startMigration()
	if pd := c.disaggregated(); (pd && !rel.direct.Present) || rel.direct.Prefill != nil {
		rel.echoID() // the PD path's head is fasthttp's
		rel.servePD()
		return
	}
	if len(c.Workers) == 0 && !rel.direct.Present {
		werr(ctx, fasthttp.StatusServiceUnavailable, "no active worker serves model `"+c.Model+"`", openai.TypeUnavailable, "no_worker_available")
		r.finish(rel, outcomeNoWorker, fasthttp.StatusServiceUnavailable)
		return
	}
	if !rel.scan.Stream {
		rel.watch.start(ctx.Conn(), rel.att.x)
	}
	if ok, err := rel.failover(nil); !ok {
		rel.giveUp(err)
	}
}

// answer relays the worker's answer of the relayed attempt: a stream is
// attached (Close finishes the request), a unary answer is read and the
// request finished. It returns false and the read error when the unary
// answer could not be read; nothing has reached the client then.
func (rel *relay) answer(resp *fasthttp.Response) (bool, error) {
	ctx, a := rel.ctx, &rel.att
	rel.status = a.status
	ctx.SetStatusCode(rel.status)
	if ct := resp.Header.ContentType(); len(ct) > 0 {
		ctx.Response.Header.SetContentTypeBytes(ct)
	}
	if rel.status < 300 && isEventStream(resp.Header.ContentType()) && resp.BodyStream() != nil {
		rel.watch.stop(ctx)
		rel.streaming = true
		rel.attach(a, resp)
		if fc, ok := rel.clientConn(); ok && streamDirect && rel.late != nil {
			// The head's lines are the relay's (relayhead.go): fasthttp's
			// head is held for them, and goes out with them at once or
			// with the first chunk, as below.
			rel.late, rel.ownHead, rel.headNow = nil, true, a.x.Buffered() == 0
			fc.holdHead()
			ctx.Response.ImmediateHeaderFlush = true
			rel.chunks = fc
			ctx.SetBodyStream(rel, -1)
			return true, nil
		}
		rel.echoID()
		ctx.Response.Header.SetCanonical(cacheControlKey, noCache)
		// The headers leave with the first events (one write) when the
		// engine's first bytes are already here; otherwise at once, not
		// with the first token: the client knows its stream is on while
		// the engine computes, and heartbeats can start. Either way a
		// retry before the first event stays possible (the client has
		// seen no event).
		ctx.Response.ImmediateHeaderFlush = a.x.Buffered() == 0
		if fc, ok := rel.clientConn(); ok && streamDirect {
			// The relay writes the chunks into the connection
			// (writehold.go): the headers cannot wait in fasthttp's
			// writer, the connection holds them instead.
			if !ctx.Response.ImmediateHeaderFlush {
				fc.holdHead()
			}
			ctx.Response.ImmediateHeaderFlush = true
			rel.chunks = fc
		}
		ctx.SetBodyStream(rel, -1)
		return true, nil // Close finishes the request
	}
	// The answer's body, whole: in resp as fasthttp read it, or in ctx's
	// response once read through the exchange (which notes the end) or
	// translated by the dialect.
	body := resp
	if src := resp.BodyStream(); src != nil || rel.dialect.response != nil {
		if src != nil {
			src = a.x
		}
		if err := readUnary(ctx, resp, src, rel.pump.buf); err != nil {
			a.dropResponse(resp)
			// Nothing has been sent yet: the answer is only buffered.
			ctx.Response.ResetBody()
			return false, err
		}
		body = &ctx.Response
		if rel.dialect.response != nil {
			rel.dialect.response(ctx, rel)
		}
	}
	// A 200 answer of the mixed path's HTTP exchange (the relay's own
	// response: not a NATS leg's, not PD's, whose ids are set) has its
	// head lines written by the relay (relayhead.go); any other gets the
	// body in ctx's response, its buffer handed over.
	if !rel.ownUnaryHead(ctx, resp, body) && body == resp {
		_ = readUnary(ctx, resp, nil, nil)
	}
	a.dropResponse(resp)
	rel.watch.stop(ctx)
	rel.r.finish(rel, statusOutcome(rel.status), rel.status)
	return true, nil
}

var (
	errStatus5xx    = errors.New("worker answered 5xx")
	errStreamEnded  = errors.New("worker stream ended before its first event")
	errStreamCut    = errors.New("worker stream ended without its end marker")
	errNotEventFeed = errors.New("retried worker did not answer with an event stream")
)

// fail answers a request no worker could serve, before any byte was sent.
func (rel *relay) fail(err error) {
	r, ctx, werr := rel.r, rel.ctx, rel.dialect.writeError
	rel.echoID()
	if r.cfg.LogPrompts {
		r.log.Debug().Bytes("request_id", rel.id).Bytes("body", rel.body).Msg("failed request")
	}
	switch {
	case errors.Is(err, ErrSaturated):
		ctx.Response.Header.Set("Retry-After", itoa(retryAfterSeconds(r.cfg.QueueTimeout)))
		werr(ctx, fasthttp.StatusTooManyRequests, "every worker serving model `"+rel.model.Model+"` is at its in-flight limit; retry later", openai.TypeServer, "too_many_requests")
		r.metrics.rejected[rejected429].Inc()
		r.finish(rel, outcomeTooManyRequests, fasthttp.StatusTooManyRequests)
		return
	case errors.Is(err, errNoCandidate):
		werr(ctx, fasthttp.StatusServiceUnavailable, "no worker available for model `"+rel.model.Model+"`", openai.TypeUnavailable, "no_worker_available")
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
	werr(ctx, status, "request failed after "+itoa(rel.attempts)+" attempt(s): "+err.Error(), openai.TypeServer, code)
	rel.err = err
	r.finish(rel, outcomeUpstreamError, 0)
}

// clientLeft ends a unary request whose client went away while its answer
// was awaited: counted as a disconnect, the connection closed.
func (rel *relay) clientLeft() {
	rel.ctx.SetConnectionClose()
	rel.ctx.SetStatusCode(fasthttp.StatusBadRequest)
	rel.ctx.Response.ResetBody()
	rel.err = errClientLeft
	rel.r.finish(rel, outcomeClientGone, 0)
}

// retryAfterSeconds is the Retry-After hint of a 429: the queue timeout,
// at least a second.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}

// readUnary copies a complete (non-SSE) worker answer into the client
// response: resp's body, or read from src when resp streams it.
func readUnary(ctx *fasthttp.RequestCtx, resp *fasthttp.Response, src io.Reader, buf []byte) error {
	if src == nil {
		// Read whole by fasthttp (a unary request): hand its buffer over
		// instead of copying, and give resp the client's old one, at its
		// full length: fasthttp's body pool sizes what it keeps by the
		// length of what is put back, and a stream of emptied buffers
		// would have it drop every one (and allocate a buffer, then grow
		// it, for every answer).
		old := ctx.Response.SwapBody(resp.Body())
		resp.SwapBody(old[:cap(old)])
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

// finish records the end of a request: metrics, the end of its relayed
// attempt if still running; then the relay goes back to the pool.
func (r *Router) finish(rel *relay, o outcome, status int) {
	rel.echoID()     // (an answer fasthttp writes after the handler)
	end := rel.now() // the request's and its attempt's end: one clock read
	d := end.Sub(rel.start)
	m := r.metrics
	m.request(rel.route, o).Inc()
	m.observe(rel.route, o, status, d)
	m.inflight.Add(-1)
	if o == outcomeClientGone {
		m.disconnects.Inc()
	}
	if rel.pd != nil {
		rel.endPD()
	}
	r.noteUsage(rel, o) // the divergence alarm (kvdivergence.go)
	rel.endAttemptAt(&rel.att, status, rel.err, verdictOf(o, status), end)
	r.traceFinish(rel, o, status) // tracing.go
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

func isTimeout(err error) bool { return upstream.IsTimeout(err) }
