package router

import (
	"math"
	"time"
)

// Cost modes of the kv-aware policy (KVAwareConfig.Cost, --kv-cost).
const (
	// KVCostBlocks is the block cost w×(blocks−hits) + active + recent,
	// with the MaxShare bounds (KVAwareConfig's zero Cost; `infera serve`
	// defaults to KVCostTTFT since session 26).
	KVCostBlocks = "blocks"
	// KVCostTTFT minimises an estimated time to first token (issue 37).
	KVCostTTFT = "ttft"
)

// The TTFT estimate (--kv-cost ttft).
//
// Engines schedule a request's prefill behind the prefill already queued
// there and interleave it with the decode steps of the requests running
// there, so its time to first token on a target is modelled as
//
//	ttft ≈ base + perKTok × (queued + uncached)/1000 + perDecode × decoding
//
// where queued is the uncached prompt tokens of the requests the router
// sent there that have not had their first token yet, uncached this
// request's prompt tokens beyond the prefix the target holds (index,
// provisional hits, or a prefix in flight there), and decoding the requests
// there past their first token (the simulator's step-time model has the
// same form: sim/scheduler.go). The three coefficients are learned per
// target (worker and DP rank) from what it returns: every stream's first
// event is matched to the request the router sent (workerStall.noteServed
// calls the worker's firstTokenHook) and the observed TTFT, with the queued
// work and decode load the request found at its pick, updates the
// coefficients by normalised least mean squares. Unary answers have no
// first event: their prompt counts as queued until they end. A target whose
// cache has no room for the request adds the wait for it ("Admission"
// below).
//
// The pick compares costs: the estimate, plus on a target that holds less
// of the prompt than the best holder the extra tokens it would prefill again
// (redoCost). A warm request (some target holds a quarter of its prompt)
// goes to the lowest cost: it keeps the target holding its prefix unless
// another one answers first even after redoing it. A cold request has no
// home to keep: it goes to the target furthest below its fair shares (the
// cumulative deficit, with a memory of deficitHalfLife picks per target) of
// the picks, of the uncached tokens its cache took in, of the prompt
// blocks its requests in flight hold, and (weighted coldWeight) of the
// recent cold picks, among those whose cost is within the cold slack of the
// best (coldSlackFactor, plus about two of its own prefills; for a prompt
// above longColdShare of a cache only a tenth of its own prefill,
// longColdSlack, as such a prompt's wait is the tail's): cold traffic,
// new conversations, what the caches take in and what they must keep
// spread evenly without a request being sent into a long queue. Only the
// targets above the share bound of warm requests (MaxShareWarm × the fair
// share of the decayed picks) sit out, so that the requests with a home
// there can stay; below it the deficit, which weighs the past picks too,
// decides. At MaxShare (1.1, tighter) the bound, over the picks of the
// last rounds, sent every new conversation of a burst away from a worker
// that had had one more the round before, which the round after then
// lacked (TestKVEstimateColdBurstIgnoresPastShare).
// A warm choice that would take its target above the bound (with one pick
// of allowance, as the block cost's) goes to the lowest cost within the
// bound and the slack; if there is none and the target is above twice the
// bound's excess (1.3× fair for 1.15, plus the pick), to the lowest cost
// within the bound wherever it is: a hot prefix gets a second holder, which
// the bound within the slack then uses. A warm request whose held prefix is
// in use on its holder by other requests in flight (a shared prompt, not a
// conversation's own history) goes there already at the bound. Only a
// request that no target holds counts in the cold picks: one on a prefix
// several targets hold is placed by the deficit but is no new home. Before
// the bound, a warm request whose prefix a holder is still prefilling for an
// earlier request follows that prefill (followPrefill) rather than a shorter
// queue elsewhere.
//
// The state lives in the target under its mutex, which Pick takes anyway;
// nothing here allocates once a target's flight slice has grown.

