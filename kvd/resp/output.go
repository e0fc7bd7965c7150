package resp

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// outputLogEvery is how often a client disconnected over its output
// limits is logged; the ones between are counted in the next line (and
// every one in Counters).
const outputLogEvery = 10 * time.Second

// outputLog rate-limits the output-limit disconnect warning: a flood of
// clients that do not read cannot flood the log.
type outputLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int64
}

func (o *outputLog) log(l zerolog.Logger, cn *conn, err error, limit string, bytes int64) {
	o.mu.Lock()
	now := time.Now()
	if now.Sub(o.last) < outputLogEvery {
		o.suppressed++
		o.mu.Unlock()
		return
	}
	o.last = now
	n := o.suppressed
	o.suppressed = 0
	o.mu.Unlock()
	l.Warn().Err(err).Uint64("client_id", cn.id).Str("limit", limit).Int64("bytes", bytes).Int64("not_logged_since_last", n).
		Msg("resp client disconnected over its output buffer limit")
}
