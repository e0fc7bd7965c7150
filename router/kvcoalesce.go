package router

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Coalescing a prefix under prefill (KVAwareConfig.CoalesceWait).
//
// A pick prices a prefix that a request in flight on the target is still
// prefilling as cached (kvpick.go): by the time this request runs, it
// will be. An engine makes that true only for the part computed when it
// admits the follower. vLLM caches each block once computed, so a
// follower admitted mid-prefill finds the leader's finished chunks and
// prefills the rest of the shared prefix again itself, beside the leader
// and in the same token budget (the simulator models the same): its hit is
// short, the leader's tail is computed twice, and the engine's queue
// behind both grows. So the pick holds such a follower until the leader's
// first token, when every one of its prompt blocks is cached; or until the
// leader ends; or, for a leader whose first token the router cannot see
// (a unary answer), until its estimated first token plus slack; at most
// CoalesceWait. The follower then prefills only its own tail. A leader
// waiting in the engine's queue is waited for too: sent at once, the
// follower would be admitted right behind it and find none of the prefix.
// A stream leader is waited for until its first token however late it is
// on its estimate (a late leader is mostly one waiting for room), at most
// CoalesceWait.
//
// The hold happens in Pick after the ticket is charged (as a kvd peer
// pull's wait does), so the target's estimate already counts the
// follower, and only in --kv-cost ttft, whose tickets know their first
// tokens. A hold allocates its leader's channel (once a leader) and a
// timer; a pick that holds nothing allocates nothing more than before.

// coalesceSlack is added to a leader's estimated first token before a
// follower stops waiting for it: estimates are means, and a leader a few
// milliseconds late still saves its follower the prefix.
const coalesceSlack = 20 * time.Millisecond

// How a hold ended: the leader's first token (or end), its estimated first
// token, or CoalesceWait. The names are the metric's outcome labels.
const (
	holdFirstToken = iota
	holdEstimate
	holdLimit
)

var holdOutcomes = [...]string{holdFirstToken: "first_token", holdEstimate: "estimate", holdLimit: "limit"}

// coalesceMetrics count the holds by how they ended (each outcome's series
// resolved once) and their time.
type coalesceMetrics struct {
	holds   *prometheus.CounterVec
	ended   [len(holdOutcomes)]prometheus.Counter
	seconds prometheus.Counter
}

func newCoalesceMetrics() coalesceMetrics {
	m := coalesceMetrics{
		holds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infera_router_kv_coalesce_holds_total",
			Help: "Requests the kv-aware pick held until a request in flight on the same worker had prefilled their prompt prefix (--kv-coalesce-wait), by how the hold ended: first_token (the leader's first token or end), estimate (its estimated first token passed), limit (--kv-coalesce-wait passed).",
		}, []string{"outcome"}),
		seconds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infera_router_kv_coalesce_hold_seconds_total",
			Help: "Time requests spent held for a leader's prefill (--kv-coalesce-wait); divide by infera_router_kv_coalesce_holds_total for the mean hold.",
		}),
	}
	for i, name := range holdOutcomes {
		m.ended[i] = m.holds.WithLabelValues(name)
	}
	return m
}

// leader returns a ticket in flight here, not yet past its first token,
// whose prompt holds hs (block hashes chain: its hash at len(hs)-1 is hs's
// last) and which found less of hs cached at its pick, so is prefilling
// part of it; nil when none is.
func (m *ttftModel) leader(hs []uint64) *kvTicket {
	if len(hs) == 0 {
		return nil
	}
	n, last := len(hs), hs[len(hs)-1]
	for _, kt := range m.flight {
		if !kt.first && len(kt.hashes) >= n && kt.hashes[n-1] == last && len(kt.hashes)-kt.miss < n {
			return kt
		}
	}
	return nil
}

// prefilling reports whether a ticket in flight here, not yet past its first
// token, is prefilling part of the prefix hs.
func (m *ttftModel) prefilling(hs []uint64) bool { return m.leader(hs) != nil }

// firstSignal returns a channel closed at kt's first token or release,
// making it on the first follower's call. Called under kt.target.mu.
func (kt *kvTicket) firstSignal() <-chan struct{} {
	if kt.firstCh == nil {
		kt.firstCh = make(chan struct{})
	}
	return kt.firstCh
}

// signalFirst releases kt's followers. Called under kt.target.mu.
func (kt *kvTicket) signalFirst() {
	if kt.firstCh != nil {
		close(kt.firstCh)
		kt.firstCh = nil
	}
}

// coalesceHold is a pick's hold on a leader: the leader's signal and the
// unix ns at which its estimated first token (plus slack) has passed.
type coalesceHold struct {
	first <-chan struct{}
	until int64
}

// holdFor returns the hold of a request picked to t with prompt hashes hs,
// of which the first shared blocks are shared with the requests in flight
// there and confirmed are known cached (the target's events listed them):
// a hold on a leader prefilling at least minWarmBlocks of the shared prefix
// that are not known cached, or none. Called under t.mu.
func (p *KVAware) holdFor(t *kvTarget, hs []uint64, shared, confirmed int) coalesceHold {
	if p.cfg.CoalesceWait <= 0 || shared-confirmed < minWarmBlocks {
		return coalesceHold{}
	}
	l := t.est.leader(hs[:shared])
	if l == nil {
		return coalesceHold{}
	}
	// A stream's first token is seen (noteServed): no estimate bounds the
	// wait for it. A leader late on its estimate is mostly one waiting for
	// room in the engine's cache; released at the estimate, the follower
	// was admitted beside it mid-prefill, found a part of the prefix, and
	// took room for the rest again (the trace, session 31: 30–100 ms more
	// waiting for room, a hold in four ending at the estimate).
	until := int64(math.MaxInt64)
	if !l.stream {
		until = l.wall + int64(l.pred*float64(time.Second)) + int64(coalesceSlack)
	}
	return coalesceHold{first: l.firstSignal(), until: until}
}

// await holds the pick of request id until the leader's first token, its
// estimated first token (a unary leader), or CoalesceWait, whichever comes
// first. The hold is logged at debug level by request id: it is part of
// the request's time to first token that no engine sees (make bench-kv adds
// it to the simulators' modelled TTFT).
func (p *KVAware) await(h coalesceHold, id []byte) {
	began := time.Now()
	outcome := holdFirstToken
	if d := min(time.Duration(h.until-began.UnixNano()), p.cfg.CoalesceWait); d <= 0 {
		select {
		case <-h.first:
		default:
			outcome = holdEstimate
		}
	} else {
		timer := time.NewTimer(d)
		select {
		case <-h.first:
		case <-timer.C:
			outcome = holdEstimate
			if d == p.cfg.CoalesceWait {
				outcome = holdLimit
			}
		}
		timer.Stop()
	}
	held := time.Since(began).Seconds()
	p.m.coalesce.ended[outcome].Inc()
	p.m.coalesce.seconds.Add(held)
	if e := p.log.Debug(); e.Enabled() {
		e.Bytes("request_id", id).Float64("hold_seconds", held).Str("outcome", holdOutcomes[outcome]).Msg("kv coalesce hold")
	}
}
