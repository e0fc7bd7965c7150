package router

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/rs/zerolog"

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
	tk.Worker.stall.noteServed(start)
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

// TestKVEstimateColdSpreadsByDeficit: cold requests on an idle fleet go
// round it evenly.
func TestKVEstimateColdSpreadsByDeficit(t *testing.T) {
	e := newKVEnv(t, ttftConfig(), fleet(4)...)
	e.makePrecise()
	n := map[string]int{}
	for i := range 40 {
		n[e.serial(chat(unique(200+i, 500)))]++
	}
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
	body := chat(unique(3, 2000))
	e.store(kvRecord(3, nil).WorkerID, chatTokens(t, unique(3, 2000)))
	var req openai.Request
	if err := openai.Scan([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	in := &PickInput{Route: RouteChatCompletions, Body: []byte(body), Request: &req}
	c := e.cands()
	run := func() {
		tk, err := e.p.Pick(in, c)
		if err != nil {
			t.Fatal(err)
		}
		tk.Worker.stall.noteServed(time.Now().UnixNano())
		e.p.Release(tk, Result{})
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
// share of the picks; a conversation whose history only one holds stays there.
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
		// The bound holds after every pick: never above 1.15 × 30.
		if n[b] == 0 || float64(n[a]) > 1.15*30 {
			t.Fatalf("picks %v: the hot prefix did not spill within the share", n)
		}
	})
	t.Run("history stays", func(t *testing.T) {
		e := newKVEnv(t, ttftConfig(), kvRecord(0, nil), kvRecord(1, nil))
		e.makePrecise()
		long := unique(7, 4000)
		e.store(a, chatTokens(t, long))
		for range 60 {
			if got := e.serial(chat(long)); got != a {
				t.Fatalf("a request whose prefix only %s holds went to %s", a, got)
			}
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
