package main

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/lifecycle"
	"github.com/infera/infera/natsreq"
	"github.com/infera/infera/natsx"
)

// natsStartTimeout bounds connecting to NATS at start-up.
const natsStartTimeout = 15 * time.Second

// startNATSRequests connects the router's side of requests over NATS
// (--request-transport nats): a server that is down or refuses us is a
// start-up error. nil without --request-transport nats. The client and its
// connection are stopped by started, after the router.
func startNATSRequests(cfg config.Serve, log zerolog.Logger, started *lifecycle.Stack) (*natsreq.Client, error) {
	if cfg.Requests.Transport != config.RequestTransportNATS {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), natsStartTimeout)
	defer cancel()
	n := cfg.KV.NATS
	nc, err := natsx.Connect(ctx, natsx.Config{URL: n.URL, CredsFile: n.CredsFile, NKeyFile: n.NKeyFile, CAFile: n.CAFile, Name: "infera-serve-requests"}, log)
	if err != nil {
		return nil, fmt.Errorf("requests over nats: %w", err)
	}
	r := cfg.Requests
	c, err := natsreq.NewClient(ctx, natsreq.ClientConfig{IdleTimeout: r.IdleTimeout, MaxDuration: r.MaxDuration, MaxPending: r.MaxPending}, nc, log)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("requests over nats: %w", err)
	}
	started.Push(func() error { c.Close(); nc.Close(); return nil })
	log.Info().Str("nats_server", natsx.Redacted(natsx.ResolveURL(n.URL))).Int("max_pending", r.MaxPending).
		Float64("idle_timeout_s", r.IdleTimeout.Seconds()).Float64("max_duration_s", r.MaxDuration.Seconds()).Msg("requests over nats")
	return c, nil
}
