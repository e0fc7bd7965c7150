package router

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Progress-aware load (issue 12). A worker whose engine stopped making
// progress (a frozen process, a wedged GPU) keeps its connections open and
// answers nothing; without this the router would keep sending it a share
// of the traffic and learn of the fault only at --ttft-timeout, while the
// clients' requests pile up there.
//
// Every upstream read that returns bytes stamps its worker's progress
// (upstream.Conn.Read); the first request after an idle spell stamps it too
// (admission.reserve). A worker with requests in flight and no progress
// for StallWindow is suspected: every policy's candidates skip it (begin)
// and it is probed (GET /health, at most every StallProbeInterval). An
// answer is progress and clears the suspicion; a probe that fails or times
// out confirms the stall: metrics and /v1/workers report it, and streams
// waiting there for their first event move to another worker (their
// attempt's tick, attempt.stuck). The stall ends with the next progress —
// the stuck streams resuming, or a probe answering — so the worker comes
// back by itself.
//
// A stream also counts as stuck, whatever its worker's state, when it has
// waited StallWindow for its first event while a stream that arrived on
// the same worker more than half a window later already got its own: the
// engine serves others and skipped this one (a request hung before its
// first token).
//
// The state is a few atomics per worker; the request path loads them and
// allocates nothing. Probes run on their own goroutine, one per worker at
// a time.

// errAttemptStalled ends the watched read of a stream stuck before its
// first event, so that it is retried elsewhere.
var errAttemptStalled = errors.New("router: worker stalled before the first event")

// progressGrain: progress stamps closer together than this are skipped, so
// that busy streams do not all write the same cache line.
const progressGrain = int64(5 * time.Millisecond)

// workerStall is a worker's progress state (unix nanoseconds; 0: never).
type workerStall struct {
	progress    atomic.Int64 // the last answer byte, probe answer, or start of a busy spell
	since       atomic.Int64 // when the stall was confirmed; 0: not stalled
	lastProbe   atomic.Int64
	probing     atomic.Bool
	servedStart atomic.Int64 // the latest arrival of a stream that got its first event
	firstHook   atomic.Pointer[firstTokenBox]
}

// firstTokenHook is told of every stream's first event on its worker: the
// policy state of the stream's ticket (Ticket.State) and now in unix ns.
// The kv-aware TTFT estimate learns from it (kvestimate.go).
type firstTokenHook interface{ firstToken(state any, now int64) }

type firstTokenBox struct{ h firstTokenHook }

// setFirstTokenHook installs h (nil: none).
func (s *workerStall) setFirstTokenHook(h firstTokenHook) {
	if h == nil {
		s.firstHook.Store(nil)
		return
	}
	s.firstHook.Store(&firstTokenBox{h: h})
}

// noteProgress stamps progress at now.
func (s *workerStall) noteProgress(now int64) {
	if now-s.progress.Load() > progressGrain {
		s.progress.Store(now)
	}
}

// busy starts a busy spell (the worker's first request in flight after
// none): the stall window counts from now, not from the last answer.
func (s *workerStall) busy() {
	if s.since.Load() == 0 {
		s.progress.Store(time.Now().UnixNano())
	}
}

// noteServed records that a stream which arrived at start, picked with
// ticket state state, got its first event.
func (s *workerStall) noteServed(start int64, state any) {
	if b := s.firstHook.Load(); b != nil {
		b.h.firstToken(state, time.Now().UnixNano())
	}
	for {
		cur := s.servedStart.Load()
		if start <= cur || s.servedStart.CompareAndSwap(cur, start) {
			return
		}
	}
}

// Stalled reports whether the router considers the worker stalled (a
// confirmed stall, as /v1/workers and metrics show it).
func (w *Worker) Stalled() bool { return w.stall.since.Load() != 0 }

