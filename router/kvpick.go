package router

import (
	"encoding/binary"
	"math"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/openai"
)

// kvScratch is one Pick's working memory, pooled so that a warm pick with a
// bytes or token-array prompt allocates nothing.
type kvScratch struct {
	text   []byte   // rendered chat, unescaped prompt, or engine I/O
	tokens []uint32 // the prompt's token ids
	sets   []hashSet
	nsets  int

	targets []*kvTarget
	setOf   []int     // per target: its hash set
	hits    []int     // per target: cached prefix (index or placements)
	indexed []int     // per target: the prefix the index lists (provisional hits not counted)
	effs    []int     // per target: hits or the prefix in flight there
	flights []int     // per target: the prompt's prefix in flight there (--kv-cost ttft)
	costs   []float64 // per target: its cost
	uncs    []float64 // per target: uncached prompt tokens (--kv-cost ttft)
	fills   []float64 // per target: decayed uncached tokens charged (--kv-cost ttft)
	held    []float64 // per target: distinct prompt blocks in flight (--kv-cost ttft)
	colds   []float64 // per target: decayed cold picks (--kv-cost ttft)
	loss    []float64 // per target: what a long cold prompt would evict there (--kv-cost ttft)
	longs   []bool    // per target: the cold prompt is long there (longColdShare; --kv-cost ttft)
	listed  []int     // per target: the prefix the index lists, before the eviction cut (--kv-cost ttft)
	rates   []float64 // per target: learned seconds per 1000 prefill tokens (--kv-cost ttft)
	preds   []float64 // per target: the estimated TTFT, before redoCost (--kv-cost ttft)
	waits   []float64 // per target: of it, the wait for room in the cache (--kv-cost ttft)
	maxOut  float64   // the request's max_tokens, 0 when not given (--kv-cost ttft)
	filling []bool    // per target: prefilling the prompt's held prefix for an earlier request (--kv-cost ttft)
	picks   []float64 // per target: its recent picks (shareHalfLife)
	handles []*kvcache.Worker
	out     []int
	pos     []int // target positions of handles
	img     xxhash.Digest
}

// hashSet is the prompt's block hashes for one block size (a fleet mostly
// has one).
type hashSet struct {
	bs     int
	hashes []uint64
}

var kvScratchPool = sync.Pool{New: func() any { return new(kvScratch) }}

// maxRetainTokens bounds the scratch a pooled kvScratch keeps: one huge
// prompt must not pin its buffers forever.
const maxRetainTokens = 1 << 18

// release drops references to fleet objects (a detached worker must not
// stay reachable from the pool) and oversized buffers, then pools sc.
func (sc *kvScratch) release() {
	clear(sc.targets)
	clear(sc.handles)
	if cap(sc.tokens) > maxRetainTokens {
		sc.tokens = nil
	}
	if cap(sc.text) > 4*maxRetainTokens {
		sc.text = nil
	}
	for i := range sc.sets {
		if cap(sc.sets[i].hashes) > maxRetainTokens/16 {
			sc.sets[i].hashes = nil
		}
	}
	kvScratchPool.Put(sc)
}

// keyKind says how a request is keyed for matching.
type keyKind uint8

const (
	keyTokens keyKind = iota // token block hashes: index and placements
	keyText                  // byte-chunk hashes of the raw prompt JSON: placements only
	keyImages                // a chain from the image references: placements only
)

// bytesPerToken is the text a token is reckoned at where there are no
// tokens: text chunks of bytesPerToken × block size bytes stand for one
// block.
const bytesPerToken = 4

// set returns the hash set for block size bs, computing it on first use.
func (sc *kvScratch) set(bs int) int {
	for i := range sc.nsets {
		if sc.sets[i].bs == bs {
			return i
		}
	}
	if sc.nsets == len(sc.sets) {
		sc.sets = append(sc.sets, hashSet{})
	}
	i := sc.nsets
	sc.nsets++
	s := &sc.sets[i]
	s.bs = bs
	s.hashes = kvcache.AppendBlockHashes(s.hashes[:0], sc.tokens, bs)
	return i
}

// Pick implements Policy. A hold on a leader's prefill (kvcoalesce.go) is
// waited out after the pick, which infera_router_kv_pick_seconds times
// without it.
func (p *KVAware) Pick(in *PickInput, c *Candidates) (Ticket, error) {
	var hold coalesceHold
	tk, err := p.pick(in, c, &hold)
	if hold.first != nil {
		p.await(hold, in.RequestID)
	}
	return tk, err
}

