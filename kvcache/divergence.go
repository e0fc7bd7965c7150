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
// Observations are summed over a sliding window of the last
// DivergenceConfig.Window requests of a worker. A worker diverges when the
// window holds at least MinPredicted predicted tokens and the engine
// reported fewer than Ratio of them; it recovers when the reported share is
// back above Ratio. Observe says when a warning is due: on the transition to
// divergent, at most once per WarnEvery per worker.
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
}

// DefaultDivergenceConfig: 50 requests, 1024 predicted tokens, an engine
// reporting under a quarter of the predicted hits, one warning an hour.
func DefaultDivergenceConfig() DivergenceConfig {
	return DivergenceConfig{Window: 50, MinPredicted: 1024, Ratio: 0.25, WarnEvery: time.Hour}
}

// Validate checks the configuration.
func (c DivergenceConfig) Validate() error {
	if c.Window < 1 || c.MinPredicted < 1 || c.Ratio <= 0 || c.Ratio >= 1 || c.WarnEvery < 0 {
		return fmt.Errorf("divergence window %d, min predicted %d, ratio %v, warn every %v: %w",
			c.Window, c.MinPredicted, c.Ratio, c.WarnEvery, ErrInvalidConfig)
	}
	return nil
}

type divergenceState struct {
	predicted, reported []int64 // rings of Window observations
	next, n             int
	sumPred, sumRep     int64
	divergent           bool
	warned              time.Time
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
	Divergent           bool
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
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.workers[worker]
	if st == nil {
		st = &divergenceState{predicted: make([]int64, d.cfg.Window), reported: make([]int64, d.cfg.Window)}
		d.workers[worker] = st
	}
	predicted, reported = max(predicted, 0), max(reported, 0)
	st.sumPred += predicted - st.predicted[st.next]
	st.sumRep += reported - st.reported[st.next]
	st.predicted[st.next], st.reported[st.next] = predicted, reported
	st.next = (st.next + 1) % d.cfg.Window
	st.n = min(st.n+1, d.cfg.Window)

	out := DivergenceStatus{Predicted: st.sumPred, Reported: st.sumRep, Requests: st.n}
	if st.sumPred >= d.cfg.MinPredicted {
		was := st.divergent
		st.divergent = float64(st.sumRep) < d.cfg.Ratio*float64(st.sumPred)
		if st.divergent && !was && (st.warned.IsZero() || now.Sub(st.warned) >= d.cfg.WarnEvery) {
			out.Warn = true
			st.warned = now
		}
	}
	out.Divergent = st.divergent
	return out
}

// Status returns a worker's current state (zero when never observed).
func (d *Divergence) Status(worker string) DivergenceStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.workers[worker]
	if st == nil {
		return DivergenceStatus{}
	}
	return DivergenceStatus{Predicted: st.sumPred, Reported: st.sumRep, Requests: st.n, Divergent: st.divergent}
}

// Forget drops a worker (it left the fleet).
func (d *Divergence) Forget(worker string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.workers, worker)
}
