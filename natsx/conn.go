package natsx

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// DefaultURL is the server without --nats-server and NATS_SERVER.
const DefaultURL = "nats://127.0.0.1:4222"

// ErrConnect reports a NATS server that cannot be reached or refuses us.
var ErrConnect = errors.New("natsx: cannot connect to nats")

// Config is how Infera reaches its NATS server. Credentials the URL
// carries (nats://user:password@host or nats://token@host) are used as
// they are; CredsFile (a JWT + seed .creds file), NKeyFile (an nkey seed
// file) and CAFile (a PEM CA bundle for tls:// servers) add the rest.
type Config struct {
	URL       string // one or more comma-separated server URLs; empty: NATS_SERVER, else DefaultURL
	CredsFile string
	NKeyFile  string
	CAFile    string
	// Name is the connection name the server shows (infera-serve, infera-worker).
	Name string
}

// ResolveURL returns explicit, else $NATS_SERVER, else DefaultURL, as the
// reference resolves it.
func ResolveURL(explicit string) string {
	if explicit != "" {
		return explicit
	}
	if v := os.Getenv("NATS_SERVER"); v != "" {
		return v
	}
	return DefaultURL
}

// Redacted is url without the credentials it carries, for logs.
func Redacted(url string) string {
	parts := strings.Split(url, ",")
	for i, p := range parts {
		scheme, rest, ok := strings.Cut(p, "://")
		if !ok {
			continue
		}
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			parts[i] = scheme + "://***@" + rest[at+1:]
		}
	}
	return strings.Join(parts, ",")
}

// Connect dials the server and waits until it accepted us: a server that
// is down, refuses our credentials or our TLS is one error here, at
// start-up, never a silent fallback. Once connected the client reconnects
// forever (every 1 s, as the reference), logging disconnects and
// reconnects.
func Connect(ctx context.Context, cfg Config, log zerolog.Logger) (*nats.Conn, error) {
	url := ResolveURL(cfg.URL)
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.Timeout(5 * time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn().Err(err).Str("nats_server", Redacted(url)).Msg("nats disconnected")
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("nats_server", Redacted(nc.ConnectedUrlRedacted())).Msg("nats reconnected")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			ev := log.Warn().Err(err)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("nats async error")
		}),
	}
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nkey file %s: %w", ErrConnect, cfg.NKeyFile, err)
		}
		opts = append(opts, o)
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	type res struct {
		nc  *nats.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		nc, err := nats.Connect(url, opts...)
		ch <- res{nc, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrConnect, Redacted(url), r.err)
		}
		return r.nc, nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, fmt.Errorf("%w %s: %w", ErrConnect, Redacted(url), ctx.Err())
	}
}