// pick is Pick but for the hold, which it sets in *hold.
func (p *KVAware) pick(in *PickInput, c *Candidates, hold *coalesceHold) (Ticket, error) {
	n := len(c.Workers)
	if n == 0 {
		return Ticket{}, ErrNoWorker
	}
	began := time.Now()
	sc := kvScratchPool.Get().(*kvScratch)
	defer p.pickDone(sc, began)
	rot := c.Next()

	sc.targets = sc.targets[:0]
	for _, w := range c.Workers {
		if kw, ok := w.PolicyState.(*kvWorker); ok {
			sc.targets = append(sc.targets, *kw.targets.Load()...)
		}
	}
	nt := len(sc.targets)
	if nt == 0 {
		// Not attached to this policy (cannot happen through Router).
		return Ticket{Worker: c.Workers[rot%uint64(n)]}, nil
	}
	start := int(rot % uint64(nt))

	kind := p.keyPrompt(in, sc, sc.targets[start].worker)
	now := p.cfg.Now().UnixNano()
	seq, halfLife := p.seq.Load(), deficitHalfLife*float64(nt)
	coldHL := coldHalfLife * float64(nt)

	// Hashes and cached prefixes per target.
	sc.setOf = grow(sc.setOf, nt)
	sc.hits = grow(sc.hits, nt)
	sc.indexed = grow(sc.indexed, nt)
	for i, t := range sc.targets {
		if kind == keyTokens {
			sc.setOf[i] = sc.set(t.blockSize())
		} else {
			sc.setOf[i] = 0
		}
		sc.hits[i] = 0
		sc.indexed[i] = 0
	}
	if kind == keyTokens {
		p.matchIndex(sc)
	}
	for i, t := range sc.targets {
		hs := sc.sets[sc.setOf[i]].hashes
		switch {
		case kind != keyTokens || !t.precise():
			sc.hits[i] = max(sc.hits[i], t.place.Match(hs, now), t.keep.Match(hs, now))
		case t.prov != nil:
			// Provisional hits: what this router placed there within the
			// event-latency window counts as cached until events land. It
			// holds only the blocks beyond what the index listed at each
			// pick (commit), so it is matched from the indexed prefix on.
			sc.indexed[i] = sc.hits[i]
			sc.hits[i] += t.prov.Match(hs[sc.hits[i]:], now)
		}
	}

	// Costs, and each target's recent share of picks.
	sc.costs = growF(sc.costs, nt)
	sc.picks = growF(sc.picks, nt)
	sc.effs = grow(sc.effs, nt)
	if p.ttft {
		sc.uncs = growF(sc.uncs, nt)
		sc.rates = growF(sc.rates, nt)
		sc.fills = growF(sc.fills, nt)
		sc.held = growF(sc.held, nt)
		sc.colds = growF(sc.colds, nt)
		sc.listed = grow(sc.listed, nt)
		sc.filling = growB(sc.filling, nt)
		sc.flights = grow(sc.flights, nt)
		sc.preds = growF(sc.preds, nt)
		sc.waits = growF(sc.waits, nt)
	}
	// The output room the engine keeps for this request (admission).
	sc.maxOut = 0
	if in.Request != nil && in.Request.MaxTokens > 0 {
		sc.maxOut = float64(in.Request.MaxTokens)
	}
	wallNow := time.Now().UnixNano()
	total := 0.0
	warm := false // some target holds a quarter of the prompt, minWarmBlocks at least
	for i, t := range sc.targets {
		hs := sc.sets[sc.setOf[i]].hashes
		t.mu.RLock()
		flight := 0
		for flight < len(hs) {
			if !t.active.Has(hs[flight]) {
				break
			}
			flight++
		}
		active := t.active.Len()
		recent := p.decayed(t.recent, t.recentAt, now)
		picks := decayedFor(t.picks, t.picksAt, now, shareHalfLife)
		intake := t.est.intake
		t.mu.RUnlock()
		if p.ttft {
			sc.listed[i] = sc.hits[i]
		}
		if p.ttft && sc.hits[i] > 0 && kind == keyTokens && t.used != nil && t.precise() {
			// What the index lists but the cache has had to evict since
			// (its removal events not in yet) is priced as cold.
			if c := int64(t.idx.Capacity()); c > 0 {
				bs := int64(sc.sets[sc.setOf[i]].bs) * usedScale
				sc.hits[i] = t.used.Held(hs[:sc.hits[i]], int64(intake*usedScale), c*bs, bs)
			}
		}
		// A prefix being prefilled for a request in flight is as good as
		// cached by the time this one runs. Block hashes chain, so the
		// in-flight blocks this request shares are exactly that prefix.
		eff := max(sc.hits[i], flight)
		w := p.overlapWeight(t.worker)
		// Load: the distinct prompt blocks in flight there with this
		// request added. Cached blocks count too: they are the cache
		// footprint of what runs there, and a worker whose running
		// conversations fill its cache must not also take new ones (tried:
		// counting only the prefill still queued let long conversations
		// pile onto one worker, which then evicted them; multi-turn hit
		// ratio 0.35–0.61 from run to run against 0.60–0.61).
		load := float64(active + len(hs) - flight)
		sc.costs[i] = w*float64(len(hs)-eff) + load + recent
		sc.picks[i] = picks
		if p.ttft {
			u := promptUncached(sc, kind, t, len(hs), eff, p.cfg.DefaultBlockSize)
			// Room in the cache: the blocks in flight there (a prefix
			// shared with them once) and their outputs against what its
			// removal events revealed (kvestimate.go, "Admission").
			bs, capTokens := float64(t.blockSize()), 0.0
			if t.idx != nil {
				capTokens = float64(t.idx.Capacity()) * bs
			}
			t.mu.RLock()
			sc.costs[i], sc.waits[i] = t.est.admitEstimate(u, float64(len(hs)-flight)*bs, sc.maxOut, float64(active)*bs, capTokens, wallNow, bs)
			sc.preds[i] = sc.costs[i]
			sc.uncs[i], sc.rates[i] = u, t.est.perKTok
			sc.picks[i] = t.est.pickCount(seq, halfLife)
			sc.fills[i] = t.est.fillCount(seq, halfLife)
			sc.held[i] = float64(active)
			sc.colds[i] = t.est.coldCount(seq, coldHL)
			sc.filling[i] = t.est.prefilling(hs[:eff])
			sc.flights[i] = flight
			t.mu.RUnlock()
		}
		sc.effs[i] = eff
		total += picks
		if eff >= minWarmBlocks && 4*eff >= len(hs) {
			warm = true
		}
	}
	// Cold-request spreading (MaxShare): a request that no target holds a
	// quarter of (and minWarmBlocks of) goes to the lowest cost among the targets within their share
	// — once the fleet is busy enough to measure shares (minShareFair), a
	// target that recently got more than MaxShare × its fair share of
	// picks (plus one) sits out, unless all do. Cold requests have little
	// to lose by going elsewhere, and they are what load-ranked picks pile
	// onto one worker; a request whose prefix a target holds keeps its
	// cache (moving a conversation off the worker that holds it cost more
	// than the imbalance: multi-turn hit ratio 0.545 against 0.60). The
	// scan starts at the rotating cursor and keeps the first minimum, so
	// ties rotate.
	if p.ttft {
		// Only a request that no target holds is counted as a new home
		// (enterCold), also when a shared prefix is placed like one below.
		newHome := !warm
		if warm && sharedHome(sc, nt) {
			// A prefix that several targets hold alike (the shared system
			// prompt a new conversation starts with) makes none of them
			// its home: the request is placed as a new conversation, by
			// the deficit among the targets within the cold slack. By the
			// estimate alone the new conversations of a popular system
			// prompt followed its first holders, and only the warm share
			// bound spilled them (conversation: 288 of 300 picks warm, the
			// busiest worker 1.08–1.29× fair from repeat to repeat).
			warm = false
		}
		p.longCopyLoss(sc, nt, kind, seq)
		b := p.pickByEstimate(sc, nt, start, warm)
		if e := p.log.Debug(); e.Enabled() {
			logPick(e.Bytes("request_id", in.RequestID), sc, nt, b, warm, seq)
		}
		if newHome {
			// The cold count alternates the new homes of a burst, which
			// the past picks cannot (coldWeight). A request on a prefix
			// several targets hold is placed among its holders; counted as
			// cold, it charged a holder that serves shared prefixes beside
			// few of its own with the heaviest term of the deficit while it
			// was furthest below its fair share of picks, and the deficit
			// sent the prefix's next requests to the other holders
			// (shared-prefix: a worker at 0.64× fair on the decayed picks,
			// cold term 3–7 against the others' 0.3–3; busiest 1.15–1.16×
			// fair over the run, issue 37, session 25).
			t := sc.targets[b]
			t.mu.Lock()
			t.est.enterCold(seq, coldHL)
			t.mu.Unlock()
		}
		return p.commit(in, sc, kind, now, b, seq, halfLife, hold)
	}
	share := p.cfg.MaxShare
	if warm {
		share = p.cfg.MaxShareWarm
	}
	bound := math.Inf(1)
	if fair := total / float64(nt); share > 0 && fair >= minShareFair {
		bound = share*fair + 1
	}
	best := -1
	for pass := 0; best < 0 && pass < 2; pass++ {
		bestCost := 0.0
		for k := range nt {
			i := (start + k) % nt
			if pass == 0 && sc.picks[i] >= bound {
				continue
			}
			if best < 0 || sc.costs[i] < bestCost {
				best, bestCost = i, sc.costs[i]
			}
		}
	}

	return p.commit(in, sc, kind, now, best, 0, 0, hold)
}