// skipStalled reports whether w should get no new request now: its stall
// is confirmed, or suspected and not yet refuted by a probe. It starts a
// probe when one is due. Stall detection off: never.
func (r *Router) skipStalled(w *Worker, now int64) bool {
	win := int64(r.cfg.StallWindow)
	if win <= 0 {
		return false
	}
	st := &w.stall
	prog := st.progress.Load()
	if since := st.since.Load(); since != 0 {
		if prog > since {
			if st.since.CompareAndSwap(since, 0) {
				r.log.Info().Str("worker_id", w.id).Float64("stalled_s", float64(prog-since)/1e9).Msg("stalled worker made progress again")
			}
			return false
		}
		r.probeStalled(w, now)
		return true
	}
	if w.inflight.Load() == 0 || now-prog <= win {
		return false
	}
	r.probeStalled(w, now)
	return true
}

// silentSince reports whether w has requests in flight and has sent no
// answer byte since start (unix ns), the arrival of a request about to be
// retried: such a worker gets the retry only when no other is left (begin).
// Stall suspicion waits a whole StallWindow of silence, and a first attempt
// may go there meanwhile; a retry, whose request already lost an attempt,
// should not bet on a worker that has answered nobody for as long as the
// request has lived. An engine hung before its first token is silent from
// the start of its busy spell: in TestChaosUnary (e2e) retries of the
// requests broken by the engine kill went to the hung engine before its
// window ran out and waited there for --ttft-timeout; a retry that is the
// request's last attempt fails there (504) while a healthy worker is free.
// A worker answering others stamps progress every progressGrain or sooner;
// one with nothing in flight is idle, not silent. Stall detection off:
// never.
func (r *Router) silentSince(w *Worker, start int64) bool {
	return r.cfg.StallWindow > 0 && w.inflight.Load() != 0 && w.stall.progress.Load() < start
}

// probeStalled starts a probe of w unless one runs or the last one started
// less than StallProbeInterval ago.
func (r *Router) probeStalled(w *Worker, now int64) {
	st := &w.stall
	if now-st.lastProbe.Load() < int64(r.cfg.StallProbeInterval) || !st.probing.CompareAndSwap(false, true) {
		return
	}
	st.lastProbe.Store(now)
	r.probes.Go(func() { r.probe(w) })
}

// probe asks w's engine for GET /health within the larger of the stall
// window and the probe interval (at least stallProbeMin), so that an engine
// slowed down, not stopped, still answers in time: any answer is progress;
// none confirms the stall.
func (r *Router) probe(w *Worker) {
	st := &w.stall
	defer st.probing.Store(false)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(w.health)
	req.Header.SetMethod(fasthttp.MethodGet)
	err := w.doUnary(req, resp, max(r.cfg.StallWindow, r.cfg.StallProbeInterval, stallProbeMin))
	now := time.Now().UnixNano()
	if err == nil {
		st.progress.Store(now)
		return
	}
	if st.progress.Load() > st.lastProbe.Load() {
		return // progress while the probe ran: not stalled after all
	}
	if st.since.CompareAndSwap(0, now) {
		r.metrics.stalls.WithLabelValues(w.id).Inc()
		r.log.Warn().Str("worker_id", w.id).Int64("in_flight", w.inflight.Load()).
			Float64("silent_s", float64(now-st.progress.Load())/1e9).Err(err).Msg("worker stalled: no progress and no answer to its probe")
	}
}

// stallProbeMin bounds a probe's timeout from below.
const stallProbeMin = 200 * time.Millisecond

// stallTick is how often a stream waiting for its first event checks
// whether it is stuck.
func (r *Router) stallTick() time.Duration {
	return max(r.cfg.StallWindow/4, 10*time.Millisecond)
}

// stuck reports whether attempt a, a stream still waiting for its first
// event, should give up its worker for another (see the package comment
// above): its worker is stalled, or others that arrived after it were
// served. Only while a retry is possible: the last attempt keeps waiting
// for its first-byte timeout.
func (a *attempt) stuck(now time.Time) bool {
	rel := a.rel
	r := rel.r
	win := r.cfg.StallWindow
	w := a.ticket.Worker
	if win <= 0 || w == nil || rel.firstByte || now.Sub(a.start) < win {
		return false
	}
	st := &w.stall
	r.skipStalled(w, now.UnixNano()) // keeps the probes going
	if st.since.Load() == 0 && st.servedStart.Load() <= a.start.UnixNano()+int64(win/2) {
		return false
	}
	// Stuck; leave only for a worker that can take it.
	return rel.retryable(nil)
}
