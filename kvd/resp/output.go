package resp

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/logpace"
)

// outputLogEvery is how often a client disconnected over its output
// limits is logged; the ones between are counted in the next line (and
// every one in Counters).
const outputLogEvery = 10 * time.Second

// outputLog rate-limits the output-limit disconnect warning: a flood of
// clients that do not read cannot flood the log.
type outputLog struct{ pace logpace.Pacer }

func (o *outputLog) log(l zerolog.Logger, cn *conn, err error, limit string, bytes int64) {
	ok, n := o.pace.Allow(outputLogEvery)
	if !ok {
		return
	}
	l.Warn().Err(err).Uint64("client_id", cn.id).Str("limit", limit).Int64("bytes", bytes).Int64("not_logged_since_last", n).
		Msg("resp client disconnected over its output buffer limit")
}
