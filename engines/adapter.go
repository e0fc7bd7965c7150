package engines

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Errors of the adapters.
var (
	// ErrUnknownEngine is returned by Lookup for an engine without an adapter.
	ErrUnknownEngine = errors.New("unknown engine")
	// ErrEngineArgs is wrapped when the engine's own arguments cannot be used.
	ErrEngineArgs = errors.New("invalid engine arguments")
	// ErrMetrics is wrapped when an engine's /metrics cannot be read.
	ErrMetrics = errors.New("engine metrics")
)

// Adapter knows one engine: how to launch it from the worker's settings and
// the engine's own command line, what endpoint to advertise for it, and how
// to read its load from its Prometheus metrics. Adapters are stateless.
type Adapter interface {
	// Name is the --engine value and the record's "engine" field.
	Name() string
	// Prepare parses the engine arguments (what follows the program name on
	// the engine's own command line), adds what the worker must (a free
	// port when none is given) and returns the launch with its endpoint.
	Prepare(opts Options, args []string) (Launch, error)
	// Inspect reads one Prometheus text exposition of the engine's /metrics.
	Inspect(metrics io.Reader) (Stats, error)
}

// Options are the worker settings an adapter may use when preparing a launch.
type Options struct {
	// Bin overrides the engine executable (--engine-bin); empty means the
	// adapter's default.
	Bin string
	// LookupEnv reads the environment the engine inherits; nil means
	// os.LookupEnv. Engines that take settings from the environment (the
	// sim's INFERA_* variables) are parsed with it.
	LookupEnv func(string) (string, bool)
}

func (o Options) lookupEnv(key string) (string, bool) {
	if o.LookupEnv != nil {
		return o.LookupEnv(key)
	}
	return os.LookupEnv(key)
}

// Launch is a prepared engine start and the endpoint it will serve.
type Launch struct {
	Command  Command
	Endpoint Endpoint
}

// Endpoint is what the engine serves, as parsed from its arguments. Later
// adapters (vLLM, SGLang, ATOM) extend it with the fields of the worker
// record they discover (KV events, data parallel layout, disaggregation).
type Endpoint struct {
	// Host is the address the engine binds; it may be unspecified (0.0.0.0).
	Host string
	// Port is the engine's HTTP port.
	Port int
	// Model is the served model name clients use in "model".
	Model string
	// BlockSize is the KV block (page) size in tokens; 0 when unknown.
	BlockSize int
}

// Stats is what the worker reads from an engine's metrics.
type Stats struct {
	// Running and Waiting are the engine's request counts, summed over
	// every label set (models, DP ranks).
	Running, Waiting float64
	// BlockSize is the block size the engine reports; 0 when it does not.
	BlockSize int
}

// Idle reports whether the engine has no running or waiting request.
func (s Stats) Idle() bool { return s.Running+s.Waiting == 0 }

// adapters is the explicit registry of engines; config.WorkerEngines lists
// the same names for flag validation (a test keeps them in step).
var adapters = []Adapter{simAdapter{}}

// Lookup returns the adapter for an engine name.
func Lookup(name string) (Adapter, error) {
	for _, a := range adapters {
		if a.Name() == name {
			return a, nil
		}
	}
	return nil, fmt.Errorf("%w %q: supported engines: %s", ErrUnknownEngine, name, strings.Join(Names(), ", "))
}

// Names lists the engines that have an adapter.
func Names() []string {
	names := make([]string, len(adapters))
	for i, a := range adapters {
		names[i] = a.Name()
	}
	return names
}

// vllmStats reads the vLLM metric names (the simulator exports the same).
func vllmStats(r io.Reader) (Stats, error) {
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return Stats{}, fmt.Errorf("%w: parse: %w", ErrMetrics, err)
	}
	running, okR := sumFamily(families["vllm:num_requests_running"])
	waiting, okW := sumFamily(families["vllm:num_requests_waiting"])
	if !okR || !okW {
		// Missing gauges must not read as "idle": that would cut a drain short.
		return Stats{}, fmt.Errorf("%w: vllm:num_requests_running or vllm:num_requests_waiting missing", ErrMetrics)
	}
	s := Stats{Running: running, Waiting: waiting}
	if f := families["vllm:cache_config_info"]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "block_size" {
					continue
				}
				if n, err := strconv.Atoi(l.GetValue()); err == nil && n > 0 {
					s.BlockSize = n
				}
			}
		}
	}
	return s, nil
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

// parseEngineFlags reads the worker-relevant flags out of an engine command
// line without interpreting the rest, which is forwarded verbatim. names are
// flags that take a value; each may be given as "--name value",
// "--name=value", "-name value" or "-name=value" (the forms Go's flag package
// and Python's argparse accept), and the last occurrence wins. A value is
// consumed even when it looks like a flag ("--model --weird-name"). Parsing
// stops at "--". Flags not in names are skipped without their values, which
// the worker cannot know.
func parseEngineFlags(args []string, names ...string) (map[string]string, error) {
	found := make(map[string]string, len(names))
	err := walkEngineFlags(args, names, func(name string, _ int, _ bool, value string) {
		found[name] = value
	})
	return found, err
}

// replaceEngineFlag returns a copy of args with every value of flag name
// replaced, keeping the form it was written in.
func replaceEngineFlag(args []string, name, value string) ([]string, error) {
	out := slices.Clone(args)
	err := walkEngineFlags(args, []string{name}, func(_ string, i int, inline bool, _ string) {
		if inline {
			prefix, _, _ := strings.Cut(args[i], "=")
			out[i] = prefix + "=" + value
		} else {
			out[i] = value
		}
	})
	return out, err
}

// walkEngineFlags calls fn for each occurrence of a flag in names with the
// index of the argument holding its value (the flag itself when inline).
func walkEngineFlags(args, names []string, fn func(name string, i int, inline bool, value string)) error {
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			break
		}
		name, ok := strings.CutPrefix(arg, "--")
		if !ok {
			if name, ok = strings.CutPrefix(arg, "-"); !ok {
				continue
			}
		}
		name, value, inline := strings.Cut(name, "=")
		if !slices.Contains(names, name) {
			continue
		}
		if !inline {
			if i+1 >= len(args) {
				return fmt.Errorf("%w: %s needs a value", ErrEngineArgs, arg)
			}
			i++
			value = args[i]
		}
		fn(name, i, inline, value)
	}
	return nil
}

// freePort asks the kernel for a free TCP port on host. Another process can
// take it before the engine binds it; the engine then fails to start, which
// the worker reports, rather than serving on an unexpected port.
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("find free port on %q: %w", host, err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("find free port on %q: %w", host, err)
	}
	return port, nil
}

// parsePort validates a port given in engine arguments; 0 is valid and
// means "any free port".
func parsePort(flag, v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 65535 {
		return 0, fmt.Errorf("%w: %s %q: want a port 0-65535 (0 or none: the worker picks a free one)", ErrEngineArgs, flag, v)
	}
	return n, nil
}
