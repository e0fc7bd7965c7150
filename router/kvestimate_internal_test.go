package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/openai"
)

func ttftConfig() KVAwareConfig {
	return kvConfig(func(c *KVAwareConfig) {
		c.TokenizerSpec, c.ProvisionalTTL, c.Cost = TokenizerBytes, 0, KVCostTTFT
	})
}

// target0 returns the first target of worker id.
func (e *kvEnv) target0(id string) *kvTarget { return (*e.p.workers[id].targets.Load())[0] }

// queue charges tokens of prefill to worker id as requests in flight before
// their first token would.
func (e *kvEnv) queue(id string, tokens float64) {
	t := e.target0(id)
	t.mu.Lock()
	t.est.queued += tokens
	t.mu.Unlock()
}

// TestKVEstimateQueuedPrefillAgainstHalfPrefix is acceptance 2 of issue 37:
// worker A holds the whole prompt but has prefill queued, worker B is idle
// and holds half of it. The pick follows the estimate both ways.
func TestKVEstimateQueuedPrefillAgainstHalfPrefix(t *testing.T) {
	long := unique(5, 4000)
	tokens := chatTokens(t, long)
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	half := float64(len(tokens) / 2) // B's uncached tokens, about
	for _, tc := range []struct {
		name   string
		queued float64 // on A
		want   string
	}{
		// A: base + perKTok×(queued+tail); B: base + perKTok×half.
		{"long queue on the holder loses", 4 * half, b},
		{"short queue on the holder wins", half / 4, a},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
			e.makePrecise()
			e.store(a, tokens)
			e.store(b, tokens[:len(tokens)/2])
			e.queue(a, tc.queued)
			ta, tb := e.target0(a), e.target0(b)
			estA := ta.est.estimate(float64(len(tokens) % 16))
			estB := tb.est.estimate(float64(len(tokens) - len(tokens)/2/16*16))
			if (estA < estB) != (tc.want == a) {
				t.Fatalf("estimates A %.4f s B %.4f s disagree with the case", estA, estB)
			}
			tk := e.pick(chat(long))
			defer e.p.Release(tk, Result{Status: 200})
			if tk.Worker.id != tc.want {
				t.Fatalf("picked %s, want %s (estimates A %.4f s, B %.4f s)", tk.Worker.id, tc.want, estA, estB)
			}
		})
	}
}

// TestKVEstimateLearnsTheStepModel feeds observations from the simulator's
// step-time form and checks that the coefficients approach it.
func TestKVEstimateLearnsTheStepModel(t *testing.T) {
	var m ttftModel
	m.init()
	const base, perK, perDec = 0.01, 0.25, 0.004
	for i := range 20000 {
		work := float64((i * 7919) % 8000)
		dec := (i * 31) % 40
		m.learn(work, dec, base+perK*work/1000+perDec*float64(dec))
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"base", m.base, base}, {"per 1k tokens", m.perKTok, perK}, {"per decode", m.perDecode, perDec}} {
		if math.Abs(c.got-c.want) > 0.1*c.want+1e-3 {
			t.Errorf("%s: %.5f, want %.5f", c.name, c.got, c.want)
		}
	}
}

// TestKVEstimateFirstTokenFeedback: a stream's first event (noteServed)
// moves its request from the queued prefill to the decode load and teaches
// the model; the release ends it.
func TestKVEstimateFirstTokenFeedback(t *testing.T) {
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil))
	e.makePrecise()
	id := kvRecord(0, nil).WorkerID
	tk := e.pick(chat(unique(1, 1000)))
	start := time.Now().UnixNano()
	m := e.p.TTFTModels(id)[0]
	if m.Queued < 1000 || m.Decoding != 0 {
		t.Fatalf("after the pick: %+v", m)
	}
	tk.Worker.stall.noteServed(start, tk.State)
	m = e.p.TTFTModels(id)[0]
	if m.Queued != 0 || m.Decoding != 1 || m.Samples != 1 {
		t.Fatalf("after the first token: %+v", m)
	}
	e.p.Release(tk, Result{Status: 200})
	m = e.p.TTFTModels(id)[0]
	if m.Queued != 0 || m.Decoding != 0 {
		t.Fatalf("after the release: %+v", m)
	}
	// A request released before its first token leaves the queue too.
	tk = e.pick(chat(unique(2, 1000)))
	e.p.Release(tk, Result{})
	if m = e.p.TTFTModels(id)[0]; m.Queued != 0 || m.Decoding != 0 {
		t.Fatalf("after a release without a first token: %+v", m)
	}
}

// TestKVEstimateFirstTokenFindsItsTicket: the relay stamps an attempt's
// start before it picks, so a first event matched by time (the latest
// ticket picked before the stream's start) never found its own request:
// here b's first event, with a's long prefill still under way, took a out
// of the queued prefill instead of b. The stream's ticket names it.
func TestKVEstimateFirstTokenFindsItsTicket(t *testing.T) {
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil))
	e.makePrecise()
	id := kvRecord(0, nil).WorkerID
	a := e.pick(chat(unique(1, 3000)))
	defer e.p.Release(a, Result{Status: 200})
	before := e.p.TTFTModels(id)[0].Queued
	startB := time.Now().UnixNano() // the attempt's start, stamped before its pick
	b := e.pick(chat(unique(2, 500)))
	defer e.p.Release(b, Result{Status: 200})
	b.Worker.stall.noteServed(startB, b.State)
	if m := e.p.TTFTModels(id)[0]; m.Queued != before || m.Decoding != 1 || m.Samples != 1 {
		t.Fatalf("after b's first token: %+v, want a's %.0f tokens still queued", m, before)
	}
	a.Worker.stall.noteServed(startB, a.State)
	if m := e.p.TTFTModels(id)[0]; m.Queued != 0 || m.Decoding != 2 || m.Samples != 2 {
		t.Fatalf("after a's first token: %+v", m)
	}
	// A ticket already past its first token, or of another policy, teaches nothing.
	a.Worker.stall.noteServed(startB, a.State)
	a.Worker.stall.noteServed(startB, nil)
	if m := e.p.TTFTModels(id)[0]; m.Decoding != 2 || m.Samples != 2 {
		t.Fatalf("after repeated first events: %+v", m)
	}
}