// Priors of a target's coefficients before it has returned anything:
// 20 ms per step, 10k prompt tokens/s, 2 ms per running sequence.
const (
	priorBase      = 0.02
	priorPerKTok   = 0.1
	priorPerDecode = 0.002
	// minPerKTok keeps uncached tokens costing something whatever the
	// samples said (a worker never measured under prefill load).
	minPerKTok = 1e-3
	// nlmsStep is the learning rate of the normalised LMS update. At 0.2
	// the coefficients of identical workers followed the last few samples
	// (measured TTFTs on a loaded box) and drifted apart, and warm requests
	// moved to whichever worker had looked faster lately (multi-turn: 34–76
	// moves off a holder per 780 requests, 16–23 at 0.05).
	nlmsStep = 0.05
	// coldSlackFactor: a cold request may go to a target whose estimate
	// is up to this many times the best (plus coldSlackSeconds) to even
	// out the picks.
	coldSlackFactor  = 1.5
	coldSlackSeconds = 0.005
	// deficitHalfLife is the memory of the deficit in picks per target:
	// a target's picks halve every deficitHalfLife × targets picks of the
	// fleet, so that the deficit follows the traffic of the last few
	// hundred requests rather than the whole life of the router.
	deficitHalfLife = 32
	// coldHalfLife is the memory of the cold picks' count, in picks of the
	// fleet per target: a burst of new conversations is remembered while
	// it lasts and forgotten by the next one, a round of their later turns
	// away. Counted in cold picks only (2 per target), the count carried
	// one burst's spread into the next, which went the other way: five of
	// a round's 13 sessions on one worker, then six on another, each more
	// than its cache holds (multi-turn hit ratio 0.83–0.91× of one big
	// cache's in 4 of 7 runs; TestKVEstimateColdBurstForgetsLastBurst).
	coldHalfLife = 4
	// coldWeight is the weight of the cold picks' count in a cold
	// request's deficit against the picks, intake and held terms. Those
	// follow the past: with a fair share of 30 picks and 10,000 tokens
	// one new conversation moves them by a few hundredths, so a burst of
	// new conversations all went to the target behind on its past
	// (multi-turn: six of a round's 13 new sessions on one worker, more
	// than its cache holds once they grow; hit ratio 0.47–0.64 of one
	// big cache's 0.651 from run to run). The count moves by a third or
	// more of its fair share per request and alternates them.
	coldWeight = 3
	// coldSlackOwn widens the cold slack by this many times the
	// request's own prefill at the best target's rate.
	coldSlackOwn = 2
	// longColdSlack: a cold prompt above longColdShare of the best
	// target's cache waits at most this many times its own prefill
	// beyond the best estimate (no factor, no coldSlackOwn). The wide
	// slack admitted about half a second of queue for a 3,000-token
	// prompt, and such prompts made a good part of the trace's tail:
	// requests over 0.8× round-robin's p90 that their own prefill would
	// not have put there, 33.5 → 25 a run, modelled p90 182.6 → 179.8
	// ms (docs/performance.md, session 28, h2).
	longColdSlack = 0.1
)

// ttftModel is a target's estimate state, guarded by kvTarget.mu.
type ttftModel struct {
	base, perKTok, perDecode float64 // seconds; seconds per 1000 tokens; seconds per sequence
	samples                  int64

	queued   float64     // uncached prompt tokens of tickets before their first token
	decoding int         // tickets past their first token
	flight   []*kvTicket // tickets in flight here, in pick order
	outs     float64     // the max_tokens of the tickets in flight
	outFrac  float64     // the share of max_tokens answers used (learnt from their usage)
	perOut   float64     // seconds from the first token to the end, per max_tokens (learnt at release)
	picks    float64     // picks, decayed by the fleet's picks since picksAt (pickCount)
	picksAt  int64       // KVAware.seq at the last update of picks and fills
	fills    float64     // uncached prompt tokens charged here, decayed as picks
	colds    float64     // cold picks, decayed by the fleet's picks since coldsAt
	coldsAt  int64       // KVAware.seq at the last update of colds

	// The eviction-aware view (see "Eviction" below).
	intake float64                 // uncached prompt tokens charged here, ever: the cache's intake clock
	live   [livePrompts]livePrompt // the latest prompts used here
}

