package main

import (
	"context"
	"fmt"
	"os"

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

// startScaleAPI enables GET/POST /v1/admin/scale (--enable-scaling-api):
// the InferaDeployment of this server's Pod (POD_NAME) in its namespace,
// over the in-cluster credentials or --kubeconfig, whichever discovery
// backend feeds the fleet. The deployment is resolved at the first request,
// as the reference does, so a missing label or permission is an answer of
// the API, not a failed start.
func startScaleAPI(cfg config.Serve, log zerolog.Logger, rt *router.Router, started *lifecycle.Stack) error {
	if !cfg.Kube.EnableScaling {
		return nil
	}
	kc, err := kube.LoadConfig(cfg.Kube.Kubeconfig)
	if err != nil {
		return fmt.Errorf("scaling api: kubernetes credentials: %w", err)
	}
	cli, err := kube.NewClient(kc)
	if err != nil {
		return fmt.Errorf("scaling api: kubernetes client: %w", err)
	}
	started.Push(func() error { cli.Close(); return nil })
	ns := kube.Namespace(cfg.Kube.Namespace, kc)
	rt.SetScaleAPI(kube.NewScaler(cli, ns, os.Getenv("POD_NAME"), log))
	log.Info().Str("namespace", ns).Msg("scaling API enabled: GET/POST /v1/admin/scale resizes this deployment's pools (needs RBAC to patch inferadeployments)")
	return nil
}