// TestKVEstimateColdSpreadsByDeficit: cold requests on an idle fleet go
// round it evenly.
func TestKVEstimateColdSpreadsByDeficit(t *testing.T) {
	e := newKVEnv(t, ttftConfig(), fleet(4)...)
	e.makePrecise()
	n := e.coldBurst(200, 40, 500)
	for id, c := range n {
		if c != 10 {
			t.Fatalf("worker %s got %d of 40 cold requests: %v", id, c, n)
		}
	}
}

func TestKVEstimatePickAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	e := newKVEnv(t, ttftConfig(), fleet(8)...)
	e.makePrecise()
	for _, r := range fleet(8) {
		e.learnCapacity(r.WorkerID, 400) // the eviction rule's paths run too
	}
	body := chat(unique(3, 2000))
	e.store(kvRecord(3, nil).WorkerID, chatTokens(t, unique(3, 2000)))
	// A long prompt no worker holds: cold, placed by what it evicts.
	coldBody := chat(unique(4, 3000))
	var req, coldReq openai.Request
	if err := openai.Scan([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	if err := openai.Scan([]byte(coldBody), &coldReq); err != nil {
		t.Fatal(err)
	}
	in := &PickInput{Route: RouteChatCompletions, Body: []byte(body), Request: &req}
	coldIn := &PickInput{Route: RouteChatCompletions, Body: []byte(coldBody), Request: &coldReq}
	c := e.cands()
	run := func() {
		for _, in := range []*PickInput{in, coldIn} {
			tk, err := e.p.Pick(in, c)
			if err != nil {
				t.Fatal(err)
			}
			tk.Worker.stall.noteServed(time.Now().UnixNano(), tk.State)
			e.p.Release(tk, Result{})
		}
	}
	for range 8 * 20 {
		run()
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Fatalf("ttft pick: %.1f allocs, want 0", n)
	}
}

// TestKVEstimateWarmShare: a prefix both workers hold spills from the
// better one once another pick would take it above MaxShareWarm × its fair
// share of the (decayed) picks; a conversation whose history only one holds
// stays there.
func TestKVEstimateWarmShare(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	t.Run("hot prefix spills", func(t *testing.T) {
		e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
		e.makePrecise()
		long := unique(6, 2000)
		e.store(a, chatTokens(t, long))
		e.store(b, chatTokens(t, long))
		e.queue(b, 50) // b answers a little later
		n := map[string]int{}
		for range 60 {
			n[e.serial(chat(long))]++
		}
		// The bound holds after every pick, on the picks as the deficit
		// counts them (halving every deficitHalfLife × 2 picks).
		seq, hl := e.p.seq.Load(), deficitHalfLife*2.0
		pa, pb := e.target0(a).est.pickCount(seq, hl), e.target0(b).est.pickCount(seq, hl)
		if n[b] == 0 || pa > 1.15*(pa+pb)/2 || pb > 1.15*(pa+pb)/2 {
			t.Fatalf("picks %v (decayed: a %.1f, b %.1f): the hot prefix did not spill within the share", n, pa, pb)
		}
	})
	t.Run("history stays", func(t *testing.T) {
		// The conversation's holder is not far above its share: two cold
		// requests after each turn let the other worker make up for it.
		e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
		e.makePrecise()
		long := unique(7, 4000)
		e.store(a, chatTokens(t, long))
		for i := range 60 {
			if got := e.serial(chat(long)); got != a {
				t.Fatalf("turn %d: a request whose prefix only %s holds went to %s", i, a, got)
			}
			e.serial(chat(unique(500+2*i, 300)))
			e.serial(chat(unique(501+2*i, 300)))
		}
	})
	t.Run("far above its share, a history gets a second holder", func(t *testing.T) {
		// All the traffic is one conversation that only a holds: above
		// twice the bound's excess (1.3× fair) a pick goes to b whatever
		// the estimate.
		e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
		e.makePrecise()
		long := unique(9, 4000)
		e.store(a, chatTokens(t, long))
		n := map[string]int{}
		for range 60 {
			n[e.serial(chat(long))]++
		}
		seq, hl := e.p.seq.Load(), deficitHalfLife*2.0
		pa, pb := e.target0(a).est.pickCount(seq, hl), e.target0(b).est.pickCount(seq, hl)
		if n[b] == 0 || pa > 1.3*(pa+pb)/2+1 {
			t.Fatalf("picks %v (decayed: a %.1f, b %.1f): the holder stayed far above its share", n, pa, pb)
		}
	})
}

func TestKVCostConfig(t *testing.T) {
	if _, err := NewKVAware(kvConfig(func(c *KVAwareConfig) { c.Cost = "fastest" }), zerolog.Nop()); !errors.Is(err, ErrKVConfig) {
		t.Fatalf("cost fastest: %v", err)
	}
	p, err := NewKVAware(kvConfig(func(c *KVAwareConfig) { c.Cost = "" }), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.cfg.Cost != KVCostBlocks || p.ttft {
		t.Fatalf("empty cost is %q", p.cfg.Cost)
	}
}

// TestKVEstimateRedoCharge: a warm request leaves its holder only when
// another target answers first after redoing the prefix it does not hold:
// a holder whose queue is a little longer than the whole prompt's prefill
// elsewhere keeps it, one whose queue is several times longer does not.
func TestKVEstimateRedoCharge(t *testing.T) {
	long := unique(8, 3000)
	tokens := chatTokens(t, long)
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	full := float64(len(tokens))
	for _, tc := range []struct {
		name   string
		queued float64 // on A, which holds the prompt; B holds nothing
		want   string
	}{
		// Raw estimates: A base + k(queued + tail), B base + k×full, so
		// B's is lower in both cases; with the redo B costs base + 2k×full
		// less the tail.
		{"a queue a little longer than the prefill elsewhere stays", 1.5 * full, a},
		{"a queue several times longer moves", 3 * full, b},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
			e.makePrecise()
			e.store(a, tokens)
			e.queue(a, tc.queued)
			estA := e.target0(a).est.estimate(float64(len(tokens) % 16))
			estB := e.target0(b).est.estimate(full)
			if estB >= estA {
				t.Fatalf("B's raw estimate %.4f s is not below A's %.4f s", estB, estA)
			}
			tk := e.pick(chat(long))
			defer e.p.Release(tk, Result{Status: 200})
			if tk.Worker.id != tc.want {
				t.Fatalf("picked %s, want %s (raw estimates A %.4f s, B %.4f s)", tk.Worker.id, tc.want, estA, estB)
			}
		})
	}
}

