package router

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/openai"
	"github.com/infera/infera/router/upstream"
)

// Prefill/decode disaggregation (DESIGN §6, issue 14).
//
// A model with active prefill and decode workers is served by pairs: the
// request's relayed attempt (rel.att) is the decode leg, and pdRequest.pre
// the prefill leg, each begun on its own pool (beginLeg) and ended by
// endAttempt like any attempt. A model with only one of the pools and no
// mixed worker is refused with 503 naming the missing pool; with mixed
// workers too, those serve it as a mixed model. A complete pair always
// wins over mixed workers.
//
// Each leg exchanges its request on a connection of its worker's pool that
// it holds (upstream.Exchange), so that a leg can be aborted at any moment
// — while its request is being sent, while its engine computes, while its
// answer streams — by closing that connection: this is how a failed
// prefill cancels the decode that waits for its KV, and how a client that
// leaves cancels both legs. A whole answer gives the connection back to
// the pool; so does a streamed decode read to its end. Every wait has a
// deadline: the prefill leg
// --pd-prefill-timeout, the decode leg --ttft-timeout then
// --stream-idle-timeout, both the request's --request-timeout.
//
// Failover: while nothing reached the client, a failed pair is replaced
// by another (up to Config.MaxRetries); the side that failed is not
// tried again, the other may be. A stream that has sent its status line
// is not replaced: a later failure is an in-stream error event.

// pdRequest is the PD state of one request.
type pdRequest struct {
	proto *pdProtocol
	legs  pdLegs
	pre   attempt // the prefill leg; the decode leg is rel.att
	// A concurrent protocol's prefill runs on its own goroutine, which
	// sends its result on preDone; preRunning says one is in flight.
	preDone    chan pdResult
	preRunning bool
	// preFailed is the failure of a concurrent prefill, set before it
	// aborts the decode leg (read by the stream's error event).
	preFailed atomic.Pointer[pdResult]
}

// pdResult is how a prefill leg ended.
type pdResult struct {
	status int
	err    error
	why    string // metrics label of the failure
}

// disaggregated reports whether the model is served through the PD path:
// it has prefill or decode workers and, unless both pools are there, no
// mixed worker to serve it instead.
func (c *Candidates) disaggregated() bool {
	if len(c.Prefill) == 0 && len(c.Decode) == 0 {
		return false
	}
	return len(c.Workers) == 0 || (len(c.Prefill) > 0 && len(c.Decode) > 0)
}

// servePD serves a request of a disaggregated model (rel.ctx, rel.body
// and rel.model are set).
func (rel *relay) servePD() {
	r, ctx, c := rel.r, rel.ctx, rel.model
	if len(c.Prefill) == 0 || len(c.Decode) == 0 {
		missing, have := "decode", "prefill"
		if len(c.Prefill) == 0 {
			missing, have = "prefill", "decode"
		}
		r.metrics.pd.errors.WithLabelValues("no_" + missing + "_worker").Inc()
		rel.dialect.writeError(ctx, fasthttp.StatusServiceUnavailable,
			"model `"+c.Model+"` is disaggregated: it has active "+have+" workers but no active "+missing+" worker (the "+missing+" pool is empty)",
			openai.TypeUnavailable, "no_"+missing+"_worker")
		r.finish(rel, outcomeNoWorker, fasthttp.StatusServiceUnavailable)
		return
	}
	if rel.scan.Walk == nil {
		// From the next request on, this pooled relay's Scan records the
		// client body's top-level walk for the legs' edits (jsonx.Walk),
		// which then splice from it instead of walking the body again
		// (the prefill edit ~2,200 instructions cheaper a unary PD
		// request: docs/performance.md, session 25); a relay that never
		// served PD never records. This request's Scan recorded nothing:
		// its prefill edit records the walk, as before. The walk is Reset
		// here, and by each Scan after, so none outlives its body.
		rel.pdWalk.Reset()
		rel.scan.Walk = &rel.pdWalk
	}
	rel.pd = &pdRequest{preDone: make(chan pdResult, 1), pre: attempt{x: new(upstream.Exchange)}}
	if !rel.scan.Stream {
		// A unary answer writes nothing until it is complete: a client
		// that leaves is noticed by the watch, which aborts both legs.
		rel.watch.start(rel.ctx.Conn(), rel.att.x, rel.pd.pre.x)
	}
	if ok, err := rel.failover(nil); !ok {
		rel.giveUp(err)
	}
}