// pickDone pools the scratch and observes the pick's duration.
func (p *KVAware) pickDone(sc *kvScratch, began time.Time) {
	sc.release()
	p.m.pickSeconds.Observe(time.Since(began).Seconds())
}

// commit charges the request to target best and returns its ticket.
// seq and halfLife are the deficit's clock (--kv-cost ttft).
func (p *KVAware) commit(in *PickInput, sc *kvScratch, kind keyKind, now int64, best int, seq int64, halfLife float64, hold *coalesceHold) (Ticket, error) {
	t := sc.targets[best]
	hs := sc.sets[sc.setOf[best]].hashes
	bestEff := sc.effs[best]
	miss := len(hs) - bestEff
	kt := ticketPool.Get().(*kvTicket)
	kt.target = t
	kt.miss = miss
	kt.slot = -1
	kt.touch = 0
	kt.hashes = append(kt.hashes[:0], hs...)
	kt.stream = in.Request != nil && in.Request.Stream
	kt.predTokens, kt.promptTokens = divergenceTokens(sc, kind, best)
	precise := kind == keyTokens && t.precise()
	t.mu.Lock()
	if p.ttft && precise {
		// Before this ticket enters: it must not find itself.
		confirmed := sc.listed[best]
		if t.prov != nil {
			confirmed = sc.indexed[best]
		}
		*hold = p.holdFor(t, hs, sc.flights[best], confirmed)
	}
	t.active.AddAll(hs)
	t.picks = decayedFor(t.picks, t.picksAt, now, shareHalfLife) + 1
	t.picksAt = now
	if p.ttft {
		t.est.enter(kt, promptUncached(sc, kind, t, len(hs), bestEff, p.cfg.DefaultBlockSize), sc.maxOut, sc.preds[best], sc.waits[best], seq, halfLife)
		if kind == keyTokens {
			t.est.useLive(hs, seq)
		}
	}
	t.mu.Unlock()
	if p.ttft {
		p.seq.Add(1)
	}

	// The retention class the engine is told (cachehints.go) decides what
	// the router expects it to keep: nothing for none; a prompt marked
	// long (prompt_cache_retention, Anthropic cache_control) is also
	// remembered for keepTTL.
	ret := openai.RetentionUnset
	if in.Request != nil {
		ret = in.Request.Retention
	}
	if !precise {
		switch ret {
		case openai.RetentionNone:
		case openai.RetentionLong:
			t.place.Record(hs, now)
			t.keep.Record(hs, now)
		default:
			t.place.Record(hs, now)
		}
	} else {
		if t.prov != nil && ret != openai.RetentionNone {
			// Only the blocks the index does not list there: recording the
			// whole prompt at every pick was ~190 instructions a block
			// (issue 36, docs/performance.md), for blocks already indexed.
			// Provisional ones are recorded again, which keeps a prefix
			// newer than the blocks that hang from it.
			t.prov.Record(hs[sc.indexed[best]:], now)
		}
		// Engines report no event on a cache hit; the prefix the router
		// just relied on is kept from being the index's first eviction
		// (provisional blocks not yet indexed are skipped) when the
		// request ends (Release): Touch takes the index's write lock,
		// which every event batch of every worker takes too, and at 512
		// workers a pick waiting there behind the streams' batches took
		// milliseconds instead of microseconds.
		kt.touch = sc.hits[best]
	}
	if kind == keyTokens && t.idx != nil {
		// For blocks the engine chains from a parent this index never saw
		// (kvcache/learn.go).
		p.idx.NotePrompt(t.idx, sc.tokens, hs, t.blockSize())
	}
	if p.peer != nil && kind == keyTokens {
		p.peer.direct(p, sc, best)
	}
	p.m.observe(kind, precise, len(hs), bestEff)
	t.promptBlocks.Add(uint64(len(hs)))
	t.hitBlocks.Add(uint64(bestEff))
	return Ticket{Worker: t.worker, State: kt, PinRank: t.pin, DPRank: t.key.DPRank}, nil
}

