package engines

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// vllmAdapter runs `vllm serve MODEL [flags]`; the worker's engine
// arguments are what follows `vllm serve`.
type vllmAdapter struct{}

func (vllmAdapter) Name() string { return "vllm" }

// vllmValueFlags are the vLLM flags (and short aliases) the worker reads.
var vllmValueFlags = []string{
	"model", "host", "port", "block-size",
	"data-parallel-size", "dp", "data-parallel-rank", "dpn",
	"data-parallel-size-local", "dpl", "data-parallel-start-rank", "dpr",
	"tensor-parallel-size", "tp",
}

func (vllmAdapter) Prepare(opts Options, args []string) (Launch, error) {
	if len(args) > 0 && (args[0] == "serve" || args[0] == "vllm") {
		return Launch{}, fmt.Errorf("%w: the engine arguments start after `vllm serve`: drop the leading %q", ErrEngineArgs, args[0])
	}
	flags, err := parseEngineFlags(args, vllmValueFlags...)
	if err != nil {
		return Launch{}, err
	}
	var ep Endpoint
	var warnings []string

	// `vllm serve MODEL`: the model tag comes first; --model also works.
	switch {
	case len(args) > 0 && !strings.HasPrefix(args[0], "-"):
		ep.Model = args[0]
	case flags["model"] != "":
		ep.Model = flags["model"]
	default:
		return Launch{}, fmt.Errorf("%w: no model: give it first, as in `vllm serve MODEL`, or with --model", ErrEngineArgs)
	}
	// The first served name is the one the record carries; vLLM answers to
	// every alias after it too.
	served, ok, err := firstEngineFlag(args, "served-model-name")
	if err != nil {
		return Launch{}, err
	}
	if ok {
		ep.Model = served
	}
	if err := checkModel(ep.Model); err != nil {
		return Launch{}, err
	}
	// Without --host vLLM binds every interface. With --block-size vLLM may
	// still choose another (hybrid models); the worker reads the resolved
	// one from vllm:cache_config_info once it is up.
	var extra []string
	args, extra, err = resolveEndpoint(opts, args, flags, endpointFlags{
		host: "host", port: "port", blockSize: "block-size", defaultHost: "0.0.0.0", emptyHostIsDefault: true,
	}, &ep)
	if err != nil {
		return Launch{}, err
	}

	if hasEngineFlag(args, "headless") {
		return Launch{}, fmt.Errorf("%w: --headless runs no API server to register; run the worker on the node that serves the API", ErrEngineArgs)
	}
	dpSize, err := parseCount(flags, 1, "data-parallel-size", "dp")
	if err != nil {
		return Launch{}, err
	}
	spec := eventsSpec{style: vllmStyle, ranks: 1}
	ep.DPSize = dpSize
	if v, ok := lookup(flags, "data-parallel-rank", "dpn"); ok {
		// External load balancing: this engine is one rank with its own API
		// server, advertised as that rank.
		rank, err := strconv.Atoi(v)
		if err != nil || rank < 0 || rank >= dpSize {
			return Launch{}, fmt.Errorf("%w: --data-parallel-rank %q: want 0..%d (--data-parallel-size %d)", ErrEngineArgs, v, dpSize-1, dpSize)
		}
		if dpSize > 1 {
			ep.DPRank = &rank
		}
		// vLLM's publisher binds its configured port + the rank.
		spec.offset = rank
	} else if dpSize > 1 {
		// Internal load balancing: one API server for every rank; routers
		// pin a rank with X-Data-Parallel-Rank, and rank r publishes its
		// events on the base port + r.
		spec.ranks = dpSize
		local, err := parseCount(flags, dpSize, "data-parallel-size-local", "dpl")
		if err != nil {
			return Launch{}, err
		}
		if _, ok := lookup(flags, "data-parallel-start-rank", "dpr"); ok || local < dpSize ||
			hasEngineFlag(args, "data-parallel-hybrid-lb", "dph") {
			warnings = append(warnings, fmt.Sprintf(
				"data parallel across nodes (--data-parallel-size %d, %d local): registered as one worker with dp_size %d; the KV events of ranks on other nodes are advertised on this host and will not connect",
				dpSize, local, dpSize))
		}
	}

	args, evExtra, evWarn, err := pyEvents(opts, args, &ep, spec)
	if err != nil {
		return Launch{}, err
	}
	warnings = append(warnings, evWarn...)
	args, pdExtra, pdWarn, err := vllmDisagg(opts, args, &ep)
	if err != nil {
		return Launch{}, err
	}
	warnings = append(warnings, pdWarn...)

	bin := opts.Bin
	if bin == "" {
		bin = "vllm"
	}
	cmdArgs := make([]string, 0, 1+len(args)+len(extra)+len(evExtra)+len(pdExtra))
	cmdArgs = append(cmdArgs, "serve")
	cmdArgs = append(cmdArgs, appendArgs(args, concat(extra, evExtra, pdExtra)...)...)
	return Launch{
		Command:  Command{Name: "vllm", Path: bin, Args: cmdArgs, Env: pythonEnv(opts)},
		Endpoint: ep,
		Warnings: warnings,
	}, nil
}

func (vllmAdapter) Inspect(metrics io.Reader) (Stats, error) { return vllmStats(metrics) }

// portCheckHost is where a free port for the engine is looked for: its bind
// host, or every interface.
func portCheckHost(bind string) string {
	if isUnspecified(bind) {
		return "0.0.0.0"
	}
	return bind
}

func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
