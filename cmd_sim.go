package main

import (
	"github.com/urfave/cli/v2"

	"github.com/infera/infera/config"
	"github.com/infera/infera/sim"
)

// simCommand is `infera sim`: a GPU-free engine with vLLM's HTTP API.
func simCommand() *cli.Command {
	var cfg config.Sim
	return &cli.Command{
		Name:  "sim",
		Usage: "run a simulated vLLM-compatible engine (no GPU): prefix cache, batching timing model, fault injection",
		Description: "Serves /v1/chat/completions, /v1/completions, /v1/models, /tokenize, /health, /metrics and\n" +
			"/reset_prefix_cache with vLLM's shapes and metric names. Tokens are bytes; the text is\n" +
			"deterministic for --seed and the prompt. Step time = (--step-overhead-ms + uncached prefill\n" +
			"tokens / --prefill-tokens-per-s + decoding sequences × --decode-ms-per-token) × --time-scale;\n" +
			"--time-scale 0 never sleeps (zero-latency baseline for router benchmarks).\n\n" +
			"Example: infera sim --port 0 --model demo --time-scale 0.1",
		Flags: cfg.Flags(),
		Action: func(c *cli.Context) error {
			cfg.Finish(c)
			if err := cfg.Validate(); err != nil {
				return err
			}
			log := newLogger(cfg.Log, c.App.ErrWriter).With().Str("component", "sim").Logger()
			ctx, stop := signalContext(c.Context)
			defer stop()
			srv, err := sim.New(cfg, log)
			if err != nil {
				return err
			}
			return srv.Run(ctx)
		},
	}
}
