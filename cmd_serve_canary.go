package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

// canaryFilter returns the fleet callback that drops workers failing the
// tokenizer canary check (--tokenizer-canary-check) before the router sees
// them, and exports the rejections as infera_canary_rejections_total (the
// reference's canary_rejections).
func canaryFilter(rt *router.Router, log zerolog.Logger) func(*discovery.Snapshot) {
	check := discovery.NewCanaryCheck(func(rec *discovery.Record, first string) {
		log.Error().Str("worker_id", rec.WorkerID).Str("model", rec.ModelName).Str("first_worker_id", first).
			Msg("rejecting worker: its tokenizer canary differs from the first worker's of its model; align the tokenizers of every worker serving the model")
	})
	rt.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "infera_canary_rejections_total",
		Help: "Worker records rejected because their tokenizer canary differs from the first worker's of their model (--tokenizer-canary-check).",
	}, func() float64 { return float64(check.Rejections()) }))
	return func(s *discovery.Snapshot) { rt.UpdateFleet(check.Filter(s)) }
}

// fleetUpdater is what every discovery backend calls with a new fleet:
// the router's update, behind the canary check unless it is turned off.
func fleetUpdater(cfg config.Serve, rt *router.Router, log zerolog.Logger) func(*discovery.Snapshot) {
	if cfg.TokenizerCanaryCheck {
		return canaryFilter(rt, log)
	}
	return rt.UpdateFleet
}
