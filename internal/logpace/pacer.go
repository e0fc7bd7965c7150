package logpace

import (
	"sync"
	"time"
)

// Pacer lets one line through a period. Its zero value is ready.
type Pacer struct {
	mu      sync.Mutex
	last    time.Time // the last line let through; zero: none yet
	skipped int64     // lines held back since
}

// Allow says whether a line may be logged now, every after the last one
// let through, and, when it may, how many were held back since then.
func (p *Pacer) Allow(every time.Duration) (ok bool, skipped int64) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.last.IsZero() && now.Sub(p.last) < every {
		p.skipped++
		return false, 0
	}
	skipped = p.skipped
	p.last, p.skipped = now, 0
	return true, skipped
}
