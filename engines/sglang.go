package engines

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// sglangAdapter runs `<python> -m sglang.launch_server [flags]`; the
// worker's engine arguments are what follows `-m sglang.launch_server`.
type sglangAdapter struct{}

func (sglangAdapter) Name() string { return "sglang" }

const (
	sglangModule      = "sglang.launch_server"
	sglangDefaultHost = "127.0.0.1"
	// maxServerInfoBytes bounds /get_server_info, which lists every
	// server argument.
	maxServerInfoBytes = 4 << 20
)

var sglangValueFlags = []string{
	"model-path", "model", "served-model-name", "host", "port", "page-size",
	"tp-size", "tp", "dp-size", "dp",
	"disaggregation-mode", "disaggregation-bootstrap-port", "disaggregation-transfer-backend",
}

func (sglangAdapter) Prepare(opts Options, args []string) (Launch, error) {
	flags, err := moduleFlags(args, sglangModule, sglangValueFlags...)
	if err != nil {
		return Launch{}, err
	}
	var ep Endpoint
	var warnings []string

	if ep.Model, err = requiredModel(flags, "model-path", "model"); err != nil {
		return Launch{}, err
	}
	// Without --page-size SGLang picks one per attention backend; the
	// worker asks /get_server_info once it is up.
	var extra []string
	args, extra, err = resolveEndpoint(opts, args, flags, endpointFlags{
		host: "host", port: "port", blockSize: "page-size", defaultHost: sglangDefaultHost,
	}, &ep)
	if err != nil {
		return Launch{}, err
	}

	dp, err := parseCount(flags, 1, "dp-size", "dp")
	if err != nil {
		return Launch{}, err
	}
	// One server multiplexes every DP rank; routers pin one with
	// X-Data-Parallel-Rank.
	ep.DPSize = dp
	spec := eventsSpec{style: sglangStyle, ranks: 1}
	noEvents := false
	if dp > 1 {
		if hasEngineFlag(args, "enable-dp-attention") {
			// Each attention-DP rank has its own KV cache and publishes on
			// the base port + its rank.
			spec.ranks = dp
		} else {
			// Without DP attention every replica counts itself rank 0 and
			// would bind the same port.
			noEvents = true
			if !opts.NoKVEvents {
				warnings = append(warnings, fmt.Sprintf("--dp-size %d without --enable-dp-attention: SGLang's replicas cannot publish KV events on distinct ports, none configured; routing to this worker is approximate", dp))
			}
		}
	}
	var evExtra []string
	if !noEvents {
		var evWarn []string
		if args, evExtra, evWarn, err = pyEvents(opts, args, &ep, spec); err != nil {
			return Launch{}, err
		}
		warnings = append(warnings, evWarn...)
	}
	if err := sglangDisagg(flags, &ep); err != nil {
		return Launch{}, err
	}
	// Drain reads /metrics, which SGLang serves only with --enable-metrics.
	if !hasEngineFlag(args, "enable-metrics") {
		extra = append(extra, "--enable-metrics")
	}

	cmd := pythonCommand(opts, "sglang", sglangModule, appendArgs(args, concat(extra, evExtra)...))
	return Launch{Command: cmd, Endpoint: ep, Warnings: warnings}, nil
}

func (sglangAdapter) Inspect(metrics io.Reader) (Stats, error) {
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(metrics)
	if err != nil {
		return Stats{}, fmt.Errorf("%w: parse: %w", ErrMetrics, err)
	}
	running, okR := sumFamily(families["sglang:num_running_reqs"])
	waiting, okW := sumFamily(families["sglang:num_queue_reqs"])
	if !okR || !okW {
		return Stats{}, fmt.Errorf("%w: sglang:num_running_reqs or sglang:num_queue_reqs missing", ErrMetrics)
	}
	// A disaggregated engine also holds requests in its transfer queues;
	// they are in flight as much as the running ones.
	for _, name := range []string{
		"sglang:num_prefill_prealloc_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
		"sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
	} {
		if n, ok := sumFamily(families[name]); ok {
			waiting += n
		}
	}
	return Stats{Running: running, Waiting: waiting}, nil
}

func (sglangAdapter) blockSizePath() string { return "/get_server_info" }

// parseBlockSize reads page_size from /get_server_info, which carries the
// resolved server arguments at its top level or, in some versions, under
// "server_args", and the cache size from max_total_num_tokens (the
// scheduler's token pool, per data-parallel rank), in whole pages. A pool
// size that is absent, not a number or out of range (kvCapacity) leaves the
// capacity unknown (0) and the page size standing: the router then learns the capacity from the
// engine's removal events.
func (sglangAdapter) parseBlockSize(body io.Reader) (size, blocks int, err error) {
	var info struct {
		PageSize          *int            `json:"page_size"`
		MaxTotalNumTokens json.RawMessage `json:"max_total_num_tokens"`
		ServerArgs        *struct {
			PageSize *int `json:"page_size"`
		} `json:"server_args"`
	}
	if err := json.NewDecoder(io.LimitReader(body, maxServerInfoBytes)).Decode(&info); err != nil {
		return 0, 0, fmt.Errorf("%w: /get_server_info: %w", ErrMetrics, err)
	}
	page := info.PageSize
	if page == nil && info.ServerArgs != nil {
		page = info.ServerArgs.PageSize
	}
	if page == nil || *page < 1 {
		return 0, 0, fmt.Errorf("%w: /get_server_info carries no page_size", ErrMetrics)
	}
	var pool float64
	if json.Unmarshal(info.MaxTotalNumTokens, &pool) == nil {
		blocks = kvCapacity(pool / float64(*page))
	}
	return *page, blocks, nil
}

// moduleFlags reads a Python engine's value flags (see parseEngineFlags)
// after refusing a command line that repeats `-m module`.
func moduleFlags(args []string, module string, names ...string) (map[string]string, error) {
	if err := refuseModuleArgs(args, module); err != nil {
		return nil, err
	}
	return parseEngineFlags(args, names...)
}

// refuseModuleArgs catches engine arguments that repeat the launcher
// (`-m sglang.launch_server`), which the worker adds itself.
func refuseModuleArgs(args []string, module string) error {
	if len(args) > 0 && (args[0] == "-m" || args[0] == module || strings.HasPrefix(args[0], "python")) {
		return fmt.Errorf("%w: the engine arguments start after `python -m %s`: drop the leading %q", ErrEngineArgs, module, args[0])
	}
	return nil
}

// pythonCommand is `<python> -m module args...`, or `<engine-bin> args...`
// when --engine-bin names a launcher of its own.
func pythonCommand(opts Options, name, module string, args []string) Command {
	if opts.Bin != "" {
		return Command{Name: name, Path: opts.Bin, Args: args, Env: pythonEnv(opts)}
	}
	return Command{Name: name, Path: opts.python(), Args: append([]string{"-m", module}, args...), Env: pythonEnv(opts)}
}

// sumFamily adds the values of every sample of a gauge, counter or untyped
// family; ok is false when the family is absent or of another type.
func sumFamily(f *dto.MetricFamily) (sum float64, ok bool) {
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		switch f.GetType() {
		case dto.MetricType_GAUGE:
			sum += m.GetGauge().GetValue()
		case dto.MetricType_COUNTER:
			sum += m.GetCounter().GetValue()
		case dto.MetricType_UNTYPED:
			sum += m.GetUntyped().GetValue()
		default:
			return 0, false
		}
	}
	return sum, true
}
