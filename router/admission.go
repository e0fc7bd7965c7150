package router

import (
	"errors"
	"sync"
	"sync/atomic"
)

// Admission errors.
var (
	// ErrSaturated: every candidate worker stayed at --max-inflight-per-worker
	// for the whole queue timeout.
	ErrSaturated = errors.New("router: all workers are at their in-flight limit")
	// errNoCandidate: every candidate was tried already (or none is left).
	errNoCandidate = errors.New("router: no untried worker left")
)

// admission caps in-flight requests per worker and lets requests that
// found every worker full wait for a slot. A request that frees a slot
// closes the current wake channel, so waiters re-check at once: no polling.
// The request path pays one atomic load to learn that nobody waits.
type admission struct {
	limit   int64 // per worker; 0 means no limit
	waiting atomic.Int32

	mu   sync.Mutex
	wake chan struct{} // closed (and replaced) when a slot frees
}

// saturated reports whether w is at the limit.
func (a *admission) saturated(w *Worker) bool {
	return a.limit > 0 && w.inflight.Load() >= a.limit
}

// reserve takes a slot on w, unless w is full (another request took the
// last slot since the caller looked).
func (a *admission) reserve(w *Worker) bool {
	if a.limit <= 0 {
		if w.inflight.Add(1) == 1 {
			w.stall.busy()
		}
		return true
	}
	for {
		n := w.inflight.Load()
		if n >= a.limit {
			return false
		}
		if w.inflight.CompareAndSwap(n, n+1) {
			if n == 0 {
				w.stall.busy()
			}
			return true
		}
	}
}

// release gives a slot back and wakes the waiters, if any.
func (a *admission) release(w *Worker) {
	w.inflight.Add(-1)
	if a.waiting.Load() > 0 {
		a.mu.Lock()
		if a.wake != nil {
			close(a.wake)
			a.wake = nil
		}
		a.mu.Unlock()
	}
}

// waitChan returns the channel closed by the next release. A waiter must
// be counted (waiting) before it last checks the workers, so that a slot
// freed after that check closes the channel it holds.
func (a *admission) waitChan() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.wake == nil {
		a.wake = make(chan struct{})
	}
	return a.wake
}