// Eviction. An engine's prefix cache is an LRU of fixed capacity: what it
// takes in evicts what was used least recently, and its removal events
// reach the index some time after (the trace, session 11: 97 warm requests
// lost a prefix the index still listed, against 263 that found theirs;
// they were picked a median 294 ms after the last long prefill there,
// against 531). The prediction follows the cache's clock instead: ttftModel.intake counts
// the tokens each target's cache took in: the uncached prompt tokens
// (charged at the pick, corrected by the cached tokens the answer reports:
// noteIntake) and the completion tokens the answer reports (noteOutput:
// without them the trace's holders, whose 400-block caches see answers of
// ~300 tokens, counted as held prefixes the engine had evicted, 0.030–0.045
// of all prompt tokens a run),
// kvTarget.used stamps
// every block of a prompt with it when the request ends, and a prefix the
// index lists counts as held only while the intake since its last use
// stays below the capacity minus the prefix (kvcache.Placements.Held, the
// capacity learnt from the target's own removal events,
// kvcache.Worker.Capacity; until it has evicted anything there is nothing
// to follow). A lost prefix is priced as cold.
//
// A cold prompt longer than a quarter of a cache (longColdShare) evicts a
// good part of wherever it goes: it goes where it evicts the least
// recently used of the latest prompts each target holds (ttftModel.live,
// each weighted by how recently it was used: liveHalfLife), not onto a live
// long one, among the targets within the cold slack; the deficit chooses
// among those that lose little more than the least (lossSlack).

// noteIntake corrects the target's intake clock by an answer's reported
// cached tokens: what the engine prefilled beyond the uncached tokens the
// pick charged (a prefix it had evicted before its removal events came
// in) went into its cache too, and evicted as much. Without it a worker
// whose cache thrashed looked as if it had taken in only what the index
// predicted, and the prefixes it was losing still counted as held.
func (p *KVAware) noteIntake(kt *kvTicket, cached int64) {
	t := kt.target
	t.mu.Lock()
	if extra := float64(kt.promptTokens-cached) - kt.uncached; extra > 0 {
		t.est.intake += extra
	}
	t.mu.Unlock()
}

// livePrompts is how many of the latest prompts a target remembers for the
// cold placement rule: one per running or recent conversation there.
const livePrompts = 8

// livePrompt is one of a target's latest prompts: its blocks, the hash of
// the last of them (the chain names the whole prompt), the intake when it
// was last used and the fleet's pick count then.
type livePrompt struct {
	last   uint64
	blocks int
	at     float64
	seq    int64
}

const (
	// longColdShare: a cold prompt above this share of a target's
	// capacity is placed by what it evicts.
	longColdShare = 0.25
	// liveHalfLife is the weight of an evicted prompt by recency: it
	// halves every liveHalfLife × targets picks of the fleet since its
	// last use.
	liveHalfLife = 8
	// lossSlack: targets whose eviction loss is within this share of the
	// request's own uncached tokens above the least are as good.
	lossSlack = 0.25
	// usedScale is the intake clock's units per token: Placements
	// advances by one unit per recorded hash, a negligible drift at 1024
	// per token.
	usedScale = 1024
	// usedMaxBlocks bounds a target's stamped blocks (Placements); a hash
	// dropped from it is as old as the newest dropped stamp.
	usedMaxBlocks = 1 << 14
)

// useLive notes that the prompt with block hashes hs was used here now: a
// prompt that extends one the target remembers (the next turn of its
// conversation) replaces it, another replaces the least recently used.
func (m *ttftModel) useLive(hs []uint64, seq int64) {
	if len(hs) == 0 {
		return
	}
	slot := -1
	for i := range m.live {
		if r := &m.live[i]; r.blocks > 0 && r.blocks <= len(hs) && hs[r.blocks-1] == r.last {
			slot = i
			break
		}
	}
	if slot < 0 {
		slot = 0
		for i := 1; i < len(m.live); i++ {
			if r, o := &m.live[i], &m.live[slot]; o.blocks > 0 && (r.blocks == 0 || r.seq < o.seq) {
				slot = i
			}
		}
	}
	m.live[slot] = livePrompt{last: hs[len(hs)-1], blocks: len(hs), at: m.intake, seq: seq}
}