// forget lets a later pair use w again (the other side of the pair
// failed, not w).
func (rel *relay) forget(w *Worker) {
	if i := slices.Index(rel.tried, w); i >= 0 {
		rel.tried = slices.Delete(rel.tried, i, i+1)
	}
}

// pdTry runs one pair. It returns true when the client's answer is
// settled (written, or streaming), else the error that ended the pair;
// both legs have ended then.
func (rel *relay) pdTry() (bool, error) {
	r, pd := rel.r, rel.pd
	if err := rel.beginLeg(&pd.pre, true); err != nil {
		return false, err
	}
	if err := rel.beginLeg(&rel.att, false); err != nil {
		rel.endAttempt(&pd.pre, 0, nil, verdictNeutral)
		return false, err
	}
	rel.countAttempt()
	rel.beginExchange(&pd.pre)
	rel.beginExchange(&rel.att)
	p, d := pd.pre.ticket.Worker, rel.att.ticket.Worker
	proto, err := resolvePDProtocol(p, d)
	if err != nil {
		rel.endLegs(verdictNeutral)
		return false, err
	}
	pd.proto = proto
	if err := rel.pdOverNATS(); err != nil { // natsleg.go
		rel.endLegs(verdictNeutral)
		return false, err
	}

	if n := r.cfg.PDMinUncachedTokens; n > 0 {
		if unc, ok := uncachedTokens(pd.pre.ticket); ok && unc < n {
			// Short: a remote prefill costs more than it saves.
			rel.endAttempt(&pd.pre, 0, nil, verdictNeutral)
			rel.forget(p)
			rel.ctx.Response.Header.Del("X-Infera-Prefill-Worker")
			rel.ctx.Response.Header.Set("X-Infera-PD", "decode-only")
			r.metrics.pd.requests.WithLabelValues(proto.name, "decode_only").Inc()
			rel.att.body = nil
			pd.legs = pdLegs{}
			return rel.pdDecode()
		}
	}
	rel.ctx.Response.Header.SetCanonical(inferaPDKey, pdDisaggregated)
	r.metrics.pd.disaggregated(proto)
	if err := rel.shapeLegs(); err != nil {
		rel.endLegs(verdictNeutral)
		return false, err
	}
	pd.legs.out = &rel.legs[0]
	pbody, err := proto.prefillBody(&pd.legs)
	if err != nil {
		rel.endLegs(verdictNeutral)
		return false, err
	}
	pd.pre.body = pbody
	if proto.topology == pdSerial {
		return rel.pdSerial()
	}
	pd.legs.out = &rel.legs[1]
	dbody, err := proto.decodeBody(&pd.legs, nil)
	if err != nil {
		rel.endLegs(verdictNeutral)
		return false, err
	}
	rel.att.body = rel.askIDs(&rel.att, dbody) // migrate.go: a broken decode stream continues exactly
	req := rel.upstreamRequest(&pd.pre)
	pd.legs.setRequestID(req)
	pd.preRunning = true
	go pd.runPrefill(p, req, rel.prefillDeadline(), rel.att.x)
	return rel.pdDecode()
}

