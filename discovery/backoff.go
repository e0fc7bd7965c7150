package discovery

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoff yields exponentially growing, jittered delays between min and max
// so that many routers and workers retrying against a recovering etcd do not
// arrive in lockstep.
type backoff struct {
	min, max time.Duration
	cur      time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur < b.min {
		b.cur = b.min
	} else {
		b.cur *= 2
	}
	if b.cur > b.max {
		b.cur = b.max
	}
	// ±10% jitter.
	j := time.Duration(rand.Int64N(int64(b.cur)/5 + 1))
	return b.cur - b.cur/10 + j
}

func (b *backoff) reset() { b.cur = 0 }

// sleepCtx waits for d or until ctx is done; it reports whether the full
// delay elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
