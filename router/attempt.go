package router

import (
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/infera/infera/router/upstream"
	"github.com/infera/infera/tracing"
	"github.com/valyala/fasthttp"
)

// attempt is one upstream leg of a request: it owns its worker's policy
// ticket, admission slot and breaker probe from begin until endAttempt,
// and, while its answer streams, the upstream response and connection,
// the worker's status and the leg's timeout state.
//
// Concurrency: begin, upstreamRequest and endAttempt run on the request's
// goroutine (they touch the request's tried list, client request and last
// failure); between them attempts of one request may send (do) and read
// concurrently.
type attempt struct {
	rel  *relay
	body []byte // what the worker gets (nil: the request's body)
	// exact: the body is an exact continuation, for /v1/completions.
	exact bool
	// The body with the worker's cache hints (cachehints.go) and its
	// scratch buffer, kept across attempts and requests.
	hintBuf, hintTmp []byte
	ticket           Ticket
	probe            bool      // the ticket's worker admitted this attempt as its breaker probe
	nats             bool      // a PD leg that travels over NATS (natsleg.go, pdOverNATS)
	start            time.Time // when the worker was picked
	deadline         time.Time // of the exchange (do): first byte, or the request's

	// x is the attempt's exchange with its worker (kept across attempts
	// and requests); it holds the connection while the answer is awaited
	// and, for a stream, until closeUpstream.
	x      *upstream.Exchange
	resp   *fasthttp.Response // upstream response while streaming
	src    io.Reader          // its body stream (x)
	conn   *upstream.Conn     // its connection, watched while streaming
	status int                // the worker's status; 0 before its headers
	// readTimedOut: a watched read hit its deadline (fasthttp's chunk
	// parser reports that without wrapping the timeout error).
	readTimedOut bool
	// stalledOut: the stream gave up its stuck worker (stall.go).
	stalledOut bool
	// nextBeat: when the silent stream's next heartbeat is due.
	nextBeat time.Time
	// The failure noted by fail, counted and remembered by endAttempt.
	failed  bool
	failWhy failReason
	failErr error

	watch upstream.WatchSlot // what conn watches: this attempt
	span  tracing.Span       // tracing.go
}

// fail notes why the attempt failed; endAttempt counts, logs and remembers
// it as the request's last failure.
func (a *attempt) fail(why failReason, err error) {
	a.failed, a.failWhy, a.failErr = true, why, err
}

// endAttempt ends a with its outcome: the failure fail noted (metrics, log,
// the request's last error), the policy's ticket, the admission slot, and
// the verdict for the worker's breaker. It is the only way an attempt
// ends, and does nothing for an attempt not begun (or already ended).
func (rel *relay) endAttempt(a *attempt, status int, err error, v verdict) {
	if a.ticket.Worker == nil {
		return
	}
	rel.endAttemptAt(a, status, err, v, rel.now())
}

// endAttemptAt is endAttempt at the time end, read by a caller that needs
// it too (finish).
func (rel *relay) endAttemptAt(a *attempt, status int, err error, v verdict, end time.Time) {
	t := a.ticket
	w := t.Worker
	if w == nil {
		return
	}
	r := rel.r
	rel.traceEnd(a, status, err) // tracing.go
	if a.failed {
		r.metrics.failures[a.failWhy].Inc()
		if k, ok := a.failWhy.timeout(a.failErr); ok {
			r.metrics.timeouts[k].Inc()
		}
		r.log.Warn().Str("worker_id", w.id).Str("reason", a.failWhy.String()).Err(a.failErr).Msg("worker attempt failed")
		rel.lastErr, rel.lastWhy = a.failErr, a.failWhy
		a.failed, a.failErr = false, nil
	}
	r.routePolicy(rel.route).Release(t, Result{Status: status, Err: err, Duration: end.Sub(rel.start)})
	r.admit.release(w)
	switch w.breaker.record(v, a.probe, rel.breakerNow(end), &r.brk) {
	case breakerTripped:
		r.metrics.breakerTrips.WithLabelValues(w.id).Inc()
		r.log.Warn().Str("worker_id", w.id).Msg("worker circuit breaker opened")
	case breakerRecovered:
		r.log.Info().Str("worker_id", w.id).Msg("worker circuit breaker closed")
	}
	a.ticket, a.probe = Ticket{}, false
}