// shapeLegs fills pd.legs for the picked pair: the room, aligned to the
// prefill's DP rank (pinned with X-Data-Parallel-Rank when the prefill
// worker multiplexes ranks).
func (rel *relay) shapeLegs() error {
	pd := rel.pd
	prec := pd.pre.ticket.Worker.Record()
	l := pdLegs{body: rel.body, prefill: prec, decode: rel.att.ticket.Worker.Record(), prefillDPSize: prec.EffectiveDPSize()}
	if rel.route.generates() {
		// Each leg's body gets its worker's cache hints, as the mixed
		// path gives them (upstreamRequest), in the protocol's pass.
		l.hints = &rel.scan
	}
	l.prefillHost, _, _ = net.SplitHostPort(pd.pre.ticket.Worker.addr)
	l.decodeHost, _, _ = net.SplitHostPort(rel.att.ticket.Worker.addr)
	room := rand.Uint64() >> 1 // [0, 2^63)
	switch t := &pd.pre.ticket; {
	case t.PinRank:
		l.prefillDPRank = t.DPRank
	case prec.DPRank != nil:
		l.prefillDPRank = *prec.DPRank
	case l.prefillDPSize > 1:
		l.prefillDPRank = int(room % uint64(l.prefillDPSize))
		t.PinRank, t.DPRank = true, l.prefillDPRank
	}
	if prec.DPRank == nil {
		l.room = alignRoom(room, l.prefillDPRank, l.prefillDPSize)
	} else {
		l.room = alignRoom(room, *prec.DPRank, max(l.prefillDPSize, *prec.DPRank+1))
	}
	// The client body's walk (see servePD): Scan's, or the first pair's
	// prefill edit records it; every pair of the request splices from it.
	l.walk = &rel.pdWalk
	pd.legs = l
	if pd.proto.prepare != nil {
		return pd.proto.prepare(&pd.legs)
	}
	return nil
}

// setRequestID gives req the legs' forged X-Request-Id, if any.
func (l *pdLegs) setRequestID(req *fasthttp.Request) {
	if l.requestID != "" {
		req.Header.Set("X-Request-Id", l.requestID)
	}
}

// sendLeg sends PD leg a's request (its body shaped, a.body) from the
// request's goroutine and returns its answer, as exchange does (no owner):
// written by the relay into the worker connection (ownLeg) unless it goes
// over NATS or is traced.
func (rel *relay) sendLeg(a *attempt, deadline time.Time, stream bool) (*fasthttp.Response, error) {
	if !rel.writesLeg(a) {
		req := rel.upstreamRequest(a)
		rel.pd.legs.setRequestID(req)
		defer fasthttp.ReleaseRequest(req)
		return a.exchange(req, deadline, stream, nil)
	}
	resp := a.acquireResponse()
	resp.StreamBody = stream
	if err := a.x.DoWriter(a.ticket.Worker.pool, rel.ownLeg(a), resp, deadline, nil); err != nil {
		rel.releaseResponse(resp)
		return nil, err
	}
	return resp, nil
}

// prefillDeadline is the prefill leg's: --pd-prefill-timeout from now,
// never past the request's.
func (rel *relay) prefillDeadline() time.Time {
	dl := time.Now().Add(rel.r.cfg.PDPrefillTimeout)
	if rel.deadline.Before(dl) {
		return rel.deadline
	}
	return dl
}