// evictLoss is what a cold prompt of uncached tokens taken in here would
// evict of the target's latest prompts (capacity and bs in tokens): the
// tokens of each prompt still held now and not after, weighted by how
// recently it was used (liveHalfLife at fleet pick seq).
func (m *ttftModel) evictLoss(uncached, capacity float64, bs int, seq int64, halfLife float64) float64 {
	loss := 0.0
	for i := range m.live {
		r := &m.live[i]
		if r.blocks == 0 {
			continue
		}
		size := float64(r.blocks * bs)
		room, age := capacity-size, m.intake-r.at
		if age < room && age+uncached >= room {
			loss += size * math.Exp2(-float64(max(0, seq-r.seq))/halfLife)
		}
	}
	return loss
}

func (m *ttftModel) init() {
	m.base, m.perKTok, m.perDecode, m.perOut, m.outFrac = priorBase, priorPerKTok, priorPerDecode, priorPerOut, 1
}

// Admission. An engine starts a request only when its cache has room for
// it: the simulator reserves the prompt and max_tokens at admission, vLLM
// allocates as it goes and preempts a running request when it runs out,
// and either way a request behind a full cache waits for requests there
// to end, in arrival order. The TTFT estimate alone did not see it: on the
// trace (400-block caches, prompts of 2,000–3,500 tokens) 14 of 16 and 19
// of 24 requests that waited over 0.8× round-robin's p90 would have been
// under it without their admission wait (the simulator's
// model_admit_wait_s; docs/performance.md, session 29), and the pick had
// priced them at 11–250 ms.
//
// So a target whose tickets in flight hold, with this request, more than
// its cache (its prompt blocks in flight, shared prefixes once, plus the
// output their max_tokens let them write; the capacity its removal events
// revealed) makes the request wait until enough of them end: each ends at
// its first token (its pick's estimate, or the one it had) plus its
// max_tokens at the target's learnt decode pace (perOut). The estimate is
// then at least that wait plus the request's own prefill.

// The output a request writes is its max_tokens times the share of
// max_tokens the target's answers have used (outFrac, from their usage's
// completion_tokens; all of it before the first): an engine that stops at
// end of sequence writes less than a client's max_tokens of 4,096, and
// counting all of it would price waits for room that vLLM, which
// allocates as it goes, never makes. Answers without usage (a stream that
// did not ask for it) teach nothing.
//
// priorPerOut is the decode pace before a target has ended a stream: 10 ms
// per output token, a loaded GPU's; the simulators of the benchmarks run at
// about 2.5 ms, learnt within a few requests.
const (
	priorPerOut = 0.01
	// lateShare: a ticket still decoding is expected to stay at least
	// this share of its modelled decode yet (remaining).
	lateShare = 0.25
	// perOutStep is the weight of one ended stream in perOut.
	perOutStep = 0.1
	// outFracStep is the weight of one answer's usage in outFrac.
	outFracStep = 0.1
)

// remaining is how long ticket kt is expected to stay at now (unix ns):
// until its first token (its pick's estimate) and then its max_tokens at
// the decode pace, which the prefill queued here stretches (a step that
// prefills a chunk decodes one token of each running request too), and at
// least lateShare of that decode while it has not ended: the pace is an
// average, and the tickets past their modelled end are the ones the
// prefills beside them slowed. Priced to end with their next token, they
// made the trace's requests that needed their room look free to start: of
// those that then waited over 50 ms for room, a third had been priced at
// 25 ms or more, half with the floor (docs/performance.md, session 32).
func (m *ttftModel) remaining(kt *kvTicket, now int64) float64 {
	stretch := m.perKTok * m.queued / 1000
	if kt.first {
		return max(m.perOut, lateShare*kt.out*m.perOut, float64(kt.firstAt-now)/1e9+kt.out*m.perOut+stretch)
	}
	return max(0, float64(kt.wall-now)/1e9+kt.pred) + kt.out*m.perOut + stretch
}

// admitWait is how long a request waits here until excess tokens of the
// cache are freed: the tickets in flight end in order of their remaining
// time, each freeing its prompt (bs-token blocks) and max_tokens. Tickets
// that end together free together. When all of them together do not free
// enough the wait is the last one's: the engine is then empty.
func (m *ttftModel) admitWait(excess float64, now int64, bs float64) float64 {
	last, freed := -1.0, 0.0
	for freed < excess {
		next := math.Inf(1)
		for _, kt := range m.flight {
			if r := m.remaining(kt, now); r > last && r < next {
				next = r
			}
		}
		if math.IsInf(next, 1) {
			break
		}
		for _, kt := range m.flight {
			if m.remaining(kt, now) == next {
				freed += float64(len(kt.hashes))*bs + kt.out*m.outFrac
			}
		}
		last = next
	}
	return max(0, last)
}

