package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/lifecycle"
	"github.com/infera/infera/router"
	"github.com/infera/infera/tracing"
)

// serveCommand is `infera serve`: the OpenAI front door of the fleet.
func serveCommand() *cli.Command {
	var cfg config.Serve
	return &cli.Command{
		Name:  "serve",
		Usage: "run the OpenAI-compatible router in front of the fleet registered in etcd",
		Description: "Serves POST /v1/chat/completions and /v1/completions, routed to the active workers that\n" +
			"serve the request's model, plus GET /v1/models, /v1/workers, /health, /ready and /metrics.\n" +
			"Without --etcd-endpoints it runs a single-node etcd in-process (--embedded-etcd-listen,\n" +
			"--embedded-etcd-dir) for workers to register with.\n\n" +
			"With --router-policy kv-aware each request goes to the worker that caches most of its prompt\n" +
			"(KV events from the engines; --tokenizer for exact token blocks), weighed against load;\n" +
			"GET /v1/admin/cache-view/{worker_id} shows what the router knows of a worker's cache.\n\n" +
			"With --kvd-socket, POST /v1/cache/prewarm {\"model\", \"block_hashes\": [16 hex digits, ...],\n" +
			"\"compat_key\" (default tp0of1_pp0of1), \"deadline_ms\" (default 1000)} asks kvd to bring those blocks from\n" +
			"its L3/L4 into RAM (a prefetch_hint); it answers 202 with the number of keys.\n\n" +
			"Example: infera serve --listen 127.0.0.1:8000 --router-policy kv-aware --tokenizer bytes",
		Flags: cfg.Flags(),
		Action: func(c *cli.Context) error {
			cfg.Finish(c)
			log := newLogger(cfg.Log, c.App.ErrWriter)
			policies, err := servePolicies(&cfg, log)
			if err != nil {
				return err
			}
			cfg.KnownPolicies = policies.Names()
			if err := cfg.Validate(); err != nil {
				return err
			}
			ctx, stop := signalContext(c.Context)
			defer stop()
			return runServe(ctx, cfg, policies, log)
		},
	}
}

var errEmbeddedEtcdFailed = errors.New("embedded etcd failed")

// servePolicies is the registry of `infera serve`: the built-ins and
// kv-aware, configured from cfg (its factory runs only when selected).
func servePolicies(cfg *config.Serve, log zerolog.Logger) (*router.Registry, error) {
	policies := router.NewRegistry()
	if err := router.RegisterBuiltins(policies); err != nil {
		return nil, fmt.Errorf("register routing policies: %w", err)
	}
	err := policies.Register(router.PolicyKVAware, func() (router.Policy, error) {
		return router.NewKVAware(router.ServeKVAwareConfig(cfg.KV), log)
	})
	if err != nil {
		return nil, fmt.Errorf("register routing policies: %w", err)
	}
	return policies, nil
}