// pdSerial runs a serial protocol's prefill, then its decode with the
// hand-off.
func (rel *relay) pdSerial() (bool, error) {
	r, pd := rel.r, rel.pd
	p, d := pd.pre.ticket.Worker, rel.att.ticket.Worker
	resp, err := rel.sendLeg(&pd.pre, rel.prefillDeadline(), false)
	if err != nil {
		res := prefillError(p, err)
		rel.endPrefill(res)
		rel.endAttempt(&rel.att, 0, nil, verdictNeutral)
		rel.forget(d)
		return false, res.err
	}
	status := resp.StatusCode()
	if status >= 400 && status < 500 {
		// The request's own fault: the client gets the engine's answer.
		rel.endPrefill(pdResult{status: status, why: "status_4xx"})
		rel.endAttempt(&rel.att, 0, nil, verdictNeutral)
		rel.watch.stop(rel.ctx)
		rel.status = status
		rel.ctx.SetStatusCode(status)
		if ct := resp.Header.ContentType(); len(ct) > 0 {
			rel.ctx.Response.Header.SetContentTypeBytes(ct)
		}
		rel.ctx.Response.SetBody(resp.Body())
		fasthttp.ReleaseResponse(resp)
		r.finish(rel, outcomeUpstreamStatus, status)
		return true, nil
	}
	var handoff []byte
	if status < 300 {
		if v := topLevelField(resp.Body(), "kv_transfer_params"); len(v) > 0 && v[0] == '{' {
			rel.handoff = append(rel.handoff[:0], v...)
			handoff = rel.handoff
		}
	}
	var res pdResult
	switch {
	case status >= 300:
		res = pdResult{status: status, why: "status_5xx", err: fmt.Errorf("prefill worker %s answered %d: %s", p.id, status, clip(resp.Body()))}
	case handoff == nil:
		res = pdResult{status: status, why: "no_handoff", err: fmt.Errorf("%w (prefill worker %s, protocol %s needs it for the decode leg)", ErrPDHandoff, p.id, pd.proto.name)}
	}
	fasthttp.ReleaseResponse(resp)
	rel.endPrefill(res)
	if res.err != nil {
		rel.endAttempt(&rel.att, 0, nil, verdictNeutral)
		rel.forget(d)
		return false, res.err
	}
	pd.legs.handoffValid = true // topLevelField validated it
	pd.legs.out = &rel.legs[1]
	dbody, err := pd.proto.decodeBody(&pd.legs, handoff)
	if err != nil {
		rel.endAttempt(&rel.att, 0, nil, verdictNeutral)
		return false, err
	}
	rel.att.body = rel.askIDs(&rel.att, dbody) // migrate.go: a broken decode stream continues exactly
	rel.att.start = time.Now()                 // its first-byte deadline starts now
	return rel.pdDecode()
}

// prefillError names a prefill leg's failure.
func prefillError(p *Worker, err error) pdResult {
	why := "upstream_error"
	switch {
	case errors.Is(err, upstream.ErrAborted):
		why = "aborted"
	case errors.Is(err, fasthttp.ErrTimeout) || isTimeout(err):
		why = "timeout"
	case isDialError(err):
		why = "connect"
	}
	if why == "timeout" {
		err = fmt.Errorf("prefill worker %s did not answer within --pd-prefill-timeout: %w", p.id, err)
	} else {
		err = fmt.Errorf("prefill worker %s: %w", p.id, err)
	}
	return pdResult{err: err, why: why}
}

func isDialError(err error) bool {
	var op *net.OpError
	return (errors.As(err, &op) && op.Op == "dial") || errors.Is(err, fasthttp.ErrDialTimeout)
}

// runPrefill is a concurrent protocol's prefill leg, on its own
// goroutine: it sends req, drains the answer and reports on preDone. A
// failure aborts the decode leg (dec), which would wait for KV that never
// comes.
func (pd *pdRequest) runPrefill(w *Worker, req *fasthttp.Request, deadline time.Time, dec *upstream.Exchange) {
	resp, err := pd.pre.exchange(req, deadline, false, nil)
	fasthttp.ReleaseRequest(req)
	var res pdResult
	if err != nil {
		res = prefillError(w, err)
	} else {
		res.status = resp.StatusCode()
		if res.status >= 300 {
			res.why = "status_5xx"
			if res.status < 500 {
				res.why = "status_4xx"
			}
			res.err = fmt.Errorf("prefill worker %s answered %d: %s", w.id, res.status, clip(resp.Body()))
		}
		fasthttp.ReleaseResponse(resp)
	}
	if res.err != nil && res.why != "aborted" {
		pd.preFailed.Store(&res)
		dec.Abort()
	}
	pd.preDone <- res
}