// begin starts attempt a: it picks a worker among the model's candidates
// not tried yet by this request, skipping full workers and open breakers,
// and takes an admission slot on it. When every candidate is full and
// queue is set it waits for a free slot (woken by releases) up to
// QueueTimeout, then fails with ErrSaturated. When every free candidate's
// breaker is open it routes anyway: refusing everything would turn a
// fleet-wide blip into an outage.
func (rel *relay) begin(a *attempt, queue bool) error {
	// No defer: each costs a deferprocStack and a return through the
	// deferred calls on every request (issue 36, docs/performance.md).
	traced := rel.trace.now()
	var err error
	if rel.direct.Present {
		err = rel.beginDirect(a, rel.direct.Worker, "X-Infera-Worker")
	} else {
		var q queueWait
		err = rel.beginPicked(a, queue, &q)
		q.leave(rel.r)
	}
	rel.traceBegin(a, traced) // tracing.go
	return err
}

// queueWait is begin's wait for a free slot, left by leave whatever the
// outcome.
type queueWait struct {
	wake     <-chan struct{}
	timer    *time.Timer
	counted  bool
	deadline time.Time
}

func (q *queueWait) leave(r *Router) {
	if q.counted {
		r.admit.waiting.Add(-1)
	}
	if q.timer != nil {
		q.timer.Stop()
	}
}

// beginPicked is begin with the policy's pick (no endpoint picker's).
func (rel *relay) beginPicked(a *attempt, queue bool, q *queueWait) error {
	r := rel.r
	for {
		if !rel.refreshModel() {
			return errNoCandidate
		}
		c := rel.model
		wall := rel.now() // the stall check's, the breakers' and the attempt's start
		now := rel.breakerNow(wall)
		nowNano := wall.UnixNano()
		cands := rel.sub.Workers[:0]
		untried, open, backlogged := 0, 0, 0
		var full *Worker
		// A retry's start: it shuns the workers silent since then.
		var retryOf int64
		if rel.attempts > 0 {
			retryOf = rel.start.UnixNano()
		}
		for _, w := range c.Workers {
			if slices.Contains(rel.tried, w) {
				continue
			}
			untried++
			if r.admit.saturated(w) {
				continue
			}
			if r.backlogged(w) { // natsleg.go
				backlogged, full = backlogged+1, w
				continue
			}
			if !w.breaker.available(now) || r.skipStalled(w, nowNano) || (retryOf != 0 && r.silentSince(w, retryOf)) {
				// A stalled worker is as good as an open breaker: skipped
				// while others are left; so is, for a retry, a worker that
				// has answered nothing since the request arrived.
				open++
				continue
			}
			cands = append(cands, w)
		}
		if len(cands) == 0 && backlogged == untried && full != nil {
			return &backlogError{worker: full.id}
		}
		if len(cands) == 0 && open > 0 {
			for _, w := range c.Workers {
				if !slices.Contains(rel.tried, w) && !r.admit.saturated(w) && !r.backlogged(w) {
					cands = append(cands, w)
				}
			}
		}
		rel.sub.Workers = cands
		if len(cands) > 0 {
			rel.sub.Model, rel.sub.cursor = c.Model, c.cursor
			rel.in = PickInput{Route: rel.route, Body: rel.body, Request: &rel.scan, RequestID: rel.id}
			rel.trace.markPick() // tracing.go
			t, err := r.routePolicy(rel.route).Pick(&rel.in, &rel.sub)
			rel.in = PickInput{}
			if err != nil || t.Worker == nil {
				return errNoCandidate
			}
			if !r.admit.reserve(t.Worker) {
				// Another request took the last slot since the scan.
				r.routePolicy(rel.route).Release(t, Result{})
				continue
			}
			// Cleared in place, then set: a literal with fields would be
			// built aside and copied.
			body, hb, ht, x := a.body, a.hintBuf[:0], a.hintTmp[:0], a.x
			*a = attempt{}
			a.rel, a.body, a.hintBuf, a.hintTmp, a.x, a.ticket, a.start = rel, body, hb, ht, x, t, wall
			a.probe = t.Worker.breaker.admit(now)
			rel.tried = append(rel.tried, t.Worker)
			t.Worker.picks.Inc()
			if rel.late != nil {
				rel.lateWorker = t.Worker // set with the ids (relayhead.go)
			} else {
				rel.ctx.Response.Header.SetCanonical(inferaWorkerKey, t.Worker.idHeader)
			}
			return nil
		}
		if untried == 0 || !queue {
			return errNoCandidate
		}
		// Every untried candidate is full: queue. Count this waiter before
		// the next scan, so that a slot freed after it wakes us.
		if !q.counted {
			q.counted = true
			r.admit.waiting.Add(1)
			q.deadline = rel.start.Add(r.cfg.QueueTimeout)
			if q.deadline.After(rel.deadline) {
				q.deadline = rel.deadline
			}
			q.wake = r.admit.waitChan()
			continue
		}
		left := time.Until(q.deadline)
		if left <= 0 {
			return ErrSaturated
		}
		if q.timer == nil {
			q.timer = time.NewTimer(left)
		}
		select {
		case <-q.wake:
			q.wake = r.admit.waitChan()
		case <-q.timer.C:
			return ErrSaturated
		}
	}
}

