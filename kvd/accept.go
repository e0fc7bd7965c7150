package kvd

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// AcceptRetry keeps an accept loop alive through errors that pass: out
// of file descriptors (EMFILE, ENFILE), buffers or memory, or a peer that
// aborted before accept (ECONNABORTED). It backs off from 5 ms doubling to
// 1 s, so a daemon at its fd limit neither spins nor exits, and logs at
// most once a minute. One loop owns one AcceptRetry.
type AcceptRetry struct {
	delay   time.Duration
	lastLog time.Time
	// Retries counts accept errors waited out.
	Retries int64
}

// Retryable reports whether an accept error passes with time.
func Retryable(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EINTR)
}

// Wait sleeps before the next accept after err and returns true, or
// returns false at once when err is not retryable or ctx ends (the loop
// then stops).
func (a *AcceptRetry) Wait(ctx context.Context, err error, log zerolog.Logger, listener string) bool {
	if ctx.Err() != nil || !Retryable(err) {
		return false
	}
	a.Retries++
	if a.delay == 0 {
		a.delay = 5 * time.Millisecond
	} else {
		a.delay = min(2*a.delay, time.Second)
	}
	if now := time.Now(); now.Sub(a.lastLog) >= time.Minute {
		a.lastLog = now
		log.Error().Err(err).Str("listener", listener).Float64("retry_s", a.delay.Seconds()).
			Msg("accept failed (out of file descriptors?): backing off, still serving the open connections")
	}
	t := time.NewTimer(a.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Reset ends a run of errors (an accept succeeded).
func (a *AcceptRetry) Reset() { a.delay = 0 }