// TestKVEstimateColdSpreadsFill: cold requests spread by picks and by the
// uncached tokens each cache takes in. Every fourth prompt is eight times
// longer: by counts alone, rotating over four workers, they would all land
// on one worker's cache (that worker taking in 20×2400 + 60×300/4 tokens of
// the 66,000, 2.9× its fair part); greedily against both fair shares the
// worker that took in most took in 1.49× its part, with 14–26 requests each.
func TestKVEstimateColdSpreadsFill(t *testing.T) {
	e := newKVEnv(t, ttftConfig(), fleet(4)...)
	e.makePrecise()
	n, fill := map[string]int{}, map[string]int{}
	total := 0
	for i := range 80 {
		size := 300
		if i%4 == 0 {
			size = 2400
		}
		id := e.serial(chat(unique(400+i, size)))
		n[id]++
		fill[id] += size
		total += size
	}
	for id, c := range n {
		if c < 12 || c > 28 {
			t.Fatalf("worker %s got %d of 80 cold requests: %v", id, c, n)
		}
		if f := float64(fill[id]) / (float64(total) / 4); f > 1.6 {
			t.Fatalf("worker %s took in %.2f× its fair part of the uncached tokens: %v", id, f, fill)
		}
	}
}

// TestKVEstimateDeficitDecays: a target's picks halve every
// deficitHalfLife × targets picks of the fleet, so that a worker that joins
// a long-running fleet is not sent every cold request until it has caught
// up with the others' whole history.
func TestKVEstimateDeficitDecays(t *testing.T) {
	var m ttftModel
	m.init()
	const hl = deficitHalfLife * 4.0
	var kt kvTicket
	for i := range 10 {
		m.enter(&kt, 100, 0, 0, 0, int64(i), hl)
		m.leave(&kt)
	}
	at := m.pickCount(9, hl)
	if math.Abs(at-10) > 0.5 {
		t.Fatalf("picks right after: %.2f, want about 10", at)
	}
	if got := m.pickCount(9+int64(hl), hl); math.Abs(got-at/2) > 1e-9 {
		t.Fatalf("picks %d fleet picks later: %.3f, want %.3f", int64(hl), got, at/2)
	}
	if got := m.fillCount(9+int64(2*hl), hl); math.Abs(got-m.fills/4) > 1e-9 {
		t.Fatalf("fills two half-lives later: %.3f, want %.3f", got, m.fills/4)
	}
}

// TestKVEstimateColdSpreadsHeld: a cold request avoids the worker whose
// requests in flight hold the most prompt blocks (what its cache must keep
// now), even when that worker has had fewer picks.
func TestKVEstimateColdSpreadsHeld(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	// a: one long conversation, cached there, in flight past its first
	// token (nothing queued, nothing taken in, 250 blocks held).
	long, short := unique(10, 4000), unique(11, 300)
	e.store(a, chatTokens(t, long))
	e.store(b, chatTokens(t, short))
	tk := e.pick(chat(long))
	defer e.p.Release(tk, Result{Status: 200})
	if tk.Worker.id != a {
		t.Fatalf("the conversation went to %s, not its holder %s", tk.Worker.id, a)
	}
	tk.Worker.stall.noteServed(time.Now().UnixNano(), tk.State)
	// b: two short requests it holds, ended.
	for range 2 {
		if got := e.serial(chat(short)); got != b {
			t.Fatalf("a short request went to %s, not its holder %s", got, b)
		}
	}
	// By picks alone a is behind (1 against 2); by what it holds it is not.
	if got := e.serial(chat(unique(12, 300))); got != b {
		t.Fatalf("a cold request went to %s, whose requests in flight hold %.0f blocks", got, float64(e.target0(a).active.Len()))
	}
}

// TestKVEstimateColdBurstSpreads: a burst of new conversations spreads over
// the targets even when one of them is behind on its past picks and intake.
// Those deficits move by a few hundredths per request (one pick of 28, 300
// tokens of 10,000), so by them alone every request of the burst went to
// the target behind (multi-turn after a round whose sessions it had few
// of: six of a round's 13 new sessions on one worker, whose cache then
// could not hold them); the cold picks' own count, with a short memory,
// moves by a large step per request and alternates them.
func TestKVEstimateColdBurstSpreads(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	seq := e.p.seq.Load()
	for id, past := range map[string][2]float64{a: {25, 8000}, b: {30, 12000}} {
		tg := e.target0(id)
		tg.mu.Lock()
		tg.est.picks, tg.est.fills, tg.est.picksAt = past[0], past[1], seq
		tg.mu.Unlock()
	}
	n := e.coldBurst(600, 8, 250)
	if n[a] > 5 || n[b] < 3 {
		t.Fatalf("a burst of 8 new conversations went %v: not spread", n)
	}
}