// classify names the failure of an attempt.
func (a *attempt) classify(err error) failReason {
	var op *net.OpError
	switch {
	case a.stalledOut || errors.Is(err, errAttemptStalled):
		return reasonStalled
	case errors.Is(err, fasthttp.ErrConnectionClosed) && a.ticket.Worker != nil && a.ticket.Worker.Stalled():
		// fasthttp reports a read that failed before any byte of the
		// headers as a closed connection: on a stalled worker, that is
		// the read giving up (upstream.Conn, Progress.GiveUp).
		return reasonStalled
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return reasonBusy
	case errors.As(err, &op) && op.Op == "dial", errors.Is(err, fasthttp.ErrDialTimeout):
		return reasonConnect
	case errors.Is(err, fasthttp.ErrTimeout) || isTimeout(err) || a.readTimedOut:
		switch {
		case !time.Now().Before(a.rel.deadline):
			return reasonRequestTimeout
		case a.rel.firstByte:
			return reasonIdleTimeout
		}
		return reasonTTFTTimeout
	}
	return reasonUpstreamError
}

// upstreamRequest builds attempt a's request to its worker (release it
// with fasthttp.ReleaseRequest). It reads the client's request, so it runs
// on the request's goroutine; the request it returns may be sent (do)
// concurrently with another attempt's.
func (rel *relay) upstreamRequest(a *attempt) *fasthttp.Request {
	return rel.buildUpstreamRequest(a, fasthttp.AcquireRequest())
}

// buildUpstreamRequest builds attempt a's request into req, empty, and
// returns it (upstreamRequest).
func (rel *relay) buildUpstreamRequest(a *attempt, req *fasthttp.Request) *fasthttp.Request {
	r, ctx, w := rel.r, rel.ctx, a.ticket.Worker
	route := rel.route
	if a.exact {
		route = RouteCompletions // an exact continuation (migrate.go)
	}
	req.Header.SetRequestURI(w.path[route])
	req.Header.SetHost(w.host)
	req.Header.SetMethod(fasthttp.MethodPost)
	if ct := ctx.Request.Header.ContentType(); len(ct) > 0 {
		req.Header.SetContentTypeBytes(ct)
	} else {
		req.Header.SetContentType("application/json")
	}
	for _, h := range forwardHeaders {
		// With router API keys the client's Authorization is the router's
		// secret, not the engine's: it stays here.
		if string(h) == fasthttp.HeaderAuthorization && r.keys.enabled() {
			continue
		}
		if v := ctx.Request.Header.PeekCanonical(h); len(v) > 0 {
			req.Header.SetCanonical(h, v)
		}
	}
	req.Header.SetCanonical(requestIDKey, rel.id)
	rel.traceInject(a, &req.Header) // tracing.go
	if a.ticket.PinRank {
		var rank [20]byte
		req.Header.SetCanonical(dataParallelRankKey, strconv.AppendInt(rank[:0], int64(a.ticket.DPRank), 10))
	}
	// The body goes out byte for byte, without a copy; it stays valid
	// because Do has written it all when it returns.
	body := a.body
	if body == nil {
		body = rel.askIDs(a, rel.hintedBody(a)) // migrate.go
	}
	req.SetBodyRaw(body)
	return req
}

// hintedBody is the body attempt a's worker gets (before ids are asked
// for): the cache hints go in the body as scanned (rel.scan's spans index
// it: the client's, or the dialect's translation).
func (rel *relay) hintedBody(a *attempt) []byte {
	body := rel.body
	if rec := a.ticket.Worker.Record(); rec != nil && rel.route.generates() {
		var ok bool
		a.hintBuf, a.hintTmp, ok = appendCacheHints(a.hintBuf[:0], a.hintTmp, body, &rel.scan, rec.Engine)
		if ok {
			body = a.hintBuf
		}
	}
	return body
}

