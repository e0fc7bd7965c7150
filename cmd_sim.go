package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/infera/infera/config"
	"github.com/infera/infera/sim"
)

// simCommand is `infera sim`: a GPU-free engine with vLLM's HTTP API, or,
// with --flavor, a stand-in for vLLM, SGLang or ATOM that takes the engine's
// own command line.
func simCommand() *cli.Command {
	var cfg config.Sim
	flags := cfg.Flags()
	return &cli.Command{
		Name:      "sim",
		Usage:     "run a simulated vLLM-compatible engine (no GPU): prefix cache, KV events, batching timing model, fault injection",
		ArgsUsage: "[--flavor vllm|sglang|atom ENGINE ARGS...]",
		Description: "Serves /v1/chat/completions, /v1/completions, /v1/models, /tokenize, /health, /metrics and\n" +
			"/reset_prefix_cache with vLLM's shapes and metric names. Tokens are bytes, or a Hugging Face\n" +
			"tokenizer's (--tokenizer DIR); the text is deterministic for --seed and the prompt. Step time =\n" +
			"(--step-overhead-ms + uncached prefill tokens / --prefill-tokens-per-s + decoding sequences ×\n" +
			"--decode-ms-per-token) × --time-scale; --time-scale 0 never sleeps (zero-latency baseline).\n" +
			"--kv-events-endpoint publishes the prefix cache's KV events over ZMQ in vLLM or SGLang encoding,\n" +
			"with a replay socket (--kv-events-replay-endpoint). --model-ttft-log FILE writes each request's\n" +
			"modelled TTFT (the step model's, independent of the box's load) as a JSON line at its first token.\n\n" +
			"--flavor must be the last sim flag: what follows is an engine command line, flags it does not\n" +
			"model are accepted and ignored, and its --kv-events-config drives the publisher:\n" +
			"  infera sim --flavor vllm serve MODEL --port 8000 --block-size 16 --kv-events-config '{...}'\n" +
			"  infera sim --flavor sglang --model-path MODEL --port 30000 --page-size 16\n" +
			"  infera sim --flavor atom --model MODEL --server-port 8000\n\n" +
			"Example: infera sim --port 0 --model demo --time-scale 0.1",
		Flags: flags,
		// The engine arguments after --flavor are not ours to parse, so the
		// command line is split and parsed in parseSimArgs.
		SkipFlagParsing: true,
		Action: func(c *cli.Context) error {
			ignored, err := parseSimArgs(&cfg, flags, c.Args().Slice())
			if errors.Is(err, flag.ErrHelp) {
				// The help of a command is printed from its parent's context.
				parent := c
				if l := c.Lineage(); len(l) > 1 {
					parent = l[1]
				}
				return cli.ShowCommandHelp(parent, "sim")
			}
			if err != nil {
				return err
			}
			cfg.Finish(c)
			if err := cfg.Validate(); err != nil {
				return err
			}
			log := newLogger(cfg.Log, c.App.ErrWriter).With().Str("component", "sim").Logger()
			if len(ignored) > 0 {
				log.Info().Str("flavor", cfg.Flavor).Strs("ignored", ignored).Msg("engine flags accepted but not simulated")
			}
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

// parseSimArgs parses the sim's own flags into cfg (their INFERA_*
// environment variables included) up to --flavor, and applies the engine
// command line after it. It returns the engine flags accepted but not
// simulated; flag.ErrHelp asks for the help text. Usage errors wrap
// config.ErrInvalid.
func parseSimArgs(cfg *config.Sim, flags []cli.Flag, args []string) ([]string, error) {
	head, tail, facade := splitFlavor(args)
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, f := range flags {
		if err := f.Apply(fs); err != nil {
			return nil, fmt.Errorf("%w: %w", config.ErrInvalid, err)
		}
	}
	if err := fs.Parse(head); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", config.ErrInvalid, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: unexpected argument %q (engine arguments follow --flavor)", config.ErrInvalid, fs.Arg(0))
	}
	if !facade {
		if cfg.Flavor != "" {
			// From INFERA_FLAVOR: a facade without its engine command line
			// would run with neither the engine's defaults nor the sim's.
			return nil, fmt.Errorf("%w: a flavor must be given as --flavor, followed by the engine's arguments", config.ErrInvalid)
		}
		return nil, nil
	}
	if cfg.Flavor == "" {
		return nil, fmt.Errorf("%w: --flavor needs vllm, sglang or atom", config.ErrInvalid)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	explicit := func(name string) bool {
		return set[name] || os.Getenv(config.EnvName(name)) != ""
	}
	ignored, err := sim.ApplyFacade(cfg, tail, explicit)
	if err != nil {
		return ignored, fmt.Errorf("%w: --flavor %s: %w", config.ErrInvalid, cfg.Flavor, err)
	}
	return ignored, nil
}

// splitFlavor splits args after the first --flavor flag and its value: head
// is the sim's flags (--flavor included), tail the engine's command line.
// facade is false without --flavor.
func splitFlavor(args []string) (head, tail []string, facade bool) {
	for i, a := range args {
		if a == "--" {
			break
		}
		switch {
		case a == "--flavor" || a == "-flavor":
			if i+1 >= len(args) {
				return args, nil, false // flag parsing reports the missing value
			}
			return args[:i+2], args[i+2:], true
		case strings.HasPrefix(a, "--flavor=") || strings.HasPrefix(a, "-flavor="):
			return args[:i+1], args[i+1:], true
		}
	}
	return args, nil, false
}