// runServe runs the router until ctx ends. It starts, in order, the policy,
// the embedded etcd (without --etcd-endpoints), the etcd client, the fleet
// watcher and the HTTP servers, and stops them in reverse: the servers
// drain in-flight requests first, the policy closes last. A failed start
// unwinds what had started.
func runServe(ctx context.Context, cfg config.Serve, policies *router.Registry, log zerolog.Logger) error {
	var started lifecycle.Stack
	defer func() { _ = started.Stop() }()
	policy, err := policies.New(cfg.RouterPolicy)
	if err != nil {
		return err
	}
	if c, ok := policy.(io.Closer); ok {
		// Stopped last: after the router and the fleet watcher (which
		// attaches and detaches workers) have stopped.
		started.Push(c.Close)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// spawn runs fn until its own context ends, stopped in turn.
	spawn := func(fn func(context.Context)) {
		gctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			fn(gctx)
		}()
		started.Push(func() error { stop(); <-done; return nil })
	}

	tracer, err := tracing.New(ctx, tracing.Config{Endpoint: cfg.OTLPTracesEndpoint, SampleRatio: cfg.OTLPTracesSampleRatio})
	if err != nil {
		return fmt.Errorf("start tracing: %w", err)
	}
	if tracer != nil {
		// Stopped after the servers have drained: what they traced is
		// exported before serve returns.
		started.Push(func() error {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return tracer.Shutdown(sctx)
		})
		log.Info().Str("endpoint", cfg.OTLPTracesEndpoint).Float64("sample_ratio", cfg.OTLPTracesSampleRatio).Msg("exporting OpenTelemetry traces")
	}
	rcfg := router.ServeConfig(cfg)
	rcfg.Tracer = tracer
	if rcfg.NATSRequests, err = startNATSRequests(cfg, log, &started); err != nil {
		return err
	}
	rt, err := router.New(rcfg, policy, log)
	if err != nil {
		return fmt.Errorf("build router: %w", err)
	}
	if err := startScaleAPI(cfg, log, rt, &started); err != nil {
		return err
	}
	etcdCfg := cfg.Etcd
	if cfg.Kube.Backend == config.DiscoveryKubernetes {
		if err := startKubeWatcher(cfg, log, rt, spawn, cancel, &started); err != nil {
			return err
		}
	} else {
		if len(etcdCfg.Endpoints) == 0 {
			emb, err := discovery.StartEmbedded(discovery.EmbeddedConfig{
				ClientListen: cfg.EmbeddedEtcdListen,
				Dir:          cfg.EmbeddedEtcdDir,
			}, log)
			if err != nil {
				return fmt.Errorf("start embedded etcd: %w", err)
			}
			started.Push(func() error { emb.Close(); return nil })
			etcdCfg.Endpoints = emb.Endpoints()
			log.Info().Strs("endpoints", etcdCfg.Endpoints).Str("dir", cfg.EmbeddedEtcdDir).Msg("embedded etcd started")
			spawn(func(ctx context.Context) {
				select {
				case err := <-emb.Err():
					log.Error().Err(err).Msg("embedded etcd failed")
					cancel(fmt.Errorf("%w: %w", errEmbeddedEtcdFailed, err))
				case <-ctx.Done():
				}
			})
		}

		cli, err := discovery.NewClient(etcdCfg, log)
		if err != nil {
			return fmt.Errorf("connect to etcd: %w", err)
		}
		started.Push(cli.Close)

		watcher := discovery.NewWatcher(cli, etcdCfg.Prefix, log, fleetUpdater(cfg, rt, log))
		watcher.SetOutageGrace(cfg.OutageGrace)
		spawn(func(ctx context.Context) {
			if err := watcher.Run(ctx); err != nil {
				cancel(fmt.Errorf("fleet watcher: %w", err))
			}
		})
		if cfg.KV.PeerHints {
			// The kvd registry names each worker's host's kvd.
			kvds := discovery.NewKVDWatcher(cli, cfg.KV.KVDPrefix, log, rt.UpdateKVDs)
			spawn(func(ctx context.Context) {
				if err := kvds.Run(ctx); err != nil {
					cancel(fmt.Errorf("kvd registry watcher: %w", err))
				}
			})
		}
	}

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	var adminLn net.Listener
	if cfg.AdminListen != "" {
		adminLn, err = lc.Listen(ctx, "tcp", cfg.AdminListen)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("listen on admin address %s: %w", cfg.AdminListen, err)
		}
		log.Info().Str("addr", adminLn.Addr().String()).Bool("admin_token", cfg.AdminToken != "").Msg("infera serve admin listening")
	}
	log.Info().Str("addr", ln.Addr().String()).Str("policy", policy.Name()).
		Strs("etcd_endpoints", etcdCfg.Endpoints).Int("api_keys", len(cfg.Keys())).Str("front_door", cfg.FrontDoor).Msg("infera serve listening")

	serve := rt.ServeAll
	if cfg.FrontDoor == "loop" {
		serve = rt.ServeLoop
	}
	serveErr := serve(ctx, ln, adminLn)
	_ = started.Stop()
	if serveErr != nil {
		return serveErr
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	log.Info().Msg("infera serve stopped")
	return nil
}