// do sends req to a's worker within the attempt's deadline. It touches
// only a (and reads the router's immutable config).
func (a *attempt) do(req *fasthttp.Request) (*fasthttp.Response, error) {
	return a.exchange(req, a.firstByteDeadline(), a.rel.scan.Stream, a.owner())
}

// owner is the owner of a's connection while its answer is awaited: a
// unary attempt gives up a stalled worker only while a retry is left
// (upstream.Owner); a stream's has none.
func (a *attempt) owner() upstream.Owner {
	if a.rel.scan.Stream {
		return nil
	}
	return a
}

// doOwn is do for a request that writes itself (ownRequest): never over
// NATS (writesRequest). The answer is read as do reads it: a stream's
// head, a unary answer whole.
func (a *attempt) doOwn(req *ownRequest) (*fasthttp.Response, error) {
	if a.x == nil {
		a.x = new(upstream.Exchange) // a leg run without beginExchange
	}
	resp := a.acquireResponse()
	resp.StreamBody = a.rel.scan.Stream
	if err := a.x.DoWriter(a.ticket.Worker.pool, req, resp, a.firstByteDeadline(), a.owner()); err != nil {
		a.rel.releaseResponse(resp)
		return nil, err
	}
	return resp, nil
}

// firstByteDeadline sets and returns the attempt's deadline for its
// answer's head: the first-byte timeout, within the request's.
func (a *attempt) firstByteDeadline() time.Time {
	deadline := a.start.Add(a.rel.r.cfg.TTFTTimeout)
	if a.rel.deadline.Before(deadline) {
		deadline = a.rel.deadline
	}
	a.deadline = deadline
	return deadline
}

// exchange sends req to a's worker on a's exchange and returns its answer:
// with stream, once its headers are in (the body is read from a.x and
// ended by closeUpstream), else whole. a.x must have begun
// (relay.beginExchange); owner is the connection's owner meanwhile.
func (a *attempt) exchange(req *fasthttp.Request, deadline time.Time, stream bool, owner upstream.Owner) (*fasthttp.Response, error) {
	if a.x == nil {
		a.x = new(upstream.Exchange) // a leg run without beginExchange
	}
	if a.nats || (a.rel.pd == nil && a.rel.r.overNATS(a.ticket.Worker)) {
		return a.exchangeNATS(req, deadline, stream, owner) // natsleg.go
	}
	resp := a.acquireResponse()
	resp.StreamBody = stream
	if err := a.x.Do(a.ticket.Worker.pool, req, resp, deadline, owner); err != nil {
		a.rel.releaseResponse(resp)
		return nil, err
	}
	return resp, nil
}

// acquireResponse is a response for a's answer: the relay's own for its
// relayed attempt (relayBlock) when it is free, else fasthttp's pooled
// one (a prefill leg's, a second one). releaseResponse gives it back.
func (a *attempt) acquireResponse() *fasthttp.Response {
	rel := a.rel
	if a == &rel.att && !rel.urespOut && rel.uresp != nil {
		rel.urespOut = true
		return rel.uresp
	}
	return fasthttp.AcquireResponse()
}

// releaseResponse ends resp, from acquireResponse. The relay's own goes
// back empty, its body buffer to fasthttp's pool as a pooled response's
// does: kept with the response (KeepBodyBuffer), the next answer's read
// paid its first touch in the head's ResetBody, more than the pool's Get
// and Put it saved (docs/performance.md, session 19).
func (rel *relay) releaseResponse(resp *fasthttp.Response) {
	if resp != rel.uresp {
		fasthttp.ReleaseResponse(resp)
		return
	}
	resp.Reset()
	rel.urespOut = false
}

// dropResponse ends resp, an answer of a's exchange that is not relayed
// (a 5xx, an answer that is not a stream): the exchange ends, the
// response goes back to its relay or its pool.
func (a *attempt) dropResponse(resp *fasthttp.Response) {
	a.x.Release()
	a.rel.releaseResponse(resp)
}

// beginExchange readies a's exchange for a new leg. A client that left
// before aborts it at once (the watch aborts an exchange only once).
func (rel *relay) beginExchange(a *attempt) {
	if a.x == nil {
		a.x = new(upstream.Exchange)
	}
	a.x.Begin()
	if rel.watch.gone.Load() {
		a.x.Abort()
	}
}