// learnCapacity makes worker id's engine reveal a cache of blocks blocks:
// it stores that many blocks of filler and evicts one, as an engine whose
// cache is full does.
func (e *kvEnv) learnCapacity(id string, blocks int) {
	e.t.Helper()
	t := e.target0(id)
	tokens := make([]uint32, blocks*16)
	for i := range tokens {
		tokens[i] = uint32(100000 + i)
	}
	engine := make([]uint64, blocks)
	for i := range engine {
		engine[i] = 1<<40 + uint64(i)
	}
	b := kvcache.Batch{Events: []kvcache.Event{
		{Type: kvcache.EventBlockStored, Hashes: engine, Tokens: tokens, BlockSize: 16},
		{Type: kvcache.EventBlockRemoved, Hashes: engine[blocks-1:]},
	}}
	if res := e.p.idx.Apply(t.idx, &b); res.Stored != blocks || res.Removed != 1 {
		e.t.Fatalf("filler: %+v", res)
	}
	if got := t.idx.Capacity(); got != blocks {
		e.t.Fatalf("learnt capacity %d, want %d", got, blocks)
	}
}

// TestKVEstimateColdAvoidsLivePrefix is the eviction rule's placement half:
// two targets of 400 blocks (6,400 tokens), a 3,500-token prefix in use on
// a, then two 3,000-token cold prompts. Either one on a would evict the
// prefix (3,000 tokens in, 2,900 of room beside it); on b the second
// evicts nothing (the first took 3,000 of b's 6,400). By the deficits alone
// the second went to a: b had had the last cold pick and intake.
func TestKVEstimateColdAvoidsLivePrefix(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	for _, inFlight := range []bool{true, false} {
		name := "prefix between turns"
		if inFlight {
			name = "prefix in flight"
		}
		t.Run(name, func(t *testing.T) {
			e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
			e.makePrecise()
			e.learnCapacity(a, 400)
			e.learnCapacity(b, 400)
			long := unique(20, 3500)
			e.store(a, chatTokens(t, long))
			tk := e.pick(chat(long))
			if tk.Worker.id != a {
				t.Fatalf("the prefix's turn went to %s, not its holder %s", tk.Worker.id, a)
			}
			if inFlight {
				defer e.p.Release(tk, Result{Status: 200})
				tk.Worker.stall.noteServed(time.Now().UnixNano(), tk.State)
			} else {
				e.p.Release(tk, Result{Status: 200})
			}
			for i := range 2 {
				if got := e.serial(chat(unique(21+i, 3000))); got != b {
					t.Fatalf("cold prompt %d went to %s, the holder of a live 3,500-token prefix", i+1, got)
				}
			}
			// The prefix is still held there: its next turn is warm on a.
			next := e.pick(chat(long + "<next turn>"))
			defer e.p.Release(next, Result{Status: 200})
			if next.Worker.id != a {
				t.Fatalf("the next turn went to %s, not the prefix's holder %s", next.Worker.id, a)
			}
		})
	}
}

// TestKVEstimateLostPrefixPricedCold is the prediction half: a prefix the
// index still lists counts only as far as the target's intake since its
// last use leaves it room in the cache (block j while intake + (j+1)×16 <
// 6,400 tokens): the deepest blocks of a 3,500-token prefix are lost after
// 4,000 tokens came in, all of it is held after 1,000.
func TestKVEstimateLostPrefixPricedCold(t *testing.T) {
	a := kvRecord(0, nil).WorkerID
	long := unique(30, 3500)
	tokens := chatTokens(t, long)
	full := int64(len(tokens) / 16 * 16)
	for _, tc := range []struct {
		intake   float64
		min, max int64 // predicted cached tokens
	}{
		{1000, full, full},
		{4000, (6400 - 4000 - 32) / 16 * 16, (6400 - 4000) / 16 * 16},
		{7000, 0, 0},
	} {
		e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
		e.makePrecise()
		e.learnCapacity(a, 400)
		e.store(a, tokens)
		if got := e.serial(chat(long)); got != a {
			t.Fatalf("first turn went to %s", got)
		}
		tg := e.target0(a)
		tg.mu.Lock()
		tg.est.intake += tc.intake // cold prompts taken in since
		tg.mu.Unlock()
		tk := e.pick(chat(long))
		kt := tk.State.(*kvTicket)
		switch {
		case tc.max > 0 && tk.Worker.id != a:
			t.Errorf("intake %.0f since: the request went to %s, not the holder of %d of its tokens", tc.intake, tk.Worker.id, tc.min)
		case kt.predTokens < tc.min || kt.predTokens > tc.max:
			t.Errorf("intake %.0f since: predicted %d cached tokens on %s, want %d–%d", tc.intake, kt.predTokens, tk.Worker.id, tc.min, tc.max)
		}
		e.p.Release(tk, Result{Status: 200})
	}
}

// TestKVEstimateReportedMissAdvancesIntake: an answer that reports fewer
// cached tokens than the pick counted on (the engine had evicted the prefix
// before its removal events came in) advances the target's intake by what
// the engine prefilled beyond the charge, and the prefixes that intake
// pushed out stop counting: of q, used before p's 4,500 tokens were
// prefilled again, at most the 1,900 tokens a 6,400-token cache leaves
// beside them count.
func TestKVEstimateReportedMissAdvancesIntake(t *testing.T) {
	a := kvRecord(0, nil).WorkerID
	p, q := unique(40, 4500), unique(41, 3000)
	pt, qt := chatTokens(t, p), chatTokens(t, q)
	for _, reported := range []bool{false, true} {
		e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
		e.makePrecise()
		e.learnCapacity(a, 400)
		e.store(a, pt)
		e.store(a, qt)
		if got := e.serial(chat(q)); got != a {
			t.Fatalf("q went to %s", got)
		}
		tk := e.pick(chat(p))
		kt := tk.State.(*kvTicket)
		if tk.Worker.id != a || kt.predTokens < int64(len(pt))-16 {
			t.Fatalf("p went to %s predicting %d cached tokens", tk.Worker.id, kt.predTokens)
		}
		if reported {
			e.p.observeUsage(kt, int64(len(pt)), 0, -1) // the engine found none of it
		}
		e.p.Release(tk, Result{Status: 200})
		tk = e.pick(chat(q))
		got := tk.State.(*kvTicket).predTokens
		e.p.Release(tk, Result{Status: 200})
		full := int64(len(qt) / 16 * 16)
		switch {
		case !reported && (tk.Worker.id != a || got != full):
			t.Errorf("without a reported miss q went to %s predicting %d cached tokens, want %s and %d", tk.Worker.id, got, a, full)
		case reported && got > 1900:
			t.Errorf("after p's reported miss q still counts %d of %d tokens cached on %s", got, full, tk.Worker.id)
		}
	}
}

