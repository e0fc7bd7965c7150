package router

import (
	"errors"
	"slices"
	"time"

	"github.com/valyala/fasthttp"
)

// A request runs a plan of legs, one plan at a time, each leg an attempt
// (attempt.go) on one worker:
//
//   - mixed: [worker]  (tryMixed, below)
//   - disaggregated: [prefill, decode], serial or concurrent as the PD
//     protocol table says (pdTry, pd.go)
//   - continuation: [worker] once a stream broke after its first event,
//     continuing what the client already got (tryContinue, migrate.go)
//
// A failed plan is replaced by another on workers the request has not
// tried (failover); a stream that breaks after its first event is
// continued by a continuation leg (migrate.go), by one loop (failover) under one retry predicate
// (retryable); every attempt ends in endAttempt (attempt.go), the one place
// that records its outcome (metrics, policy ticket, admission slot,
// breaker verdict), and the request in Router.finish.

// failover runs the request's plan until one settles the client's answer:
// the router's one failover loop. after is the failure that ended the
// plan before (nil: none yet; the first plan always runs). It returns the
// error of the last plan when none settled the answer; the caller answers
// it (giveUp before the status line, an error event in a stream).
//
// Before the status line went out any answer may settle the request; once
// a stream's status line is out (rel.streaming), only an event stream may
// take its place (tryMixed).
func (rel *relay) failover(after error) (bool, error) {
	err := after
	for err == nil || rel.retryable(err) {
		var settled bool
		if settled, err = rel.try(); settled {
			return true, nil
		}
	}
	return false, err
}

// try runs one plan.
func (rel *relay) try() (bool, error) {
	switch {
	case rel.continuing():
		return rel.tryContinue() // migrate.go: the continuation leg
	case rel.pd != nil:
		return rel.pdTry()
	}
	return rel.tryMixed()
}

// errNoRetry marks the end of the plans: a failure (a plan that could not
// even begin after others failed) that no other plan may follow; the
// request's last failure is what its client hears.
var errNoRetry = errors.New("router: no retry left")

// retryable is the one retry predicate: whether another plan may follow
// the failure err. Not after a failure of the request itself (a malformed
// PD set-up, a full fleet, no candidate), nor once its client left, its
// retries (before its first byte; after it, its continuations:
// canContinue) or its time are spent, or no untried worker is left for every
// leg of the plan. A disaggregated stream whose status line went out is
// not replaced: its decode leg is paired with one prefill. err nil: may
// the request still move elsewhere (a stalled worker given up)?
func (rel *relay) retryable(err error) bool {
	switch {
	case errors.Is(err, errNoRetry), errors.Is(err, errClientLeft),
		errors.Is(err, ErrPDProtocol), errors.Is(err, ErrPDMeta),
		errors.Is(err, ErrSaturated), errors.Is(err, errNoCandidate), errors.Is(err, errBacklog):
		return false
	}
	if rel.watch.gone.Load() || rel.direct.Present {
		// The client left: nobody to answer; or an endpoint picker named
		// the worker: no other takes its place.
		return false
	}
	if !time.Now().Before(rel.deadline) || !rel.refreshModel() {
		return false
	}
	if rel.continuing() {
		// Once the answer has begun, only --migration-limit counts: the
		// retries were for before its first byte (Config.MaxRetries).
		return rel.canContinue() // migrate.go
	}
	if rel.attempts > rel.r.cfg.MaxRetries {
		return false
	}
	c := rel.model
	if rel.pd != nil {
		if rel.streaming {
			return false
		}
		return slices.ContainsFunc(c.Prefill, rel.untried) && slices.ContainsFunc(c.Decode, rel.untried)
	}
	return slices.ContainsFunc(c.Workers, rel.untried)
}

func (rel *relay) untried(w *Worker) bool { return !slices.Contains(rel.tried, w) }

// giveUp answers a request whose plans all failed before anything reached
// its client: a client that left is counted as such; a worker's own 5xx,
// held when no retry was left, is relayed as it is; else the failure, in
// the plan's words.
func (rel *relay) giveUp(err error) {
	if rel.watch.stop(rel.ctx) || errors.Is(err, errClientLeft) {
		rel.clientLeft()
		return
	}
	if errors.Is(err, errNoRetry) {
		err = rel.lastErr
	}
	if be := (*backlogError)(nil); errors.As(err, &be) {
		rel.failBacklog(be) // natsleg.go
		return
	}
	if rel.pd != nil {
		rel.pdFail(err)
		return
	}
	rel.fail(err)
}

