package kvcache

import (
	"fmt"
	"sync"
	"time"
)

// Divergence compares, per worker, the prompt tokens the router predicted
// the engine would find cached with the cached tokens the engine reports
// (usage.prompt_tokens_details.cached_tokens, or the engine's prefix-cache
// hit counters). When the router's tokenization or chat template differs
// from the engine's, the router keeps predicting hits the engine never has:
// kv-aware routing then runs at a 0% hit rate and nothing else says so.
//
// It also compares the prompt's token count, the router's and the engine's
// (usage.prompt_tokens), where both are known: a router that tokenizes or
// renders the chat differently counts other tokens for most prompts, even
// when its predictions happen to match the engine's hits (a precise index
// fed by the engine's own events, which the router's hashes never match).
//
// Observations are summed over a sliding window of the last
// DivergenceConfig.Window requests of a worker. A worker diverges when the
// window holds at least MinPredicted predicted tokens and the engine
// reported fewer than Ratio of them (CauseCachedTokens; MinRequests
// requests at least), or when it holds
// at least MinPrompts counted prompts and more than half of them were
// counted differently (CausePromptTokens); it recovers when neither holds
// on a window with enough data. Observe says when a warning is due: on the
// transition to divergent, at most once per WarnEvery per worker.
//
// Safe for concurrent use; Observe takes one mutex and allocates only when
// it first sees a worker.
type Divergence struct {
	cfg     DivergenceConfig
	mu      sync.Mutex
	workers map[string]*divergenceState
}

// DivergenceConfig tunes Divergence.
type DivergenceConfig struct {
	Window       int           // requests per worker in the window (≥ 1)
	MinPredicted int64         // predicted cached tokens in the window before a verdict
	Ratio        float64       // reported/predicted below this: divergent (0 < Ratio < 1)
	WarnEvery    time.Duration // at most one warning per worker per period
	// MinPrompts is how many requests of the window must carry both prompt
	// token counts before they decide (more than half differing:
	// divergent); 0 turns the prompt-count rule off.
	MinPrompts int
	// MinRequests is how many requests the window must hold before the
	// cached-token rule decides (a few long prompts are not a trend).
	MinRequests int
}

// DefaultDivergenceConfig: 50 requests, 1024 predicted tokens over at least
// 10 requests, an engine reporting under a quarter of the predicted hits, 8
// counted prompts, one warning an hour.
func DefaultDivergenceConfig() DivergenceConfig {
	return DivergenceConfig{Window: 50, MinPredicted: 1024, Ratio: 0.25, WarnEvery: time.Hour, MinPrompts: 8, MinRequests: 10}
}

// Validate checks the configuration.
func (c DivergenceConfig) Validate() error {
	if c.Window < 1 || c.MinPredicted < 1 || c.Ratio <= 0 || c.Ratio >= 1 || c.WarnEvery < 0 || c.MinPrompts < 0 || c.MinRequests < 0 {
		return fmt.Errorf("divergence window %d, min predicted %d, ratio %v, warn every %v, min prompts %d, min requests %d: %w",
			c.Window, c.MinPredicted, c.Ratio, c.WarnEvery, c.MinPrompts, c.MinRequests, ErrInvalidConfig)
	}
	return nil
}

// DivergenceCause says which rule found a worker divergent.
type DivergenceCause uint8

const (
	CauseNone         DivergenceCause = iota
	CauseCachedTokens                 // the engine reports far fewer cached tokens than predicted
	CausePromptTokens                 // the engine counts most prompts' tokens differently
)

// String is the cause's label: "", "cached_tokens" or "prompt_tokens".
func (c DivergenceCause) String() string {
	switch c {
	case CauseCachedTokens:
		return "cached_tokens"
	case CausePromptTokens:
		return "prompt_tokens"
	}
	return ""
}

// DivergenceSample is one request's observation. A prompt count of 0 is
// unknown (that request does not take part in the prompt-count rule).
type DivergenceSample struct {
	Predicted, Reported        int64 // cached prompt tokens: the router's prediction, the engine's report
	RouterPrompt, EnginePrompt int64 // prompt tokens as each counted them
	// NoCached: the engine reported no cached count (Predicted and
	// Reported are 0 and take no part in the reported hit ratio).
	NoCached bool
}

type divergenceState struct {
	ring            []DivergenceSample // Window observations
	next, n         int
	sumPred, sumRep int64
	counted, differ int   // observations with both counts; of them, differing
	sumEngPrompt    int64 // engine prompt tokens of the counted ones
	sumEngCached    int64 // engine cached tokens of the counted ones
	divergent       bool
	cause           DivergenceCause
	last            DivergenceSample // the last observation whose counts differed
	warned          time.Time
}

// NewDivergence returns a detector; cfg must be valid.
func NewDivergence(cfg DivergenceConfig) (*Divergence, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Divergence{cfg: cfg, workers: make(map[string]*divergenceState)}, nil
}