// TestKVEstimateOutputAdvancesIntake: what a request writes goes into its
// target's cache as well, and evicts as much as a prompt would. q (3,000
// tokens) was used on a, whose cache holds 6,400; then requests with short
// prompts ran there and reported 2,000 completion tokens each. After one, q
// still fits beside what the cache took in; after two, only the head of it
// that the cache keeps beside their 4,000 output tokens counts (about 2,300
// tokens: an LRU evicts a prompt's tail first). An answer without usage
// teaches nothing.
func TestKVEstimateOutputAdvancesIntake(t *testing.T) {
	a := kvRecord(0, nil).WorkerID
	q := unique(41, 3000)
	qt := chatTokens(t, q)
	full := int64(len(qt) / 16 * 16)
	for _, tc := range []struct {
		writers    int
		completion int64 // reported; -1: no usage
		max        int64
	}{{0, 0, full}, {1, 2000, full}, {2, 2000, 2300}, {2, -1, full}} {
		e := newKVEnv(t, ttftConfig(), kvRecord(0, nil))
		e.makePrecise()
		e.learnCapacity(a, 400)
		e.store(a, qt)
		e.serial(chat(q))
		for i := range tc.writers {
			tk := e.pick(maxTokensChat(2000, unique(50+i, 40)))
			e.p.observeUsage(tk.State.(*kvTicket), 60, -1, tc.completion)
			e.p.Release(tk, Result{Status: 200})
		}
		tk := e.pick(chat(q))
		got := tk.State.(*kvTicket).predTokens
		e.p.Release(tk, Result{Status: 200})
		if got > tc.max || (tc.max == full && got != full) {
			t.Errorf("after %d writers reporting %d completion tokens q counts %d of %d tokens cached, want %d at most", tc.writers, tc.completion, got, full, tc.max)
		}
	}
}

// TestKVEstimatePickLog checks the debug line of a --kv-cost ttft pick (the
// pick analyses of docs/performance.md read it): a warm request names the
// holder and the prefix the index lists there; a cold one its eviction
// loss. At info level there is no line.
func TestKVEstimatePickLog(t *testing.T) {
	long := unique(7, 1000)
	tokens := chatTokens(t, long)
	a := kvRecord(0, nil).WorkerID
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	e.store(a, tokens)
	var buf bytes.Buffer
	e.p.log = zerolog.New(&buf).Level(zerolog.InfoLevel)
	e.serial(chat(long))
	if buf.Len() != 0 {
		t.Fatalf("a pick logged at info level: %s", buf.String())
	}
	e.p.log = zerolog.New(&buf).Level(zerolog.DebugLevel)
	e.serial(chat(long))
	e.serial(chat(unique(8, 1000)))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 pick lines, got %d: %s", len(lines), buf.String())
	}
	var warm, cold map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &warm); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &cold); err != nil {
		t.Fatal(err)
	}
	blocks := float64(len(tokens) / 16)
	if warm["message"] != "kv pick" || warm["request_id"] != "test-request" || warm["warm"] != true || warm["worker_id"] != a || warm["holder_id"] != a ||
		warm["holder_listed"] != blocks || len(warm["costs_seconds"].([]any)) != 2 {
		t.Fatalf("warm pick line: %s", lines[0])
	}
	if _, ok := cold["loss"]; !ok || cold["warm"] != false {
		t.Fatalf("cold pick line: %s", lines[1])
	}
	// The chosen target's learnt coefficients, so that a run's picks can
	// be read against what its measured TTFTs taught the estimate: the
	// priors here, nothing returned yet.
	for _, l := range []map[string]any{warm, cold} {
		rates, _ := l["all_per_ktok_seconds"].([]any)
		if l["base_seconds"] != priorBase || l["per_decode_seconds"] != priorPerDecode ||
			len(rates) != 2 || rates[0] != priorPerKTok {
			t.Fatalf("pick line without the coefficients: %v", l)
		}
		if _, ok := l["queued_tokens"]; !ok {
			t.Fatalf("pick line without the target's queued tokens: %v", l)
		}
		// The admission view: no room learnt yet, no wait.
		if l["admit_wait_seconds"] != 0.0 || l["capacity_blocks"] != 0.0 || l["per_out_seconds"] != priorPerOut {
			t.Fatalf("pick line without the admission view: %v", l)
		}
	}
}

// coldBurst picks n new conversations one after another, each its own
// prompt of size characters (seeds first…), and counts them by worker.
func (e *kvEnv) coldBurst(first, n, size int) map[string]int {
	e.t.Helper()
	picked := map[string]int{}
	for i := range n {
		picked[e.serial(chat(unique(first+i, size)))]++
	}
	return picked
}

// setPast gives worker id a past of decayed picks and cold picks as of the
// fleet's pick count now.
func (e *kvEnv) setPast(id string, picks, colds float64) {
	tg := e.target0(id)
	seq := e.p.seq.Load()
	tg.mu.Lock()
	tg.est.picks, tg.est.picksAt = picks, seq
	tg.est.colds, tg.est.coldsAt = colds, seq
	tg.mu.Unlock()
}

