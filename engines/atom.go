package engines

import (
	"fmt"
	"io"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// atomAdapter runs ATOM's OpenAI server, `<python> -m
// atom.entrypoints.openai_server [flags]`. ATOM serves HTTP on
// --server-port; its --port is an internal torch-distributed port.
type atomAdapter struct{}

func (atomAdapter) Name() string { return "atom" }

const (
	atomModule           = "atom.entrypoints.openai_server"
	atomDefaultHost      = "0.0.0.0"
	atomDefaultBlockSize = 16
)

var atomValueFlags = []string{
	"model", "served-model-name", "host", "server-port", "port", "block-size",
	"tensor-parallel-size", "tp",
}

func (atomAdapter) Prepare(opts Options, args []string) (Launch, error) {
	flags, err := moduleFlags(args, atomModule, atomValueFlags...)
	if err != nil {
		return Launch{}, err
	}
	ep := Endpoint{Host: atomDefaultHost, BlockSize: atomDefaultBlockSize, DPSize: 1}
	var warnings []string

	// ATOM answers to its --model as the model name; required here because
	// its built-in default model is not something to advertise by accident.
	if ep.Model, err = requiredModel(flags, "model"); err != nil {
		return Launch{}, err
	}
	var extra []string
	args, extra, err = resolveEndpoint(opts, args, flags, endpointFlags{
		host: "host", port: "server-port", blockSize: "block-size", defaultHost: atomDefaultHost,
	}, &ep)
	if err != nil {
		return Launch{}, err
	}
	// Two ATOM engines on one host (a prefill and a decode) must not share
	// the internal port, whose default is fixed.
	internalValue, internalGiven := flags["port"]
	_, args, internalExtra, err := resolvePort(opts, args, "port", internalValue, internalGiven, "0.0.0.0")
	if err != nil {
		return Launch{}, err
	}
	extra = append(extra, internalExtra...)
	tp, err := parseCount(flags, 1, "tensor-parallel-size", "tp")
	if err != nil {
		return Launch{}, err
	}

	// ATOM has no KV-event publisher of its own; an ATOM that takes vLLM's
	// --kv-events-config (given by the operator) is advertised like vLLM.
	// Nothing is added: an unknown flag would stop ATOM from starting.
	var evExtra []string
	if cfg, err := parseJSONArg(args, "kv-events-config"); err != nil {
		return Launch{}, err
	} else if cfg.Present {
		var evWarn []string
		if args, evExtra, evWarn, err = pyEvents(opts, args, &ep, eventsSpec{style: vllmStyle, ranks: 1}); err != nil {
			return Launch{}, err
		}
		warnings = append(warnings, evWarn...)
	}
	pdWarn, err := atomDisagg(args, &ep, tp)
	if err != nil {
		return Launch{}, err
	}
	warnings = append(warnings, pdWarn...)

	cmd := pythonCommand(opts, "atom", atomModule, appendArgs(args, concat(extra, evExtra)...))
	return Launch{Command: cmd, Endpoint: ep, Warnings: warnings}, nil
}

// Inspect reads ATOM's atom:requests_running/atom:requests_waiting, or the
// vLLM names where an ATOM build (or the simulator's facade) serves those.
func (atomAdapter) Inspect(metrics io.Reader) (Stats, error) {
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(metrics)
	if err != nil {
		return Stats{}, fmt.Errorf("%w: parse: %w", ErrMetrics, err)
	}
	running, okR := sumFamily(families["atom:requests_running"])
	waiting, okW := sumFamily(families["atom:requests_waiting"])
	if okR && okW {
		return Stats{Running: running, Waiting: waiting, BlockSize: cacheConfigLabel(families["atom:cache_config_info"], "block_size"),
			KVBlocks: kvCapacity(float64(cacheConfigLabel(families["atom:cache_config_info"], "num_gpu_blocks")))}, nil
	}
	return vllmFamilies(families)
}

// vllmStats reads the vLLM metric names (the simulator exports the same).
func vllmStats(r io.Reader) (Stats, error) {
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return Stats{}, fmt.Errorf("%w: parse: %w", ErrMetrics, err)
	}
	return vllmFamilies(families)
}

func vllmFamilies(families map[string]*dto.MetricFamily) (Stats, error) {
	running, okR := sumFamily(families["vllm:num_requests_running"])
	waiting, okW := sumFamily(families["vllm:num_requests_waiting"])
	if !okR || !okW {
		// Missing gauges must not read as "idle": that would cut a drain short.
		return Stats{}, fmt.Errorf("%w: vllm:num_requests_running or vllm:num_requests_waiting missing", ErrMetrics)
	}
	return Stats{Running: running, Waiting: waiting, BlockSize: cacheConfigLabel(families["vllm:cache_config_info"], "block_size"),
		KVBlocks: kvCapacity(float64(cacheConfigLabel(families["vllm:cache_config_info"], "num_gpu_blocks")))}, nil
}

// cacheConfigLabel reads an integer label (block_size, num_gpu_blocks) of
// a cache_config_info gauge; 0 when absent or not a positive integer.
func cacheConfigLabel(f *dto.MetricFamily, name string) int {
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() != name {
				continue
			}
			if n, err := strconv.Atoi(l.GetValue()); err == nil && n > 0 {
				return n
			}
		}
	}
	return 0
}