// admitEstimate is estimate with the admission wait: room for this
// request's prompt tokens beyond the prefix running requests hold and its
// out max_tokens, against held prompt tokens in flight, the tickets'
// outputs and a capacity of capTokens (0: unknown, no wait). It returns the
// estimate and the wait in it.
func (m *ttftModel) admitEstimate(uncached, prompt, out, held, capTokens float64, now int64, bs float64) (est, wait float64) {
	est = m.estimate(uncached)
	if capTokens <= 0 {
		return est, 0
	}
	if excess := held + (m.outs+out)*m.outFrac + prompt - capTokens; excess > 0 && len(m.flight) > 0 {
		wait = m.admitWait(excess, now, bs)
		est = max(est, wait+m.base+m.perKTok*uncached/1000)
	}
	return est, wait
}

// noteOutput learns from one answer's completion tokens the share of
// max_tokens the target's answers use, and advances its intake clock by
// them: what a request writes goes into the cache as well, and evicts as
// much as a prompt would.
func (p *KVAware) noteOutput(kt *kvTicket, completion int64) {
	t := kt.target
	t.mu.Lock()
	t.est.intake += float64(completion)
	if kt.out >= 1 {
		t.est.outFrac += outFracStep * (min(1, float64(completion)/kt.out) - t.est.outFrac)
	}
	t.mu.Unlock()
}

// noteEnd learns the decode pace from a ticket that ended well at now:
// its time from first token to end, per max_tokens.
func (m *ttftModel) noteEnd(kt *kvTicket, now int64) {
	if !kt.first || kt.out < 1 || now <= kt.firstAt {
		return
	}
	m.perOut += perOutStep * (float64(now-kt.firstAt)/1e9/kt.out - m.perOut)
}

// estimate is the modelled TTFT of a request with uncached prompt tokens
// picked here now.
func (m *ttftModel) estimate(uncached float64) float64 {
	return m.base + m.perKTok*(m.queued+uncached)/1000 + m.perDecode*float64(m.decoding)
}

// learn updates the coefficients with one observation: a request that
// found work prompt tokens (its own uncached ones included) queued and dec
// sequences decoding got its first token after ttft seconds.
func (m *ttftModel) learn(work float64, dec int, ttft float64) {
	x0, x1, x2 := 1.0, work/1000, float64(dec)
	err := ttft - (m.base*x0 + m.perKTok*x1 + m.perDecode*x2)
	g := nlmsStep * err / (1 + x0*x0 + x1*x1 + x2*x2)
	m.base = max(0, m.base+g*x0)
	m.perKTok = max(minPerKTok, m.perKTok+g*x1)
	m.perDecode = max(0, m.perDecode+g*x2)
	m.samples++
}

// pickCount returns the target's picks as seen at fleet pick seq, halving
// every halfLife picks of the fleet.
func (m *ttftModel) pickCount(seq int64, halfLife float64) float64 {
	if d := seq - m.picksAt; d > 0 && m.picks > 0 {
		return m.picks * math.Exp2(-float64(d)/halfLife)
	}
	return m.picks
}

// fillCount returns the uncached tokens charged here (what the target's
// cache has to take in) as seen at fleet pick seq, decayed as picks.
func (m *ttftModel) fillCount(seq int64, halfLife float64) float64 {
	if d := seq - m.picksAt; d > 0 && m.fills > 0 {
		return m.fills * math.Exp2(-float64(d)/halfLife)
	}
	return m.fills
}

// coldCount returns the target's cold picks as seen at fleet pick seq,
// halving every halfLife picks of the fleet.
func (m *ttftModel) coldCount(seq int64, halfLife float64) float64 {
	if d := seq - m.coldsAt; d > 0 && m.colds > 0 {
		return m.colds * math.Exp2(-float64(d)/halfLife)
	}
	return m.colds
}

