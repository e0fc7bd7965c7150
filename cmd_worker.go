package main

import (
	"github.com/urfave/cli/v2"

	"github.com/infera/infera/config"
	"github.com/infera/infera/engines"
)

// workerCommand is `infera worker --engine E [flags] -- [engine args]`.
func workerCommand() *cli.Command {
	var cfg config.Worker
	return &cli.Command{
		Name:      "worker",
		Usage:     "launch one engine, register it in etcd, drain and deregister it on shutdown",
		ArgsUsage: "-- [engine args]",
		Description: "Starts the engine with the arguments after --, waits until it is healthy and registers it\n" +
			"in etcd under a lease. SIGTERM or SIGINT marks it draining, waits for in-flight requests\n" +
			"(up to --drain-timeout), deregisters and stops it. If the engine exits on its own the\n" +
			"record is revoked at once and the worker exits non-zero.\n\n" +
			"Example: infera worker --engine sim -- --model demo --block-size 16",
		Flags: cfg.Flags(),
		Action: func(c *cli.Context) error {
			cfg.Finish(c)
			if err := cfg.Validate(); err != nil {
				return err
			}
			log := newLogger(cfg.Log, c.App.ErrWriter)
			ctx, stop := signalContext(c.Context)
			defer stop()
			return engines.Run(ctx, cfg, log)
		},
	}
}