// tryMixed runs the plan [worker]: it begins an attempt (queueing for an
// admission slot on the request's first), sends it, and relays the answer:
// a stream is attached (settled: Close finishes the request), a unary
// answer read whole and the request finished. A 5xx is answered only
// when no retry is left (the worker's own words beat a generic error).
// With the status line already out (a stream replacing one that failed
// before its first event), only an event stream settles.
func (rel *relay) tryMixed() (bool, error) {
	a := &rel.att
	resumed := rel.streaming
	if err := rel.begin(a, !resumed && rel.attempts == 0); err != nil {
		if rel.attempts > 0 && rel.lastErr != nil {
			return false, errNoRetry // no worker left for a retry
		}
		return false, err
	}
	rel.countAttempt()
	if resumed {
		rel.pump.n, rel.pump.midEvent = 0, false
	}
	resp, err := rel.send(a)
	if err != nil {
		if rel.watch.gone.Load() {
			// Not the worker's fault: its exchange was aborted for a
			// client that left.
			rel.endAttempt(a, 0, errClientLeft, verdictNeutral)
			return false, errClientLeft
		}
		a.fail(a.classify(err), err)
		rel.endAttempt(a, 0, err, verdictFault)
		return false, err
	}
	a.status = resp.StatusCode()
	if resumed {
		return rel.takeStream(a, resp)
	}
	if a.status >= 500 {
		a.fail(reasonStatus5xx, errStatus5xx)
		if rel.retryable(errStatus5xx) {
			a.dropResponse(resp)
			rel.endAttempt(a, a.status, errStatus5xx, verdictFault)
			return false, errStatus5xx
		}
		// The worker's own 5xx, relayed; the attempt ends (with its noted
		// failure) when the request finishes.
	}
	answered, err := rel.answer(resp)
	if answered {
		return true, nil
	}
	a.fail(a.classify(err), err)
	rel.endAttempt(a, 0, err, verdictFault)
	return false, err
}

// takeStream attaches resp, the answer of attempt a, as the stream that
// replaces a failed or broken one (settled), or ends a with why it cannot:
// an answer that is not an event stream.
func (rel *relay) takeStream(a *attempt, resp *fasthttp.Response) (bool, error) {
	if a.status < 300 && isEventStream(resp.Header.ContentType()) && resp.BodyStream() != nil {
		rel.attach(a, resp)
		return true, nil
	}
	why, err, v := reasonUpstreamError, errNotEventFeed, verdictFault
	switch {
	case a.status >= 500:
		why, err = reasonStatus5xx, errStatus5xx
	case a.status >= 400:
		v = verdictNeutral
	}
	a.dropResponse(resp)
	a.fail(why, err)
	rel.endAttempt(a, a.status, err, v)
	return false, err
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

// countAttempt counts one more attempt of the relayed answer (a retry
// after the first, by the last failure's reason).
func (rel *relay) countAttempt() {
	if rel.attempts > 0 {
		rel.r.metrics.retries[rel.lastWhy].Inc()
	}
	rel.attempts++
}

// send sends attempt a's request to its worker and returns the response
// once the status line and headers are in; the body is still to be read
// (streamed). The attempt's deadline caps it: the first-byte timeout (for
// a unary request that is its whole answer) and the request's own.
func (rel *relay) send(a *attempt) (*fasthttp.Response, error) {
	rel.beginExchange(a)
	if rel.writesRequest(a) {
		return a.doOwn(rel.ownRequest(a)) // ownrequest.go
	}
	if a != &rel.att || rel.ureq == nil {
		req := rel.upstreamRequest(a)
		defer fasthttp.ReleaseRequest(req)
		return a.do(req)
	}
	// The relay's own request (relayBlock), for a request that does not
	// write itself (a traced one, a leg over NATS): Do has written it all
	// when it returns, so it is free again for the next attempt.
	req := rel.buildUpstreamRequest(a, rel.ureq)
	defer req.Reset()
	return a.do(req)
}
