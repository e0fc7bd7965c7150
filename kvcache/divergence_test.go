package kvcache_test

import (
	"errors"
	"testing"
	"time"

	"github.com/infera/infera/kvcache"
)

func newDivergence(t *testing.T) *kvcache.Divergence {
	t.Helper()
	d, err := kvcache.NewDivergence(kvcache.DefaultDivergenceConfig())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A shared-prefix workload: every prompt's first request predicts nothing,
// the next ones predict the 768-token prefix. A matched engine reports
// those hits (and sometimes more); a mismatched one (another chat template
// or tokenizer: its token ids differ) reports none.
func TestDivergenceFiresOnMismatchQuietOnMatch(t *testing.T) {
	d := newDivergence(t)
	now := time.Unix(1_700_000_000, 0)
	warned, firedAt := 0, 0
	for i := 1; i <= 300; i++ {
		predicted := int64(768)
		if i%10 == 1 {
			predicted = 0 // a new prefix
		}
		now = now.Add(100 * time.Millisecond)
		if st := d.Observe("matched:1", predicted, predicted+int64(i%3)*16, now); st.Divergent || st.Warn {
			t.Fatalf("matched worker divergent at request %d: %+v", i, st)
		}
		st := d.Observe("mismatched:1", predicted, 0, now)
		if st.Warn {
			warned++
			if firedAt == 0 {
				firedAt = i
			}
		}
		if i > 100 && !st.Divergent {
			t.Fatalf("mismatched worker not divergent at request %d: %+v", i, st)
		}
	}
	if firedAt == 0 || firedAt > 100 || warned != 1 {
		t.Fatalf("warned %d times, first at request %d; want once within 100 requests", warned, firedAt)
	}
	if st := d.Status("mismatched:1"); !st.Divergent || st.Ratio() != 0 || st.Requests != 50 {
		t.Fatalf("status %+v", st)
	}
}

// Recovery clears the state; a new divergence warns again only after
// WarnEvery.
func TestDivergenceRecoversAndRateLimits(t *testing.T) {
	cfg := kvcache.DefaultDivergenceConfig()
	cfg.Window, cfg.MinPredicted, cfg.WarnEvery, cfg.MinRequests = 4, 100, time.Minute, 4
	d, err := kvcache.NewDivergence(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	feed := func(rep int64) kvcache.DivergenceStatus {
		var st kvcache.DivergenceStatus
		warn := false
		for range 4 {
			now = now.Add(time.Second)
			st = d.Observe("w", 100, rep, now)
			warn = warn || st.Warn
		}
		st.Warn = warn
		return st
	}
	if st := feed(0); !st.Divergent || !st.Warn {
		t.Fatalf("first divergence: %+v", st)
	}
	if st := feed(100); st.Divergent || st.Warn {
		t.Fatalf("recovered: %+v", st)
	}
	if st := feed(0); !st.Divergent || st.Warn {
		t.Fatalf("second divergence within WarnEvery warned: %+v", st)
	}
	feed(100)
	now = now.Add(time.Minute)
	if st := feed(0); !st.Divergent || !st.Warn {
		t.Fatalf("divergence after WarnEvery: %+v", st)
	}
	d.Forget("w")
	if st := d.Status("w"); st.Requests != 0 {
		t.Fatalf("forgotten worker: %+v", st)
	}
}

func TestDivergenceConfigInvalid(t *testing.T) {
	for _, c := range []kvcache.DivergenceConfig{{Window: 0, MinPredicted: 1, Ratio: 0.5}, {Window: 1, MinPredicted: 1, Ratio: 1}, {Window: 1, MinPredicted: 0, Ratio: 0.5}} {
		if _, err := kvcache.NewDivergence(c); !errors.Is(err, kvcache.ErrInvalidConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

func TestDivergenceObserveAllocs(t *testing.T) {
	d := newDivergence(t)
	now := time.Now()
	d.Observe("w", 1, 1, now)
	if n := testing.AllocsPerRun(100, func() { d.Observe("w", 512, 0, now) }); n != 0 {
		t.Fatalf("Observe allocates %v per call", n)
	}
}

// The prompt-count rule: a router rendering another template counts other
// tokens for every prompt, even where the cached counts agree; unknown
// counts (0) take no part; a matched worker stays quiet.
func TestDivergencePromptCounts(t *testing.T) {
	d := newDivergence(t)
	now := time.Unix(1_700_000_000, 0)
	fired := 0
	for i := 1; i <= 60; i++ {
		st := d.ObserveSample("other-template", kvcache.DivergenceSample{Predicted: 64, Reported: 64, RouterPrompt: 120, EnginePrompt: 104}, now)
		if st.Warn {
			if fired != 0 {
				t.Fatalf("second warning at %d", i)
			}
			fired = i
			if st.Cause != kvcache.CausePromptTokens || st.Cause.String() != "prompt_tokens" || st.LastDiffering.RouterPrompt != 120 {
				t.Fatalf("status %+v", st)
			}
		}
		if st := d.ObserveSample("matched", kvcache.DivergenceSample{Predicted: 64, Reported: 64, RouterPrompt: 120, EnginePrompt: 120}, now); st.Divergent {
			t.Fatalf("matched divergent: %+v", st)
		}
		if st := d.ObserveSample("unknown", kvcache.DivergenceSample{RouterPrompt: 120}, now); st.Divergent || st.Counted != 0 {
			t.Fatalf("unknown counts: %+v", st)
		}
		if st := d.ObserveSample("no-cached", kvcache.DivergenceSample{RouterPrompt: 120, EnginePrompt: 120, NoCached: true}, now); st.Divergent || st.EnginePrompt != 0 || st.Counted == 0 {
			t.Fatalf("no cached count: %+v", st)
		}
	}
	if fired != 8 {
		t.Fatalf("fired at %d, want 8 (MinPrompts)", fired)
	}
	seen := map[string]bool{}
	d.Each(func(w string, st kvcache.DivergenceStatus) { seen[w] = st.Divergent })
	if len(seen) != 4 || !seen["other-template"] || seen["matched"] {
		t.Fatalf("Each: %v", seen)
	}
	if st := d.Status("matched"); st.EnginePrompt != 50*120 || st.EngineCached != 50*64 {
		t.Fatalf("matched sums %+v", st)
	}
}
