package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// ErrServe wraps a failure of the server's own accept loop.
var ErrServe = errors.New("serve http")

// drainBound is how long Serve waits, after Options.Overdue, for the
// server's connections to close.
const drainBound = 5 * time.Second

// Options tunes Serve.
type Options struct {
	// Grace bounds the graceful shutdown: in-flight requests may finish
	// within it. Zero means no wait beyond closing idle connections.
	Grace time.Duration
	// Overdue, if set, runs when the grace ran out with requests still in
	// flight (the router cuts its running streams there); Serve then waits
	// a few seconds more for the connections to close. Without it Serve
	// returns the shutdown's error in that case.
	Overdue func()
}

// Serve serves srv on ln until ctx ends, then shuts srv down: it stops
// accepting, lets in-flight requests finish within opts.Grace, and closes
// ln. It returns nil after a clean shutdown, or the accept loop's error
// (wrapping ErrServe) when that ended on its own. It returns promptly even when ctx
// has ended before the server registered ln (fasthttp's Shutdown alone
// does nothing then, and Serve would run forever).
func Serve(ctx context.Context, srv *fasthttp.Server, ln net.Listener, opts Options) error {
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		_ = ln.Close()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrServe, err)
		}
		return nil
	case <-ctx.Done():
	}
	grace, cancel := context.WithTimeout(context.WithoutCancel(ctx), opts.Grace)
	err := srv.ShutdownWithContext(grace)
	cancel()
	var shutErr error
	switch {
	case err != nil && opts.Overdue == nil:
		shutErr = fmt.Errorf("shut down http server: %w", err)
	case err != nil:
		opts.Overdue()
		deadline := time.Now().Add(drainBound)
		for srv.GetOpenConnectionsCount() > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Ends srv.Serve in every case, also when it registered ln only after
	// the shutdown above.
	_ = ln.Close()
	if err := <-serveErr; err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("%w: %w", ErrServe, err)
	}
	return shutErr
}