// waitPrefill collects a concurrent prefill's result (aborting it first
// when abort is set) and ends its attempt. It returns the result.
func (rel *relay) waitPrefill(abort bool) pdResult {
	pd := rel.pd
	if !pd.preRunning {
		return pdResult{}
	}
	if abort {
		pd.pre.x.Abort()
	}
	res := <-pd.preDone
	pd.preRunning = false
	rel.endPrefill(res)
	return res
}

// prefillVerdictGrace is how long a failed decode leg waits for its
// concurrent prefill's own result before aborting it. A prefill engine that
// dies takes the decode's KV transfer down with it, and the two failures
// race to the router (the decode may answer "kv transfer failed" before
// the prefill's connection reset is read): the prefill's failure is the
// cause, so it is the one the client, the breaker and the metrics should
// see. A prefill that is alive and slow costs a failed request this much
// more time, on an error path only.
const prefillVerdictGrace = time.Second

// waitPrefillAfterDecodeFailure is waitPrefill(true) after the decode leg
// failed, giving the prefill prefillVerdictGrace to report first.
func (rel *relay) waitPrefillAfterDecodeFailure() pdResult {
	pd := rel.pd
	if !pd.preRunning {
		return pdResult{}
	}
	t := time.NewTimer(prefillVerdictGrace)
	defer t.Stop()
	select {
	case res := <-pd.preDone:
		pd.preRunning = false
		rel.endPrefill(res)
		return res
	case <-t.C:
		return rel.waitPrefill(true)
	}
}

// endPrefill ends the prefill attempt with its result (metrics too).
func (rel *relay) endPrefill(res pdResult) {
	pd := rel.pd
	if pd.pre.ticket.Worker == nil {
		return
	}
	m := rel.r.metrics.pd
	switch {
	case res.err == nil:
		m.prefillOK(pd.proto)
		rel.endAttempt(&pd.pre, res.status, nil, verdictSuccess)
	case res.why == "aborted" || res.why == "status_4xx":
		m.legs.WithLabelValues("prefill", pd.proto.name, res.why).Inc()
		rel.endAttempt(&pd.pre, res.status, res.err, verdictNeutral)
	default:
		m.legs.WithLabelValues("prefill", pd.proto.name, res.why).Inc()
		why := reasonUpstreamError
		switch res.why {
		case "timeout":
			why = reasonTTFTTimeout
		case "connect":
			why = reasonConnect
		case "status_5xx":
			why = reasonStatus5xx
		}
		pd.pre.fail(why, res.err)
		rel.endAttempt(&pd.pre, res.status, res.err, verdictFault)
	}
}

// endLegs ends both legs before anything was sent.
func (rel *relay) endLegs(v verdict) {
	rel.endAttempt(&rel.pd.pre, 0, nil, v)
	rel.endAttempt(&rel.att, 0, nil, v)
}

// pdDecode sends the decode leg (rel.att, its body set) and answers the
// client with it.
func (rel *relay) pdDecode() (bool, error) {
	r, pd, a := rel.r, rel.pd, &rel.att
	d := a.ticket.Worker
	deadline := a.start.Add(r.cfg.TTFTTimeout)
	if rel.deadline.Before(deadline) {
		deadline = rel.deadline
	}
	resp, err := rel.sendLeg(a, deadline, rel.scan.Stream)
	if err == nil && resp.StatusCode() >= 500 {
		err = fmt.Errorf("decode worker %s answered %d: %s", d.id, resp.StatusCode(), clip(leadBody(resp, a.x)))
		a.status = resp.StatusCode()
		a.dropResponse(resp)
		resp = nil
	}
	if err != nil && rel.watch.gone.Load() {
		// Not the decode's fault: the client left and the watch closed
		// its connection.
		rel.waitPrefill(true)
		r.metrics.pd.legs.WithLabelValues("decode", pd.proto.name, "aborted").Inc()
		rel.endAttempt(a, 0, errClientLeft, verdictNeutral)
		return false, errClientLeft
	}
	if err != nil {
		res := rel.waitPrefillAfterDecodeFailure()
		why := a.classify(err)
		if !errors.Is(err, upstream.ErrAborted) {
			err = fmt.Errorf("decode worker %s: %w", d.id, err)
		}
		if res.err != nil && res.why != "aborted" {
			// The prefill failed first and took the decode down with it.
			r.metrics.pd.legs.WithLabelValues("decode", pd.proto.name, "aborted").Inc()
			rel.endAttempt(a, 0, nil, verdictNeutral)
			rel.forget(d)
			return false, res.err
		}
		r.metrics.pd.legs.WithLabelValues("decode", pd.proto.name, decodeWhy(why)).Inc()
		a.fail(why, err)
		rel.endAttempt(a, a.status, err, verdictFault)
		rel.forgetPrefillOf()
		return false, err
	}
	a.status = resp.StatusCode()
	answered, err := rel.answer(resp)
	if answered {
		return true, nil
	}
	why := a.classify(err)
	r.metrics.pd.legs.WithLabelValues("decode", pd.proto.name, decodeWhy(why)).Inc()
	a.fail(why, err)
	rel.endAttempt(a, 0, err, verdictFault)
	rel.waitPrefill(true)
	return false, err
}

