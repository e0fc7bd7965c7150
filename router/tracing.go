package router

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/tracing"
)

// OpenTelemetry traces (the tracing package). With
// Config.Tracer set, a proxied request is one trace:
//
//	POST /v1/chat/completions           the request, from arrival to its answer (server span;
//	│                                   a client's traceparent is its parent)
//	├── admission                       one per leg begun: candidates, queue wait, slot reserved
//	│   └── pick                        the policy's choice: policy, worker, predicted hit
//	├── leg                             one per attempt (client span): worker, role, transport,
//	│                                   status, failure; its context is the traceparent the
//	│                                   engine gets
//	└── pd.kv_handoff                   a disaggregated request: from the decode leg's request
//	                                    (with the prefill's hand-off when serial, beside the
//	                                    running prefill when concurrent) to the decode's first
//	                                    token (or its end): the KV transfer and first step
//
// The request path calls in with one line per place (marked
// "tracing.go"); with tracing off each call is a nil check, allocates nothing,
// and a client's traceparent and tracestate go upstream unchanged.

// reqTrace is a request's spans (in relay).
type reqTrace struct {
	span    tracing.Span // the request
	pickAt  time.Time    // when the current leg's policy pick started
	handoff tracing.Span // pd.kv_handoff while open
}

// now is the time a span boundary is taken at: zero (no clock read) when
// the request is not traced.
func (t *reqTrace) now() time.Time {
	if !t.span.On() {
		return time.Time{}
	}
	return time.Now()
}

// markPick notes the start of a policy pick.
func (t *reqTrace) markPick() {
	if t.span.On() {
		t.pickAt = time.Now()
	}
}

// traceStart starts the request's span (proxy, at the request's start).
func (r *Router) traceStart(rel *relay, ctx *fasthttp.RequestCtx) {
	if r.cfg.Tracer == nil {
		return
	}
	rel.trace.span = r.cfg.Tracer.StartRoot(&ctx.Request.Header, routeSpanNames[rel.route], rel.start)
}

// traceBegin ends the admission and pick spans of a leg begun at at (begin
// and beginLeg defer it) and, when a worker was picked, starts its leg span.
func (rel *relay) traceBegin(a *attempt, at time.Time) {
	t := rel.r.cfg.Tracer
	if t == nil || !rel.trace.span.On() {
		return
	}
	now := time.Now()
	adm := t.Start(rel.trace.span, "admission", at, false)
	w := a.ticket.Worker
	if w == nil || a.span.On() {
		// Nothing picked: no candidate, or every one full until the
		// queue timed out.
		adm.Bool("infera.admitted", false)
		adm.Fail("no worker admitted the request", nil)
		adm.End(now)
		rel.trace.pickAt = time.Time{}
		return
	}
	adm.Bool("infera.admitted", true)
	adm.Int("infera.candidates", int64(len(rel.sub.Workers)))
	pickAt := rel.trace.pickAt
	if pickAt.IsZero() {
		pickAt = at
	}
	rel.trace.pickAt = time.Time{}
	pick := t.Start(adm, "pick", pickAt, false)
	pick.String("infera.policy", rel.r.routePolicy(rel.route).Name())
	pick.String("infera.worker_id", w.id)
	if a.ticket.PinRank {
		pick.Int("infera.dp_rank", int64(a.ticket.DPRank))
	}
	if kt, ok := a.ticket.State.(*kvTicket); ok {
		pick.Int("infera.kv.prompt_blocks", int64(len(kt.hashes)))
		pick.Int("infera.kv.hit_blocks", int64(len(kt.hashes)-kt.miss))
		if kt.promptTokens > 0 {
			pick.Int("infera.kv.prompt_tokens", kt.promptTokens)
			pick.Int("infera.kv.predicted_cached_tokens", kt.predTokens)
		}
		if kt.target != nil {
			pick.Bool("infera.kv.precise", kt.target.precise())
		}
	}
	pick.End(now)
	adm.End(now)

	leg := t.Start(rel.trace.span, "leg", now, true)
	rec := w.Record()
	role := string(rec.DisaggMode)
	if role == "" {
		role = "mixed"
	}
	leg.String("infera.worker_id", w.id)
	leg.String("infera.leg.role", role)
	leg.String("infera.leg.transport", rec.RequestTransport)
	leg.String("infera.engine", rec.Engine)
	leg.String("server.address", w.url)
	leg.Int("infera.leg.attempt", int64(rel.attempts))
	if rel.firstByte {
		// A continuation leg (migrate.go): the how-manieth.
		leg.Int("infera.leg.continuation", int64(rel.mig.count+1))
	}
	a.span = leg
}