// pickByEstimate returns the target of the lowest cost (sc.costs: the
// estimated TTFT, plus the prefill a target that holds less of the prompt
// than the best holder makes the fleet redo, plus what a long copy evicts
// there) for a warm request; for a cold one, the target furthest below its
// fair shares of the decayed picks (sc.picks), cache intake (sc.fills),
// blocks in flight (sc.held) and cold picks (sc.colds, weighted
// coldWeight) among those whose cost is within the cold slack of the best
// and (when any is) within the share bound
// (MaxShareWarm × the fair share of the decayed picks, this one counted).
// A warm choice that would take its target above the bound goes
// instead to the lowest cost within the bound and the slack, or within the
// bound alone when the target is above twice the bound's excess
// (kvestimate.go). Scans start at the rotating cursor and keep the first
// minimum.
func (p *KVAware) pickByEstimate(sc *kvScratch, nt, start int, warm bool) int {
	redoCost(sc, nt)
	if warm {
		// A warm request moved off its holder is copied into its target's
		// cache; where the copy is long (longCopyLoss) it also pays, at the
		// target's rate, for the recent prompts it would evict there, which
		// their next turns prefill again. Without it the moves left behind
		// prefixes their holders still held, 0.011 of the trace's prompt
		// tokens a run against 0.006 with it (hit ratio 0.315 against
		// 0.321; medians of 10 alternated pairs). Short copies price as
		// before: the unrestricted charge pushed shared-prefix's busiest
		// worker above 1.15× fair (docs/performance.md, issue 37, sessions
		// 16 and 36).
		for i := range nt {
			if sc.longs[i] {
				sc.costs[i] += sc.rates[i] * sc.loss[i] / 1000
			}
		}
	}
	best := start
	for k := 1; k < nt; k++ {
		if i := (start + k) % nt; sc.costs[i] < sc.costs[best] {
			best = i
		}
	}
	if warm {
		best = followPrefill(sc, nt, start, best)
	}
	limit := sc.costs[best]*coldSlackFactor + coldSlackSeconds
	switch {
	case !warm && sc.longs[best]:
		// A long cold prompt is most of its own TTFT already: it goes
		// where it starts soonest, give or take a tenth of its prefill.
		limit = sc.costs[best] + coldSlackSeconds + longColdSlack*sc.rates[best]*sc.uncs[best]/1000
	case !warm:
		// A cold request may also wait behind about two requests of its
		// own size: a new conversation stays where it starts, and one
		// short queue must not send a whole burst of them elsewhere.
		limit += coldSlackOwn * sc.rates[best] * sc.uncs[best] / 1000
	}
	total, fills, held, colds := 1.0, 0.0, 0.0, 0.0
	for i := range nt {
		total += sc.picks[i]
		fills += sc.fills[i]
		held += sc.held[i]
		colds += sc.colds[i]
	}
	fair := total / float64(nt)
	share := p.cfg.MaxShareWarm
	if !warm {
		// The deficit of a cold request (or one without a home) is against
		// three fair shares: of the picks (the balance
		// over the run, below the share bound), of the uncached tokens (what
		// each cache has to take in: by count alone a few long one-off prompts
		// evicted one worker's prefixes: trace hit ratio 0.60 of one big
		// cache's against 0.76 with it, single runs), and of the prompt blocks
		// held by requests in flight (what each cache must keep now: without
		// it new conversations joined the worker whose running ones filled its
		// cache, multi-turn 0.74 against 0.95 with it, single runs). Each fair
		// share is floored at what this request adds (its uncached tokens, its
		// blocks): shares far smaller than that are noise, not a deficit.
		fairFill := max(fills/float64(nt), sc.uncs[best], 1)
		fairHeld := max(held/float64(nt), float64(len(sc.sets[sc.setOf[best]].hashes)), 1)
		// The fourth term is the cold picks themselves, with a memory of
		// about one burst (coldHalfLife) and coldWeight times the weight
		// of the others: see coldWeight.
		fairCold := max(colds/float64(nt), 1) / coldWeight
		score := func(i int) float64 {
			return sc.picks[i]/fair + sc.fills[i]/fairFill + sc.held[i]/fairHeld + sc.colds[i]/fairCold
		}
		// A long cold prompt goes where it evicts least (longCopyLoss).
		least := math.Inf(1)
		for i := range nt {
			if sc.costs[i] <= limit {
				least = min(least, sc.loss[i])
			}
		}
		// Only a target above the warm requests' bound sits out, so that
		// the requests with a home there can stay (kvestimate.go).
		bound := math.Inf(1)
		if share > 0 && fair >= minShareFair {
			bound = share * fair
		}
		eligible := func(i int, pass int) bool {
			return sc.costs[i] <= limit && sc.loss[i] <= least+lossSlack*sc.uncs[i] &&
				(pass > 0 || sc.picks[i]+1 <= bound)
		}
		cold, low := -1, math.Inf(1)
		for pass := 0; cold < 0 && pass < 2; pass++ {
			if eligible(best, pass) {
				cold, low = best, score(best)
			}
			for k := range nt {
				if i := (start + k) % nt; eligible(i, pass) {
					if v := score(i); v < low {
						cold, low = i, v
					}
				}
			}
		}
		return cold
	}
	// One pick of allowance above the bound, as the block cost's has: at
	// the small fair shares of a router that has just started (8–12
	// picks), one pick of noise above fair is above 1.15× fair, and twice
	// the excess two picks; a restarted router spilled 4–9 warm requests
	// a run off holders that were one or two picks ahead, and the copies
	// evicted the prefixes the caches held (TestKVRouterRestart: hit ratio
	// 0.76–0.77 against 0.81–0.84 in the runs without such spills).
	bound := share*fair + 1
	if share <= 0 || fair < minShareFair || sc.picks[best]+1 <= bound {
		return best
	}
	// Above the bound: the lowest cost among the targets within it, if
	// that one answers within the slack. A hot prefix spreads to a second
	// holder; a long conversation stays where its history is. Only a
	// target above twice the bound's excess gives up a request whatever
	// the cost: the one copy that gives a hot prefix a second holder
	// (tried: moving every request above the bound whatever the cost kept
	// every workload within 1.1× fair, but sent 100-block histories to
	// workers 10× slower to answer: hit ratio 0.82–0.91 of one big cache's
	// against 0.96–0.98, conversation TTFT p99 4.3 s).
	// The slack is the cold one here, about two of the request's own
	// prefills wider: a request whose prefix is short beside what it adds
	// (a new conversation on a system prompt that one target holds) moves
	// at the price of that prefix, a long history does not (conversation:
	// the new conversations of the largest group, a quarter of the
	// traffic, all stayed on its one holder; busiest 1.15–1.29× fair).
	limit += coldSlackOwn * sc.rates[best] * sc.uncs[best] / 1000
	alt := -1
	for k := range nt {
		i := (start + k) % nt
		if sc.picks[i]+1 <= bound && sc.costs[i] <= limit && (alt < 0 || sc.costs[i] < sc.costs[alt]) {
			alt = i
		}
	}
	// A prefix that requests in flight on the target also run on, whole,
	// and that is not being prefilled there (followPrefill), is shared:
	// a group's prompt or a system prompt, not one conversation's own
	// history, whose next turn waits for its last one. A copy of it
	// elsewhere serves the next requests on it too, and sharedHome then
	// splits them among the holders by the deficit, so such a request
	// leaves a target above the bound whatever the cost, not only above
	// twice the excess. With the 2× rule alone a worker whose groups drew
	// more requests stayed at 1.15–1.2× fair on the decayed picks, below
	// 1.3×, for the whole run, and one whose groups drew fewer at 0.6–0.75×
	// (shared-prefix: busiest 1.12–1.18× fair over the run, against
	// 1.04–1.07× with this). Tried at the fair share instead of the bound
	// (session 22, h3b): the trace's hot prefixes were copied until its
	// hit ratio was 0.86× of one big cache's.
	shared := sc.effs[best] >= minWarmBlocks && sc.flights[best] >= sc.effs[best] && !sc.filling[best]
	if alt < 0 && (shared || sc.picks[best]+1 > (2*share-1)*fair+1) {
		for k := range nt {
			i := (start + k) % nt
			if sc.picks[i]+1 <= bound && (alt < 0 || sc.costs[i] < sc.costs[alt]) {
				alt = i
			}
		}
	}
	if alt < 0 {
		return best
	}
	return alt
}

