package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

// serveCommand is `infera serve`: the OpenAI front door of the fleet.
func serveCommand() *cli.Command {
	var cfg config.Serve
	return &cli.Command{
		Name:  "serve",
		Usage: "run the OpenAI-compatible router in front of the fleet registered in etcd",
		Description: "Serves POST /v1/chat/completions and /v1/completions, routed to the active workers that\n" +
			"serve the request's model, plus GET /v1/models, /v1/workers, /health and /metrics.\n" +
			"Without --etcd-endpoints it runs a single-node etcd in-process (--embedded-etcd-listen,\n" +
			"--embedded-etcd-dir) for workers to register with.\n\n" +
			"Example: infera serve --listen 127.0.0.1:8000 --router-policy least-load",
		Flags: cfg.Flags(),
		Action: func(c *cli.Context) error {
			cfg.Finish(c)
			policies := router.NewRegistry()
			if err := router.RegisterBuiltins(policies); err != nil {
				return fmt.Errorf("register routing policies: %w", err)
			}
			cfg.KnownPolicies = policies.Names()
			if err := cfg.Validate(); err != nil {
				return err
			}
			log := newLogger(cfg.Log, c.App.ErrWriter)
			ctx, stop := signalContext(c.Context)
			defer stop()
			return runServe(ctx, cfg, policies, log)
		},
	}
}

var errEmbeddedEtcdFailed = errors.New("embedded etcd failed")

// runServe runs the router until ctx ends, then stops, in order, the HTTP
// server (draining in-flight requests), the fleet watcher, the etcd client
// and the embedded etcd it started.
func runServe(ctx context.Context, cfg config.Serve, policies *router.Registry, log zerolog.Logger) error {
	policy, err := policies.New(cfg.RouterPolicy)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// stop ends the goroutines started here; it is deferred after each
	// resource they use, so that it runs before that resource is closed.
	var wg sync.WaitGroup
	stop := func() { cancel(nil); wg.Wait() }

	etcdCfg := cfg.Etcd
	if len(etcdCfg.Endpoints) == 0 {
		emb, err := discovery.StartEmbedded(discovery.EmbeddedConfig{
			ClientListen: cfg.EmbeddedEtcdListen,
			Dir:          cfg.EmbeddedEtcdDir,
		}, log)
		if err != nil {
			return fmt.Errorf("start embedded etcd: %w", err)
		}
		defer emb.Close()
		etcdCfg.Endpoints = emb.Endpoints()
		log.Info().Strs("endpoints", etcdCfg.Endpoints).Str("dir", cfg.EmbeddedEtcdDir).Msg("embedded etcd started")
		wg.Go(func() {
			select {
			case err := <-emb.Err():
				log.Error().Err(err).Msg("embedded etcd failed")
				cancel(fmt.Errorf("%w: %w", errEmbeddedEtcdFailed, err))
			case <-ctx.Done():
			}
		})
		defer stop()
	}

	cli, err := discovery.NewClient(etcdCfg, log)
	if err != nil {
		return fmt.Errorf("connect to etcd: %w", err)
	}
	defer func() { _ = cli.Close() }()

	rt, err := router.New(router.Config{
		MaxBodyBytes:      cfg.MaxBodyBytes,
		ClientReadTimeout: cfg.ClientReadTimeout,
		ClientIdleTimeout: cfg.ClientIdleTimeout,
		ConnectTimeout:    cfg.UpstreamConnectTimeout,
		UpstreamTimeout:   cfg.UpstreamTimeout,
		IdleConnTimeout:   cfg.UpstreamIdleConnTimeout,
		MaxConnsPerWorker: cfg.MaxConnsPerWorker,
		ShutdownTimeout:   cfg.ShutdownTimeout,
	}, policy, log)
	if err != nil {
		return fmt.Errorf("build router: %w", err)
	}
	watcher := discovery.NewWatcher(cli, etcdCfg.Prefix, log, rt.UpdateFleet)
	wg.Go(func() {
		if err := watcher.Run(ctx); err != nil {
			cancel(fmt.Errorf("fleet watcher: %w", err))
		}
	})
	defer stop()

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	log.Info().Str("addr", ln.Addr().String()).Str("policy", policy.Name()).
		Strs("etcd_endpoints", etcdCfg.Endpoints).Msg("infera serve listening")

	serveErr := rt.Serve(ctx, ln)
	stop()
	if serveErr != nil {
		return serveErr
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	log.Info().Msg("infera serve stopped")
	return nil
}