// TestKVEstimateColdBurstForgetsLastBurst: the count of new conversations
// forgets a burst once the fleet has served that burst's later turns. It
// used to decay only with cold picks, so the next round's burst began
// with the last one's counts and went the other way: after a round with
// five of 13 sessions on one worker and one on another, the next put six
// on the second and one on the first, whose cache then could not hold
// them (multi-turn: hit ratio 0.53–0.59 in 4 of 7 runs, 0.83–0.91× of one
// big cache's). Here b had four of the last burst's new conversations
// and a none, 52 warm picks ago: a new burst of 8 splits evenly.
func TestKVEstimateColdBurstForgetsLastBurst(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	e.setPast(a, 30, 0)
	e.setPast(b, 30, 4)
	e.p.seq.Add(52) // the last burst's conversations' later turns
	n := e.coldBurst(700, 8, 250)
	if n[a] != 4 || n[b] != 4 {
		t.Fatalf("a burst of 8 new conversations went %v: the last burst's counts still steer it", n)
	}
}

// TestKVEstimateColdBurstIgnoresPastShare: the share bound, over the
// picks of the last rounds, does not send a new conversation away from a
// worker; the deficit weighs those picks beside the new conversations.
// With the bound, a worker that had one conversation more than the others
// last round (its picks above 1.1× fair) got none of the next burst until
// the others caught up, and the round after the roles swapped (multi-turn:
// five sessions on one worker, two on another). Here b is 1.13× fair on
// past picks: a burst of 8 still gives it 4.
func TestKVEstimateColdBurstIgnoresPastShare(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	e.setPast(a, 30, 0)
	e.setPast(b, 40, 0)
	n := e.coldBurst(800, 8, 250)
	if n[a] != 4 || n[b] != 4 {
		t.Fatalf("a burst of 8 new conversations went %v: b's past share kept it out", n)
	}
}

// newConversations picks and releases n new conversations on a system
// prompt, each with its own message of own characters (seeds first…), and
// counts them by worker.
func (e *kvEnv) newConversations(system string, first, n, own int) map[string]int {
	e.t.Helper()
	picked := map[string]int{}
	for i := range n {
		picked[e.serial(chat(system+unique(first+i, own)))]++
	}
	return picked
}

// TestKVEstimateSharedPrefixIsNoHome: new conversations that begin with a
// system prompt both targets hold (and nothing else any holds) are warm,
// but neither target is their home: they split by the deficit rather than
// all following the one that answers a little sooner (b has a short queue
// here). By the estimate alone all 12 went to a: below minShareFair the
// share bound does not act, and above it only spills past 1.15× fair
// (conversation: the busiest worker 1.08–1.27× fair).
func TestKVEstimateSharedPrefixIsNoHome(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	system := unique(11, 600)
	e.store(a, chatTokens(t, system))
	e.store(b, chatTokens(t, system))
	e.queue(b, 50)
	n := e.newConversations(system, 900, 12, 100)
	if n[a] != 6 || n[b] != 6 {
		t.Fatalf("12 new conversations on a shared system prompt went %v: not split", n)
	}
}

// TestKVEstimateSharedPrefixSpreadsBeyondItsHolders: when the holders of a
// shared system prompt are both above their share of picks, a new
// conversation on it goes to the idle third target, which prefills the
// system prompt again (within the cold slack) and becomes a holder too.
// Without the rule the two holders kept every new conversation: the warm
// share bound spills only within the warm slack, where the third target's
// extra prefill is not, or above 1.3× fair.
func TestKVEstimateSharedPrefixSpreadsBeyondItsHolders(t *testing.T) {
	a, b, c := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID, kvRecord(2, nil).WorkerID
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil), kvRecord(2, nil))
	e.makePrecise()
	system := unique(12, 200)
	e.store(a, chatTokens(t, system))
	e.store(b, chatTokens(t, system))
	e.setPast(a, 24, 0)
	e.setPast(b, 24, 0)
	e.setPast(c, 16, 0)
	n := e.newConversations(system, 950, 6, 150)
	if n[c] < 2 {
		t.Fatalf("6 new conversations on a system prompt held by two busy targets went %v: none to the idle one", n)
	}
}

// TestKVEstimateWarmSpillsShortPrefix: above the share bound, a warm
// request whose held prefix is short beside what it adds (a new
// conversation on a system prompt only a holds) goes to b, which prefills
// the system prompt again within the cold slack; a long history on a
// stays ("history stays" of TestKVEstimateWarmShare). Within the warm slack
// alone the system prompt's prefill kept every new conversation on a.
func TestKVEstimateWarmSpillsShortPrefix(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	system := unique(13, 200)
	e.store(a, chatTokens(t, system))
	e.setPast(a, 30, 0)
	e.setPast(b, 20, 0)
	n := e.newConversations(system, 960, 6, 150)
	if n[b] == 0 {
		t.Fatalf("6 new conversations on a system prompt only a holds, a above its share, went %v", n)
	}
}

// TestKVEstimateFollowsPrefillUnderWay: a warm request whose prefix its
// holder is still prefilling for an earlier request stays there although
// the holder's queue is long enough that the estimate and the redo charge
// would move it (TestKVEstimateRedoCharge's "several times longer"): it
// would prefill the prefix again beside the first prefill, and the copy is
// what a burst on a new prefix then spreads (a restarted router: every
// group's first request cold at once; TestKVRouterRestart). Once the first
// request has its first token the prefix is cached and the same queue moves
// the next request.
func TestKVEstimateFollowsPrefillUnderWay(t *testing.T) {
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	prefix := unique(21, 3000)
	first := e.pick(chat(prefix))
	holder := first.Worker.id
	e.queue(holder, 3*float64(len(chatTokens(t, prefix))))
	follower := e.pick(chat(prefix + unique(22, 64)))
	if follower.Worker.id != holder {
		t.Fatalf("a request on a prefix %s is prefilling went to %s", holder, follower.Worker.id)
	}
	e.p.Release(follower, Result{Status: 200})
	first.Worker.stall.noteServed(time.Now().UnixNano(), first.State)
	later := e.pick(chat(prefix + unique(23, 64)))
	defer e.p.Release(later, Result{Status: 200})
	if later.Worker.id == holder {
		t.Fatalf("after the prefill, behind a queue three prefills long, the request stayed on %s", holder)
	}
	e.p.Release(first, Result{Status: 200})
}