// logPick writes one debug line per --kv-cost ttft pick (chosen target b):
// the chosen target's and the best holder's view, so that a run's log shows
// where a conversation left the worker holding it and why (the listed
// prefix against the one the eviction cut kept, costs, shares). Its
// request_id joins it to the engine's own record of the request (the
// simulator's model TTFT log). The prompt
// is named by its 4th block hash (a conversation's turns share it) and its
// last one.
func logPick(e *zerolog.Event, sc *kvScratch, nt, b int, warm bool, seq int64) {
	hs := sc.sets[sc.setOf[b]].hashes
	h := 0 // the best holder: the most listed blocks
	for i := 1; i < nt; i++ {
		if sc.listed[i] > sc.listed[h] {
			h = i
		}
	}
	key := uint64(0)
	if len(hs) > minWarmBlocks-1 {
		key = hs[minWarmBlocks-1]
	}
	tb, th := sc.targets[b], sc.targets[h]
	if !warm {
		e.Float64("loss", sc.loss[b])
	}
	// The chosen target's learnt coefficients and queue: what the measured
	// TTFTs had taught the estimate when it chose, so that runs on a quiet
	// and a loaded box can be told apart by more than their outcome.
	tb.mu.RLock()
	base, perDecode, queued, decoding := tb.est.base, tb.est.perDecode, tb.est.queued, tb.est.decoding
	outs, outFrac, perOut, inFlight := tb.est.outs, tb.est.outFrac, tb.est.perOut, len(tb.est.flight)
	active := tb.active.Len()
	tb.mu.RUnlock()
	capBlocks := 0
	if tb.idx != nil {
		capBlocks = tb.idx.Capacity()
	}
	// The admission view: what the chosen target's cache holds for the
	// requests in flight there against what its events revealed.
	e.Float64("admit_wait_seconds", sc.waits[b]).Int("capacity_blocks", capBlocks).Int("active_blocks", active).
		Float64("flight_outs", outs).Float64("out_frac", outFrac).Float64("per_out_seconds", perOut).Int("in_flight", inFlight)
	e.Float64("base_seconds", base).Float64("per_decode_seconds", perDecode).
		Floats64("all_per_ktok_seconds", sc.rates[:nt]).Float64("queued_tokens", queued).Int("decoding", decoding)
	e.Int64("pick_seq", seq).Bool("warm", warm).Int("target", b).Int("holder", h).
		Floats64("costs_seconds", sc.costs[:nt]).Floats64("all_picks", sc.picks[:nt]).
		Floats64("all_colds", sc.colds[:nt]).Floats64("all_fills", sc.fills[:nt]).Floats64("all_held", sc.held[:nt]).Uint64("prompt_key", key).Int("blocks", len(hs)).
		Str("worker_id", tb.worker.id).Int("dp_rank", tb.key.DPRank).
		Int("listed", sc.listed[b]).Int("eff", sc.effs[b]).Float64("cost_seconds", sc.costs[b]).
		Float64("picks", sc.picks[b]).Float64("colds", sc.colds[b]).Float64("uncached", sc.uncs[b]).
		Str("holder_id", th.worker.id).Int("holder_listed", sc.listed[h]).Int("holder_eff", sc.effs[h]).
		Float64("holder_cost_seconds", sc.costs[h]).Float64("holder_picks", sc.picks[h]).
		Msg("kv pick")
}