// traceInject puts the leg's trace context on its upstream request; with
// tracing off, the client's own (if any) passes through.
func (rel *relay) traceInject(a *attempt, h *fasthttp.RequestHeader) {
	if a.span.On() {
		t := rel.r.cfg.Tracer
		t.Inject(a.span, h)
		if pd := rel.pd; a == &rel.att && pd != nil && pd.proto != nil && !rel.trace.handoff.On() &&
			string(rel.ctx.Response.Header.Peek("X-Infera-PD")) == "disaggregated" {
			// The decode leg goes out: its KV comes from the prefill.
			ho := t.Start(rel.trace.span, "pd.kv_handoff", time.Now(), false)
			ho.String("infera.pd.protocol", pd.proto.name)
			ho.Bool("infera.pd.serial", pd.proto.topology == pdSerial)
			ho.String("infera.pd.decode_worker_id", a.ticket.Worker.id)
			if p := rel.ctx.Response.Header.Peek("X-Infera-Prefill-Worker"); len(p) > 0 {
				ho.String("infera.pd.prefill_worker_id", string(p))
			}
			rel.trace.handoff = ho
		}
		return
	}
	if rel.ctx == nil {
		return
	}
	if tp := rel.ctx.Request.Header.PeekCanonical(traceparentKey); len(tp) > 0 {
		h.SetCanonical(traceparentKey, tp)
		if ts := rel.ctx.Request.Header.PeekCanonical(tracestateKey); len(ts) > 0 {
			h.SetCanonical(tracestateKey, ts)
		}
	}
}

// traceEnd ends a leg's span (endAttempt, before the failure it noted is
// consumed); the decode leg's end closes pd.kv_handoff if still open.
func (rel *relay) traceEnd(a *attempt, status int, err error) {
	leg := a.span
	if !leg.On() {
		return
	}
	a.span = tracing.Span{}
	now := time.Now()
	if status > 0 {
		leg.Int("http.response.status_code", int64(status))
	}
	if rel.pd != nil && rel.pd.proto != nil {
		leg.String("infera.pd.protocol", rel.pd.proto.name)
	}
	switch {
	case a.failed:
		leg.String("infera.leg.failure", a.failWhy.String())
		leg.Fail(a.failWhy.String(), a.failErr)
	case err != nil:
		leg.Fail("", err)
	case status >= 500:
		leg.Fail("worker answered "+itoa(status), nil)
	}
	leg.End(now)
	if a == &rel.att {
		rel.endHandoff(now)
	}
}

// traceFirstByte notes the first event sent to the client (a stream).
func (rel *relay) traceFirstByte() {
	if !rel.trace.span.On() {
		return
	}
	now := time.Now()
	rel.trace.span.Event("first_token", now)
	rel.endHandoff(now)
}

func (rel *relay) endHandoff(at time.Time) {
	if rel.trace.handoff.On() {
		rel.trace.handoff.End(at)
		rel.trace.handoff = tracing.Span{}
	}
}

// traceFinish ends the request's span (finish, after its last leg ended).
func (r *Router) traceFinish(rel *relay, o outcome, status int) {
	s := rel.trace.span
	if !s.On() {
		return
	}
	now := time.Now()
	rel.endHandoff(now)
	if status == 0 {
		status = rel.ctx.Response.StatusCode()
	}
	s.String("http.route", rel.route.Path())
	s.Int("http.response.status_code", int64(status))
	s.String("infera.outcome", o.String())
	s.String("infera.request_id", string(rel.id))
	s.Int("infera.attempts", int64(rel.attempts))
	// The model by the fleet's name where the request found one: a stream
	// may finish after its connection read the next request (frontheld.go's
	// putOff), over the bytes rel.scan's spans point into.
	switch {
	case rel.model != nil:
		s.String("gen_ai.request.model", rel.model.Model)
	case len(rel.scan.Model) > 0:
		s.String("gen_ai.request.model", string(rel.scan.Model))
	}
	s.Bool("infera.stream", rel.scan.Stream)
	if rel.pd != nil {
		s.Bool("infera.pd", true)
	}
	if verdictOf(o, status) == verdictFault || o == outcomeNoWorker || o == outcomeTooManyRequests {
		s.Fail(o.String(), rel.err)
	}
	s.End(now)
	rel.trace = reqTrace{}
}

// routeSpanNames are the request spans' names, "POST /v1/...".
var routeSpanNames = func() (n [numRoutes]string) {
	for rt := range numRoutes {
		n[rt] = "POST " + rt.Path()
	}
	return n
}()