// TestKVEstimateWarmBoundAllowsOnePick: the warm share bound has one pick of
// allowance, as the block cost's has. A conversation's holder at 13 decayed
// picks against 9 on each of three others (fair 10.25 with this request)
// keeps its next turn: without the allowance it was above twice the bound's
// excess (1.3× fair) and gave the turn up whatever the cost, which at the
// small fair shares of a router that has just started moved requests off
// holders one or two picks ahead (TestKVRouterRestart). At 15 picks it is
// above the bound with the allowance too, and the turn moves.
func TestKVEstimateWarmBoundAllowsOnePick(t *testing.T) {
	for _, tc := range []struct {
		picks float64
		stays bool
	}{{13, true}, {15, false}} {
		t.Run(fmt.Sprintf("holder_picks=%g", tc.picks), func(t *testing.T) {
			e := newKVEnv(t, ttftConfig(), fleet(4)...)
			e.makePrecise()
			history := unique(31, 2000)
			holder := kvRecord(0, nil).WorkerID
			e.store(holder, chatTokens(t, history))
			for i := range 4 {
				e.setPast(kvRecord(i, nil).WorkerID, 9, 0)
			}
			e.setPast(holder, tc.picks, 0)
			if got := e.serial(chat(history + " and the next turn")); (got == holder) != tc.stays {
				t.Fatalf("holder at %g picks, others at 9: the next turn went to %s (holder %s), want staying %v", tc.picks, got, holder, tc.stays)
			}
		})
	}
}

// TestKVEstimateSharedPrefixInUseSpillsAtBound: a request on a prefix that
// only its holder holds and that a request in flight there also runs on
// (a group's shared prompt) leaves a holder above the share bound (13
// decayed picks against 9 on each of three others: fair 10.25 with this
// request, bound 1.15× fair plus a pick) for the lowest cost within the
// bound, though that target prefills the prefix again: the copy serves the
// group's next requests too. The same prompt with nothing in flight on it
// (a conversation's own history) stays, as TestKVEstimateWarmBoundAllowsOnePick
// has it. Without the rule both stayed until 1.3× fair, and on the
// shared-prefix workload the worker whose groups drew most requests ended
// the run at 1.12–1.18× fair.
func TestKVEstimateSharedPrefixInUseSpillsAtBound(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight bool
	}{{"group prefix in use", true}, {"own history", false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newKVEnv(t, ttftConfig(), fleet(4)...)
			e.makePrecise()
			prefix := unique(41, 1000)
			holder := kvRecord(0, nil).WorkerID
			e.store(holder, chatTokens(t, prefix))
			running := e.pick(chat(prefix + unique(42, 60)))
			if running.Worker.id != holder {
				t.Fatalf("the first request went to %s, not the holder %s", running.Worker.id, holder)
			}
			if !tc.inFlight {
				e.p.Release(running, Result{Status: 200})
			}
			for i := range 4 {
				e.setPast(kvRecord(i, nil).WorkerID, 9, 0)
			}
			e.setPast(holder, 13, 0)
			got := e.serial(chat(prefix + unique(43, 60)))
			if tc.inFlight {
				e.p.Release(running, Result{Status: 200})
			}
			if (got == holder) == tc.inFlight {
				t.Fatalf("holder at 13 picks, others at 9, a request in flight on the prefix %v: the request went to %s (holder %s)", tc.inFlight, got, holder)
			}
		})
	}
}

// TestKVEstimateSharedHomeIsNoNewHome: requests on a prefix both targets
// hold are placed by the deficit, but not counted as new homes in the cold
// count. a is behind b on picks and intake (22 and 28 decayed picks, the
// tokens in proportion) and gets the next requests until it has caught up.
// Counted as cold picks, each one on a weighed coldWeight times a fair
// share of the cold count against b, and they alternated 4/4 whatever
// the past (shared-prefix: the holder that served shared groups beside
// few of its own at 0.64× fair on picks, its cold term the largest).
func TestKVEstimateSharedHomeIsNoNewHome(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	system := unique(44, 600)
	e.store(a, chatTokens(t, system))
	e.store(b, chatTokens(t, system))
	for id, picks := range map[string]float64{a: 22, b: 28} {
		e.setPast(id, picks, 0)
		tg := e.target0(id)
		tg.mu.Lock()
		tg.est.fills = picks * 200 // about a request's uncached tokens each
		tg.mu.Unlock()
	}
	n := e.newConversations(system, 1000, 8, 150)
	if n[a] < 6 {
		t.Fatalf("8 requests on a prefix both hold, a 6 picks behind b, went %v: a did not catch up", n)
	}
	for _, id := range []string{a, b} {
		if c := e.target0(id).est.coldCount(e.p.seq.Load(), coldHalfLife*2); c != 0 {
			t.Errorf("%s: cold count %.2f after requests on a shared prefix, want 0", id, c)
		}
	}
}

// TestKVEstimateLongColdWaitsLittle: a long cold prompt (above
// longColdShare of the cache) is not sent into a queue while another target
// would start it sooner. a has 500 tokens of prefill queued, b none, and
// the deficit prefers a (b had more picks and new conversations). A short
// cold request still goes by the deficit within the wide slack; a
// 3,000-token one went to a too (its slack, 1.5× the best plus two of its
// own prefills, ≈ 1 s, took in a's 50 ms queue), and now goes to b.
func TestKVEstimateLongColdWaitsLittle(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	e.learnCapacity(a, 400)
	e.learnCapacity(b, 400)
	e.setPast(a, 20, 0)
	e.setPast(b, 30, 4)
	e.queue(a, 500)
	if got := e.serial(chat(unique(30, 300))); got != a {
		t.Fatalf("a short cold request went to %s, not %s, the deficit's choice within the slack", got, a)
	}
	if got := e.serial(chat(unique(31, 3000))); got != b {
		t.Fatalf("a 3,000-token cold prompt went to %s behind 500 queued tokens, not to the idle %s", got, b)
	}
}