// followPrefill returns, for a warm request, the lowest-cost target among
// those still prefilling the longest prefix any target holds for an earlier
// request (sc.filling), if best is not one of them; else best. Elsewhere the
// request would prefill the same prefix again while the first prefill is
// under way, only to skip the queue that prefill is part of, and the copy
// is what a burst on a new prefix then spreads: a router that starts cold
// (restarted, its index empty) sent every group's first request to a queue
// at once, the followers of each moved off it, and the prefix, now held by
// two targets, was no home for the next ones (sharedHome): the hottest
// group on all four workers within six picks, the caches evicting the
// copies (TestKVRouterRestart, restarted router's hit ratio 0.72–0.82 of a
// warm router's 0.86–0.90). Once a prefill there is done, the estimate and
// the redo charge decide as before.
func followPrefill(sc *kvScratch, nt, start, best int) int {
	top := 0
	for i := range nt {
		top = max(top, sc.effs[i])
	}
	if sc.effs[best] == top && sc.filling[best] {
		return best
	}
	follow := -1
	for k := range nt {
		if i := (start + k) % nt; sc.effs[i] == top && sc.filling[i] && (follow < 0 || sc.costs[i] < sc.costs[follow]) {
			follow = i
		}
	}
	if follow < 0 {
		return best
	}
	return follow
}