// DivergenceStatus is a worker's state after an observation.
type DivergenceStatus struct {
	Predicted, Reported int64 // sums over the window
	Requests            int   // observations in the window
	// Counted: observations of the window with both prompt counts;
	// Differing: those whose counts differ.
	Counted, Differing int
	// EnginePrompt and EngineCached sum the engine's prompt and cached
	// tokens over the counted observations that reported both (its
	// reported hit ratio).
	EnginePrompt, EngineCached int64
	// LastDiffering is the last observation whose counts differed.
	LastDiffering DivergenceSample
	Divergent     bool
	Cause         DivergenceCause // why Divergent
	// Warn: the worker just became divergent and no warning was given
	// for it within WarnEvery: the caller logs one.
	Warn bool
}

// Ratio is the reported share of the predicted cached tokens (1 when
// nothing was predicted).
func (s DivergenceStatus) Ratio() float64 {
	if s.Predicted <= 0 {
		return 1
	}
	return float64(s.Reported) / float64(s.Predicted)
}

// Observe records one request of worker: predicted cached prompt tokens (the
// router's) and reported ones (the engine's).
func (d *Divergence) Observe(worker string, predicted, reported int64, now time.Time) DivergenceStatus {
	return d.ObserveSample(worker, DivergenceSample{Predicted: predicted, Reported: reported}, now)
}

// ObserveSample records one request of worker.
func (d *Divergence) ObserveSample(worker string, s DivergenceSample, now time.Time) DivergenceStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.workers[worker]
	if st == nil {
		st = &divergenceState{ring: make([]DivergenceSample, d.cfg.Window)}
		d.workers[worker] = st
	}
	s.Predicted, s.Reported = max(s.Predicted, 0), max(s.Reported, 0)
	s.RouterPrompt, s.EnginePrompt = max(s.RouterPrompt, 0), max(s.EnginePrompt, 0)
	st.remove(st.ring[st.next])
	st.ring[st.next] = s
	st.add(s)
	st.next = (st.next + 1) % d.cfg.Window
	st.n = min(st.n+1, d.cfg.Window)

	byCache := st.sumPred >= d.cfg.MinPredicted && st.n >= d.cfg.MinRequests
	byCount := d.cfg.MinPrompts > 0 && st.counted >= d.cfg.MinPrompts
	warn := false
	if byCache || byCount {
		was := st.divergent
		st.cause = CauseNone
		switch {
		case byCount && 2*st.differ > st.counted:
			st.cause = CausePromptTokens
		case byCache && float64(st.sumRep) < d.cfg.Ratio*float64(st.sumPred):
			st.cause = CauseCachedTokens
		}
		st.divergent = st.cause != CauseNone
		if st.divergent && !was && (st.warned.IsZero() || now.Sub(st.warned) >= d.cfg.WarnEvery) {
			warn = true
			st.warned = now
		}
	}
	out := st.status()
	out.Warn = warn
	return out
}

func counted(s DivergenceSample) bool { return s.RouterPrompt > 0 && s.EnginePrompt > 0 }

func (st *divergenceState) add(s DivergenceSample) {
	st.sumPred += s.Predicted
	st.sumRep += s.Reported
	if counted(s) {
		st.counted++
		if !s.NoCached {
			st.sumEngPrompt += s.EnginePrompt
			st.sumEngCached += s.Reported
		}
		if s.RouterPrompt != s.EnginePrompt {
			st.differ++
			st.last = s
		}
	}
}

func (st *divergenceState) remove(s DivergenceSample) {
	st.sumPred -= s.Predicted
	st.sumRep -= s.Reported
	if counted(s) {
		st.counted--
		if !s.NoCached {
			st.sumEngPrompt -= s.EnginePrompt
			st.sumEngCached -= s.Reported
		}
		if s.RouterPrompt != s.EnginePrompt {
			st.differ--
		}
	}
}

func (st *divergenceState) status() DivergenceStatus {
	return DivergenceStatus{Predicted: st.sumPred, Reported: st.sumRep, Requests: st.n,
		Counted: st.counted, Differing: st.differ, EnginePrompt: st.sumEngPrompt, EngineCached: st.sumEngCached,
		LastDiffering: st.last, Divergent: st.divergent, Cause: st.cause}
}

// Status returns a worker's current state (zero when never observed).
func (d *Divergence) Status(worker string) DivergenceStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.workers[worker]
	if st == nil {
		return DivergenceStatus{}
	}
	return st.status()
}

// Each calls fn with every observed worker's state, under the detector's
// lock (fn must not call back into d).
func (d *Divergence) Each(fn func(worker string, st DivergenceStatus)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for w, st := range d.workers {
		fn(w, st.status())
	}
}

// Forget drops a worker (it left the fleet).
func (d *Divergence) Forget(worker string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.workers, worker)
}
