package router

import (
	"sync"
	"sync/atomic"
	"time"
)

// Breaker states. infera_router_worker_breaker_state exports them with
// Infera's numbers (0 closed, 1 half-open, 2 open): see inferaBreakerValue.
const (
	breakerClosed   uint32 = 0 // routing normally
	breakerOpen     uint32 = 1 // tripped: skipped until the cooldown ends
	breakerHalfOpen uint32 = 2 // cooldown over: one probe request decides
)

// verdict is what one attempt on a worker says about the worker's health.
type verdict uint8

const (
	verdictSuccess verdict = iota // a complete 2xx answer
	verdictFault                  // connect error, 5xx, timeout, broken stream
	verdictNeutral                // 4xx (429 too), client gone: the worker is fine
)

// breakerConfig is shared by every worker's breaker.
type breakerConfig struct {
	threshold   int32
	cooldown    time.Duration
	maxCooldown time.Duration
}

// cooldownFor returns the open period after trips consecutive trips
// (trips ≥ 1): the base cooldown doubled per re-trip, capped.
func (c *breakerConfig) cooldownFor(trips int) time.Duration {
	d := c.cooldown
	for i := 1; i < trips && d < c.maxCooldown; i++ {
		d *= 2
	}
	return min(d, c.maxCooldown)
}

// breaker is one worker's circuit breaker. A closed breaker costs the
// request path two atomic loads; transitions take the mutex. Time is passed
// in, so that tests drive every transition with a fake clock.
type breaker struct {
	state atomic.Uint32
	fails atomic.Int32 // consecutive faults while closed

	mu        sync.Mutex
	openUntil time.Time
	trips     int  // consecutive trips without a successful probe: the cooldown's exponent
	probing   bool // half-open: the probe is in flight
}

// breakerEvent reports a transition worth a log line and a metric.
type breakerEvent uint8

const (
	breakerNoChange breakerEvent = iota
	breakerTripped
	breakerRecovered
)

// State returns the breaker state (breakerClosed, breakerOpen,
// breakerHalfOpen). An open breaker whose cooldown has ended still reads
// open until a request probes it.
func (b *breaker) State() uint32 { return b.state.Load() }

// available reports whether the worker may be offered to the policy now:
// closed, open with the cooldown over (the next pick probes), or half-open
// with no probe in flight.
func (b *breaker) available(now time.Time) bool {
	if b.state.Load() == breakerClosed {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case breakerOpen:
		return !now.Before(b.openUntil)
	case breakerHalfOpen:
		return !b.probing
	}
	return true
}

// admit is called once a request is routed to the worker. It returns true
// when the request is the half-open probe (its verdict closes or re-opens
// the breaker).
func (b *breaker) admit(now time.Time) bool {
	if b.state.Load() == breakerClosed {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case breakerOpen:
		if now.Before(b.openUntil) {
			return false // routed anyway: every candidate was open
		}
		b.state.Store(breakerHalfOpen)
		b.probing = true
		return true
	case breakerHalfOpen:
		if !b.probing {
			b.probing = true
			return true
		}
	}
	return false
}

// record takes the verdict of a finished attempt; probe says whether admit
// made it the probe.
func (b *breaker) record(v verdict, probe bool, now time.Time, cfg *breakerConfig) breakerEvent {
	if b.state.Load() == breakerClosed {
		switch v {
		case verdictSuccess:
			if b.fails.Load() != 0 {
				b.fails.Store(0)
			}
			return breakerNoChange
		case verdictNeutral:
			return breakerNoChange
		}
		if b.fails.Add(1) < cfg.threshold {
			return breakerNoChange
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case breakerClosed:
		if v == verdictFault && b.fails.Load() >= cfg.threshold {
			b.trip(now, cfg)
			return breakerTripped
		}
	case breakerOpen:
		// Only requests routed anyway (all candidates open) land here; one
		// that succeeds proves the worker is back.
		if v == verdictSuccess {
			b.reset()
			return breakerRecovered
		}
	case breakerHalfOpen:
		switch {
		case v == verdictSuccess:
			b.reset()
			return breakerRecovered
		case v == verdictFault && probe:
			b.trip(now, cfg)
			return breakerTripped
		case probe:
			// A neutral probe (4xx, client gone) proves nothing: let the
			// next request probe.
			b.probing = false
		}
	}
	return breakerNoChange
}

func (b *breaker) trip(now time.Time, cfg *breakerConfig) {
	b.trips++
	b.openUntil = now.Add(cfg.cooldownFor(b.trips))
	b.probing = false
	b.fails.Store(0)
	b.state.Store(breakerOpen)
}

func (b *breaker) reset() {
	b.trips = 0
	b.probing = false
	b.fails.Store(0)
	b.state.Store(breakerClosed)
}
