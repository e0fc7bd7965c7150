package engines

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// maxProbeTimeout bounds one health or metrics request, so a hung engine
// socket cannot stall a poll loop past its interval for long.
const maxProbeTimeout = 5 * time.Second

// probeClient is used for engine health and metrics polls. Keep-alives are
// off: polls are infrequent, and no idle connection (with its goroutines)
// outlives a poll loop.
var probeClient = &http.Client{
	Transport: &http.Transport{
		Proxy:             nil, // engines are reached directly, never through HTTP_PROXY
		DisableKeepAlives: true,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// WaitHealthy polls GET url every interval until it answers 200. It fails
// early, wrapping ErrExited and the exit status, if the process exits; with
// ErrNotHealthy once deadline has passed; or with ctx's error.
func (p *Process) WaitHealthy(ctx context.Context, url string, interval, deadline time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("wait healthy: interval %v must be positive", interval)
	}
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	var last error
	for {
		ok, err := probe(ctx, url, min(interval, maxProbeTimeout))
		if ok {
			return nil
		}
		// A probe cut short by the deadline says less than the one before it.
		if ctx.Err() == nil || last == nil {
			last = err
		}
		select {
		case <-p.done:
			return fmt.Errorf("wait for %s healthy: %w: %s", p.name, ErrExited, exitStatus(p.exitErr))
		case <-ctx.Done():
			// The process may have exited in the same instant; its exit is the
			// better explanation.
			select {
			case <-p.done:
				return fmt.Errorf("wait for %s healthy: %w: %s", p.name, ErrExited, exitStatus(p.exitErr))
			default:
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("wait for %s healthy at %s: %w after %v (last: %w)", p.name, url, ErrNotHealthy, deadline, last)
			}
			return fmt.Errorf("wait for %s healthy: %w", p.name, ctx.Err())
		case <-ticker.C:
		}
	}
}

// exitStatus describes how a process ended ("exit status 1", "signal:
// killed"). The exec error is deliberately not wrapped: *exec.ExitError has
// an ExitCode method, which main would take for the worker's own exit code
// (255 for a signal) instead of the plain failure code.
func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// probe does one GET and reports whether it answered 200.
func probe(ctx context.Context, url string, timeout time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, fmt.Errorf("health request: %w", err)
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return false, fmt.Errorf("health request: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("health status %d", resp.StatusCode)
	}
	return true, nil
}