// TestKVEstimateWaitsForRoom: a request whose holder's cache is taken by a
// request in flight there (its prompt and max_tokens) waits for that one to
// end before it starts (kvestimate.go, "Admission"). Two 400-block targets;
// a holds two 3,000-token prompts, one of them running with max_tokens
// out. With 500 tokens still to come (5 s at the prior decode pace) the
// other prompt's turn does not fit beside it and goes to the idle b, where
// it is cold; with 10 (0.1 s) it waits on a for its cache; with 500 on a
// target whose answers use 4% of their max_tokens it fits beside it.
func TestKVEstimateWaitsForRoom(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	for _, tc := range []struct {
		out  int
		used int64 // completion tokens the target's answers report (-1: none)
		want string
	}{{500, -1, b}, {10, -1, a}, {500, 20, a}} {
		e, tk, next := runningOnHolder(t, tc.out, 40)
		tk.Worker.stall.noteServed(time.Now().UnixNano(), tk.State)
		if tc.used >= 0 {
			// Earlier answers there used 20 of their 500 tokens: the
			// running one is expected to write as little, and the next
			// prompt fits beside it.
			for range 40 {
				e.p.noteOutput(tk.State.(*kvTicket), tc.used)
			}
		}
		got := e.pick(maxTokensChat(100, next))
		e.p.Release(got, Result{Status: 200})
		e.p.Release(tk, Result{Status: 200})
		if got.Worker.id != tc.want {
			t.Errorf("beside a request with %d tokens to come (answers using %d), the next prompt went to %s, want %s", tc.out, tc.used, got.Worker.id, tc.want)
		}
	}
}

// TestKVEstimateLateTicketStillHoldsRoom: a request decoding past the end
// its max_tokens and the learnt decode pace give it (slowed by the prefills
// beside it) has not ended, so it is not expected to free its blocks with
// its next token: a prompt that needs its room waits for part of its
// modelled decode yet (lateShare) and goes to an idle worker instead, where
// by the modelled end alone it stayed, to wait for room behind it.
func TestKVEstimateLateTicketStillHoldsRoom(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	for _, tc := range []struct {
		out  int           // the running request's max_tokens
		late time.Duration // past the modelled end of its decode
		want string
	}{{500, -4 * time.Second, b}, {500, 0, b}, {500, 10 * time.Second, b}, {10, 10 * time.Second, a}} {
		e, tk, next := runningOnHolder(t, tc.out, 42)
		// Its first token came long enough ago that its modelled decode
		// (tc.out tokens at the prior pace) ended tc.late ago.
		tk.Worker.stall.noteServed(time.Now().UnixNano(), tk.State)
		kt := tk.State.(*kvTicket)
		tg := e.target0(a)
		tg.mu.Lock()
		decode := time.Duration(kt.out * tg.est.perOut * float64(time.Second))
		kt.firstAt = time.Now().Add(-decode - tc.late).UnixNano()
		tg.mu.Unlock()
		got := e.pick(maxTokensChat(100, next))
		e.p.Release(got, Result{Status: 200})
		e.p.Release(tk, Result{Status: 200})
		if got.Worker.id != tc.want {
			t.Errorf("beside a request of %d tokens %v past its modelled decode, the next prompt went to %s, want %s", tc.out, tc.late, got.Worker.id, tc.want)
		}
	}
}

// maxTokensChat is a chat request for content with max_tokens n.
func maxTokensChat(n int, content string) string {
	return `{"model":"m","max_tokens":` + strconv.Itoa(n) + `,"messages":[{"role":"user","content":"` + content + `"}]}`
}

// runningOnHolder sets up two workers of 400-block caches, the first
// holding a 3,000-token prompt and the next one (unique(seed) and
// unique(seed+1)), and picks the first, with max_tokens out, onto its
// holder. It returns the fleet, the running request's ticket and the next
// prompt.
func runningOnHolder(t *testing.T, out int, seed int) (*kvEnv, Ticket, string) {
	t.Helper()
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
	e.makePrecise()
	e.learnCapacity(a, 400)
	e.learnCapacity(b, 400)
	running, next := unique(seed, 3000), unique(seed+1, 3000)
	e.store(a, chatTokens(t, running))
	e.store(a, chatTokens(t, next))
	tk := e.pick(maxTokensChat(out, running))
	if tk.Worker.id != a {
		t.Fatalf("the running prompt went to %s, not its holder %s", tk.Worker.id, a)
	}
	return e, tk, next
}

// TestKVEstimateLongWarmCopyPaysForEviction: a warm request whose holder
// is busy moves only if its copy on the idle target leaves that target's
// recent prompts in place. Two 400-block targets (6,400 tokens); a holds
// the 3,000-token prompt and 2.5 of its prefills queued, so by time alone
// (the queue against a prefill and the redo charge on b) it moves to b. On
// b a 3,500-token prompt was just used: the 3,000-token copy would evict
// it, and the copy is charged its prefill, so the request stays; beside a
// 1,000-token prompt the copy fits, evicts nothing, and the request moves.
func TestKVEstimateLongWarmCopyPaysForEviction(t *testing.T) {
	a, b := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
	for _, tc := range []struct {
		recent int // tokens of the prompt just used on b
		want   string
	}{{3500, a}, {1000, b}} {
		e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
		e.makePrecise()
		e.learnCapacity(a, 400)
		e.learnCapacity(b, 400)
		recent := unique(60, tc.recent)
		e.store(b, chatTokens(t, recent))
		if got := e.serial(chat(recent)); got != b {
			t.Fatalf("the %d-token prompt went to %s, not its holder %s", tc.recent, got, b)
		}
		warm := unique(61, 3000)
		tokens := chatTokens(t, warm)
		e.store(a, tokens)
		e.queue(a, 2.5*float64(len(tokens)))
		if got := e.serial(chat(warm)); got != tc.want {
			t.Errorf("beside a %d-token prompt just used on %s, the warm prompt went to %s, want %s", tc.recent, b, got, tc.want)
		}
	}
}