// forgetPrefillOf lets a later pair reuse the prefill worker of a pair
// whose decode failed (already ended prefill attempts leave no ticket, so
// the last prefill tried is looked up in the tried list).
func (rel *relay) forgetPrefillOf() {
	for i := len(rel.tried) - 1; i >= 0; i-- {
		if rel.tried[i].Record().DisaggMode == discovery.DisaggPrefill {
			rel.tried = slices.Delete(rel.tried, i, i+1)
			return
		}
	}
}

func decodeWhy(why failReason) string {
	switch why {
	case reasonTTFTTimeout, reasonIdleTimeout, reasonRequestTimeout:
		return "timeout"
	}
	return why.String()
}

// leadBody returns the first bytes of a response's body (streamed: read
// from src), for an error message.
func leadBody(resp *fasthttp.Response, src io.Reader) []byte {
	if resp.BodyStream() != nil {
		b, _ := io.ReadAll(io.LimitReader(src, 512))
		return b
	}
	return resp.Body()
}

// endPD ends what is left of the PD legs when the request finishes: a
// concurrent prefill still running is aborted (its answer is discarded
// anyway) and its attempt ended.
func (rel *relay) endPD() {
	rel.waitPrefill(true)
	if rel.pd.pre.ticket.Worker != nil {
		rel.endAttempt(&rel.pd.pre, 0, nil, verdictNeutral)
	}
}

// pdStreamError is the message of a PD stream's error event when its
// prefill failed (the decode stream was cut because of it).
func (rel *relay) pdStreamError() (string, bool) {
	if rel.pd == nil {
		return "", false
	}
	res := rel.pd.preFailed.Load()
	if res == nil {
		return "", false
	}
	return "prefill failed: " + res.err.Error(), true
}

// pdFail answers a PD request no pair could serve.
func (rel *relay) pdFail(err error) {
	r, ctx := rel.r, rel.ctx
	switch {
	case errors.Is(err, ErrPDProtocol):
		r.metrics.pd.errors.WithLabelValues("protocol").Inc()
		rel.dialect.writeError(ctx, fasthttp.StatusInternalServerError, err.Error(), openai.TypeServer, "pd_protocol_error")
		rel.err = err
		r.finish(rel, outcomeUpstreamError, fasthttp.StatusInternalServerError)
		return
	case errors.Is(err, ErrPDMeta):
		r.metrics.pd.errors.WithLabelValues("meta").Inc()
		rel.dialect.writeError(ctx, fasthttp.StatusInternalServerError, err.Error(), openai.TypeServer, "pd_misconfigured")
		rel.err = err
		r.finish(rel, outcomeUpstreamError, fasthttp.StatusInternalServerError)
		return
	case errors.Is(err, ErrSaturated), errors.Is(err, errNoCandidate):
		rel.fail(err)
		return
	}
	status, code := fasthttp.StatusBadGateway, "upstream_error"
	if isTimeout(err) || errors.Is(err, fasthttp.ErrTimeout) {
		status, code = fasthttp.StatusGatewayTimeout, "upstream_timeout"
	}
	rel.dialect.writeError(ctx, status, "disaggregated request failed after "+itoa(rel.attempts)+" pair(s): "+err.Error(), openai.TypeServer, code)
	rel.err = err
	r.finish(rel, outcomeUpstreamError, 0)
}

