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
			"The engine arguments are the engine's own command line without its program: what follows\n" +
			"`vllm serve`, `python -m sglang.launch_server` or `python -m atom.entrypoints.openai_server`.\n" +
			"They are forwarded verbatim; the worker only adds a free --port (ATOM: --server-port and its\n" +
			"internal --port) when none is given, a KV-event publisher on free ports (--kv-events-config\n" +
			"for vLLM and SGLang, --kv-events-endpoint for the sim; not with --no-kv-events), SGLang's\n" +
			"--enable-metrics and, for a vLLM prefill/decode engine without one, a kv-transfer engine_id.\n" +
			"It advertises the served model, block size, data-parallel layout and disaggregation role\n" +
			"it reads from them.\n\n" +
			"A prefill or decode worker first checks the node (--sysfs-root): it refuses to start when\n" +
			"there is no active RDMA port or the advertised host is loopback or link-local, since KV would\n" +
			"then move over TCP, unless --disaggregation-allow-tcp. --preflight prints those findings\n" +
			"(GPUs, RDMA devices, ports, GIDs, advertise host, verdict; --json for JSON) and exits,\n" +
			"non-zero on a blocking finding; without --engine it judges the node alone.\n\n" +
			"Examples:\n" +
			"  infera worker --engine sim -- --model demo --block-size 16\n" +
			"  infera worker --engine vllm -- Qwen/Qwen3-8B --tensor-parallel-size 8 --port 8000\n" +
			"  infera worker --engine sglang -- --model-path deepseek-ai/DeepSeek-V3 --tp 8 --dp 8 --enable-dp-attention\n" +
			"  infera worker --engine atom -- --model deepseek-ai/DeepSeek-R1 -tp 8 --server-port 8000\n" +
			"  infera worker --preflight --json",
		Flags: cfg.Flags(),
		Action: func(c *cli.Context) error {
			cfg.Finish(c)
			if err := cfg.Validate(); err != nil {
				return err
			}
			if cfg.Preflight {
				return engines.Preflight(cfg, c.App.Writer)
			}
			log := newLogger(cfg.Log, c.App.ErrWriter)
			ctx, stop := signalContext(c.Context)
			defer stop()
			return engines.Run(ctx, cfg, log)
		},
	}
}
