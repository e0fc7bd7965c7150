package main

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery/kube"
	"github.com/infera/infera/lifecycle"
	"github.com/infera/infera/router"
)

// startKubeWatcher feeds the router from the worker Pods' annotations
// (--discovery-backend kubernetes) instead of etcd.
func startKubeWatcher(cfg config.Serve, log zerolog.Logger, rt *router.Router,
	spawn func(func(context.Context)), cancel context.CancelCauseFunc, started *lifecycle.Stack) error {
	kc, err := kube.LoadConfig(cfg.Kube.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes credentials: %w", err)
	}
	cli, err := kube.NewClient(kc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	started.Push(func() error { cli.Close(); return nil })
	ns := kube.Namespace(cfg.Kube.Namespace, kc)
	w := kube.NewWatcher(cli, ns, cfg.Kube.Selector, log, fleetUpdater(cfg, rt, log))
	log.Info().Str("api_server", kc.Server).Str("namespace", ns).Str("label_selector", cfg.Kube.Selector).Msg("watching worker Pods")
	spawn(func(ctx context.Context) {
		if err := w.Run(ctx); err != nil {
			cancel(fmt.Errorf("pod watcher: %w", err))
		}
	})
	return nil
}