// sharedHome reports whether more than one target holds the longest
// prefix any holds (sc.effs).
func sharedHome(sc *kvScratch, nt int) bool {
	top, n := 0, 0
	for i := range nt {
		switch e := sc.effs[i]; {
		case e > top:
			top, n = e, 1
		case e == top:
			n++
		}
	}
	return top > 0 && n > 1
}

// longCopyLoss fills sc.loss and sc.longs: on each target whose learnt
// capacity the request's uncached tokens there take more than
// longColdShare of (a long cold prompt, or a long copy of a warm one off
// its holder), the recency-weighted tokens of the latest prompts there that
// they would evict (ttftModel.evictLoss); 0 elsewhere.
func (p *KVAware) longCopyLoss(sc *kvScratch, nt int, kind keyKind, seq int64) {
	sc.loss = growF(sc.loss, nt)
	sc.longs = growB(sc.longs, nt)
	hl := liveHalfLife * float64(nt)
	for i, t := range sc.targets {
		sc.loss[i], sc.longs[i] = 0, false
		if kind != keyTokens || !t.precise() {
			continue
		}
		bs := sc.sets[sc.setOf[i]].bs
		c := float64(t.idx.Capacity() * bs)
		if c <= 0 || sc.uncs[i] <= longColdShare*c {
			continue
		}
		sc.longs[i] = true
		t.mu.RLock()
		sc.loss[i] = t.est.evictLoss(sc.uncs[i], c, bs, seq, hl)
		t.mu.RUnlock()
	}
}

// redoCost adds to each target's estimate the prefill it would redo against
// the target holding most of the prompt: its extra uncached tokens at its
// own rate. A request moved off its holder makes the fleet prefill that
// prefix again, and the requests queued behind it there wait for it too;
// without the charge a warm request left its holder whenever the holder's
// queue was a little longer, and four workers' caches filled with copies
// (multi-turn hit ratio 0.77 of one big cache's, the trace 0.68).
func redoCost(sc *kvScratch, nt int) {
	lo := sc.uncs[0]
	for i := 1; i < nt; i++ {
		lo = min(lo, sc.uncs[i])
	}
	for i := range nt {
		sc.costs[i] += sc.rates[i] * (sc.uncs[i] - lo) / 1000
	}
}

// promptUncached is the prompt tokens target t would have to prefill: the
// prompt's tokens beyond the eff blocks it holds (blocks of defBS tokens
// where there are no tokens).
func promptUncached(sc *kvScratch, kind keyKind, t *kvTarget, blocks, eff, defBS int) float64 {
	if kind == keyTokens {
		return float64(max(0, len(sc.tokens)-eff*t.blockSize()))
	}
	return float64(max(0, blocks-eff) * defBS)
}

// matchIndex fills sc.hits from the prefix index, one MatchMany per hash
// set over the targets that have an event stream.
func (p *KVAware) matchIndex(sc *kvScratch) {
	for s := range sc.nsets {
		sc.handles = sc.handles[:0]
		sc.pos = sc.pos[:0]
		for i, t := range sc.targets {
			if t.idx != nil && sc.setOf[i] == s {
				sc.handles = append(sc.handles, t.idx)
				sc.pos = append(sc.pos, i)
			}
		}
		if len(sc.handles) == 0 {
			continue
		}
		sc.out = grow(sc.out, len(sc.handles))
		p.idx.MatchMany(sc.handles, sc.sets[s].hashes, sc.out)
		for k, i := range sc.pos {
			sc.hits[i] = sc.out[k]
		}
	}
}