// enterCold counts a cold pick; seq is the fleet's pick count before it.
func (m *ttftModel) enterCold(seq int64, halfLife float64) {
	m.colds = m.coldCount(seq, halfLife) + 1
	m.coldsAt = seq
}

// enter charges a picked ticket to the target: uncached prompt tokens, out
// max_tokens (0 when not given), an estimated TTFT of pred seconds of
// which wait for admission; seq is the fleet's pick count before this pick.
func (m *ttftModel) enter(kt *kvTicket, uncached, out, pred, wait float64, seq int64, halfLife float64) {
	kt.uncached = uncached
	kt.work = m.queued + uncached
	kt.dec = m.decoding
	kt.out, kt.pred, kt.wait = out, pred, wait
	kt.first = false
	kt.wall = time.Now().UnixNano()
	kt.slot = len(m.flight)
	m.flight = append(m.flight, kt)
	m.queued += uncached
	m.outs += out
	m.intake += uncached
	m.picks = m.pickCount(seq, halfLife) + 1
	m.fills = m.fillCount(seq, halfLife) + uncached
	m.picksAt = seq
}

// leave removes a ticket at its release.
func (m *ttftModel) leave(kt *kvTicket) {
	i := kt.slot
	if i < 0 || i >= len(m.flight) || m.flight[i] != kt {
		return
	}
	last := len(m.flight) - 1
	m.flight[i] = m.flight[last]
	m.flight[i].slot = i
	m.flight[last] = nil
	m.flight = m.flight[:last]
	kt.slot = -1
	kt.signalFirst()
	m.outs = max(0, m.outs-kt.out)
	if kt.first {
		m.decoding--
	} else {
		m.queued = max(0, m.queued-kt.uncached)
	}
}

// firstToken implements firstTokenHook: the stream picked with ticket
// state (a *kvTicket of this policy, or nothing to learn from) got its
// first event at now. The ticket itself says which request it was: matched
// by time instead (the latest ticket picked before the stream's start),
// no stream found its own, whose pick comes after the start the attempt
// stamps, and each first event went to an older ticket still waiting there
// or to none — a long prefill left the queue when a request behind it got
// its first token, requests that had theirs stayed queued until they
// ended, and the model learnt from the times in between (the trace: 250
// of 536 first events matched, a base of 0.10–0.12 s and 0.02–0.03 s per
// decoding sequence learnt against the simulators' 2 ms and 0.2 ms).
func (kw *kvWorker) firstToken(state any, now int64) {
	kt, ok := state.(*kvTicket)
	if !ok || kt == nil {
		return
	}
	t := kt.target
	if t == nil || t.worker != kw.w {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	m := &t.est
	// Released already, or past its first token?
	if kt.slot < 0 || kt.slot >= len(m.flight) || m.flight[kt.slot] != kt || kt.first {
		return
	}
	kt.first = true
	kt.firstAt = now
	kt.signalFirst()
	m.queued = max(0, m.queued-kt.uncached)
	m.decoding++
	// A request priced to wait for room in the cache measures mostly that
	// wait, not the prefill and decode rates the coefficients stand for.
	if ttft := float64(now-kt.wall) / float64(time.Second); ttft > 0 && kt.wait == 0 {
		m.learn(kt.work, kt.dec, ttft)
	}
}

// TTFTModel is a target's learned estimate, for tests and diagnostics.
type TTFTModel struct {
	Base, PerKTokens, PerDecode float64 // seconds
	Samples                     int64
	Queued                      float64 // prompt tokens before their first token
	Decoding                    int
}

// TTFTModels returns the estimate state of every target of a worker.
func (p *KVAware) TTFTModels(workerID string) []TTFTModel {
	p.mu.Lock()
	kw, ok := p.workers[workerID]
	p.mu.Unlock()
	if !ok {
		return nil
	}
	var out []TTFTModel
	for _, t := range *kw.targets.Load() {
		t.mu.RLock()
		m := &t.est
		out = append(out, TTFTModel{Base: m.base, PerKTokens: m.perKTok, PerDecode: m.perDecode,
			Samples: m.samples, Queued: m.queued, Decoding: m.decoding})
		t.mu.RUnlock()
	}
	return out
}