// beginLeg starts attempt a on the prefill or the decode pool: like
// begin, among the pool's workers this request has not tried, skipping
// full ones and open breakers (all open: routed anyway), with the
// policy's pick. It does not queue: a full pool is ErrSaturated.
func (rel *relay) beginLeg(a *attempt, prefill bool) error {
	r := rel.r
	defer rel.traceBegin(a, rel.trace.now()) // tracing.go
	if rel.direct.Present {
		if prefill {
			return rel.beginDirect(a, rel.direct.Prefill, "X-Infera-Prefill-Worker")
		}
		return rel.beginDirect(a, rel.direct.Worker, "X-Infera-Worker")
	}
	if !rel.refreshModel() {
		return errNoCandidate
	}
	c := rel.model
	pool, hdr, cursor := c.Decode, inferaWorkerKey, c.decodeCursor
	if prefill {
		pool, hdr, cursor = c.Prefill, inferaPrefillWorkerKey, c.prefillCursor
	}
	if cursor == nil {
		cursor = c.cursor
	}
	now := r.cfg.Now()
	cands := rel.sub.Workers[:0]
	untried, open := 0, 0
	for _, w := range pool {
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
		for _, w := range pool {
			if !slices.Contains(rel.tried, w) && !r.admit.saturated(w) {
				cands = append(cands, w)
			}
		}
	}
	rel.sub.Workers = cands
	if len(cands) == 0 {
		if untried > 0 {
			return ErrSaturated
		}
		return errNoCandidate
	}
	rel.sub.Model, rel.sub.cursor = c.Model, cursor
	rel.in = PickInput{Route: rel.route, Body: rel.body, Request: &rel.scan, RequestID: rel.id}
	rel.trace.markPick() // tracing.go
	t, err := r.policy.Pick(&rel.in, &rel.sub)
	rel.in = PickInput{}
	if err != nil || t.Worker == nil {
		return errNoCandidate
	}
	if !r.admit.reserve(t.Worker) {
		r.policy.Release(t, Result{})
		return ErrSaturated
	}
	hb, ht, x := a.hintBuf[:0], a.hintTmp[:0], a.x
	*a = attempt{rel: rel, hintBuf: hb, hintTmp: ht, x: x, ticket: t, start: time.Now()}
	a.probe = t.Worker.breaker.admit(now)
	rel.tried = append(rel.tried, t.Worker)
	t.Worker.picks.Inc()
	// Canonical key, and an id that is a host:port (discovery validates
	// it): Set's normalizing and new-line removal would change nothing.
	rel.ctx.Response.Header.SetCanonical(hdr, t.Worker.idHeader)
	return nil
}

// The PD answer's headers as Set writes them (fasthttp's normalized form:
// X-Infera-PD goes out as X-Infera-Pd), for SetCanonical.
var (
	inferaPrefillWorkerKey = []byte("X-Infera-Prefill-Worker")
	inferaPDKey            = []byte("X-Infera-Pd")
	pdDisaggregated        = []byte("disaggregated")
)

// uncachedTokens estimates the prompt tokens the prefill worker of t
// would compute: the kv-aware policy's uncached blocks × block size.
// Other policies know nothing of the cache (ok false).
func uncachedTokens(t Ticket) (int, bool) {
	kt, ok := t.State.(*kvTicket)
	if !ok || kt.target == nil {
		return 0, false
	}
	return kt.miss * kt.target.blockSize(), true
}