// keyPrompt turns the request into what matching runs on: sc.tokens (for
// keyTokens, hashed per block size by sc.set), or the single hash set 0
// (keyText, keyImages). eng is the worker asked in engine mode.
func (p *KVAware) keyPrompt(in *PickInput, sc *kvScratch, eng *Worker) keyKind {
	sc.nsets = 0
	sc.tokens = sc.tokens[:0]
	req := in.Request
	body := in.Body
	if req == nil {
		return p.keyRaw(sc, nil)
	}
	var raw []byte
	if !req.Messages.Empty() {
		raw = body[req.Messages.Start:req.Messages.End]
		if seed, images := sc.imageSeed(raw); images > 0 {
			return p.keyImages(sc, seed, len(raw), images)
		}
	} else if !req.Prompt.Empty() {
		raw = body[req.Prompt.Start:req.Prompt.End]
	}
	if raw == nil {
		return p.keyRaw(sc, nil)
	}
	var ok bool
	switch {
	case p.tok != nil:
		ok = p.tokenizeLocal(in, sc)
	case p.engine:
		ok = p.tokenizeEngine(in, sc, eng)
	default:
		ok = sc.promptTokenArray(in)
	}
	if !ok {
		return p.keyRaw(sc, raw)
	}
	return keyTokens
}

// keyRaw keys the request by byte chunks of its raw prompt JSON.
func (p *KVAware) keyRaw(sc *kvScratch, raw []byte) keyKind {
	sc.nsets = 1
	if len(sc.sets) == 0 {
		sc.sets = append(sc.sets, hashSet{})
	}
	sc.sets[0].bs = 0
	sc.sets[0].hashes = kvcache.AppendByteHashes(sc.sets[0].hashes[:0], raw, bytesPerToken*p.cfg.DefaultBlockSize)
	return keyText
}

// imageTokens is the prompt tokens one image is reckoned at (vision
// encoders emit a few hundred to a few thousand).
const imageTokens = 512

// keyImages keys a multimodal request by a chain from its image references,
// as long as the request's estimated blocks (its JSON text at
// bytesPerToken, plus imageTokens per image), so that it weighs like a text
// prompt of its size.
func (p *KVAware) keyImages(sc *kvScratch, seed uint64, rawLen, images int) keyKind {
	sc.nsets = 1
	if len(sc.sets) == 0 {
		sc.sets = append(sc.sets, hashSet{})
	}
	bs := p.cfg.DefaultBlockSize
	n := max(1, rawLen/(bytesPerToken*bs)+images*imageTokens/bs)
	sc.sets[0].bs = 0
	sc.sets[0].hashes = kvcache.AppendChainHashes(sc.sets[0].hashes[:0], seed, n)
	return keyImages
}

// imageSeed hashes the image references of a messages array and counts
// them.
func (sc *kvScratch) imageSeed(messages []byte) (uint64, int) {
	sc.img.Reset()
	n := imageVisit(messages, sc)
	return sc.img.Sum64(), n
}

// imageRef feeds one reference, length-prefixed so that concatenations
// cannot collide.
func (sc *kvScratch) imageRef(ref []byte) {
	var l [8]byte
	binary.LittleEndian.PutUint64(l[:], uint64(len(ref)))
	_, _ = sc.img.Write(l[:])
	_, _ = sc.img.Write(ref)
}

// shareHalfLife is the memory of the picks MaxShare bounds: long enough
// that a slow fleet's share is measured over a few dozen requests, short
// enough to follow a change of traffic within a minute.
const shareHalfLife = 10 * time.Second

// minWarmBlocks is the least cached prefix that makes a request warm: a
// chat template's header or a one-block system prompt, which every worker
// holds, does not (short prompts are all header).
const minWarmBlocks = 4

// minShareFair is the fair share of recent picks (about 0.5 requests/s per
// target) below which MaxShare does not apply: a nearly idle fleet has no
// load to spread, and serial requests keep following their cache.
const minShareFair = 8

func growF(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n, n+n/2)
	}
	return s[:n]
}

func growB(s []bool, n int) []bool {
	if cap(s) < n {
		return make([]bool, n, n+n/2)
	}
	return s[:n]
}

func grow(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n, n+n/2)
	}
	return s[:n]
}

// overlapWeight is the cost weight of one uncached block on worker w, by
// its role: prefill and decode workers of disaggregated serving have their
// own (--kv-prefill-overlap-weight, --kv-decode-overlap-weight).
func (p *KVAware) overlapWeight(w *Worker) float64 {
	switch w.Record().DisaggMode {
	case discovery.DisaggPrefill:
		return p.cfg.PrefillOverlapWeight
	case discovery.DisaggDecode:
		return p.cfg.DecodeOverlapWeight
	}
	return p.cfg.OverlapWeight
}
