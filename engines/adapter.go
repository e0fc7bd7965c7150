package engines

import (
	"errors"
	"fmt"
	"github.com/infera/infera/engargs"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/infera/infera/discovery"
)

// Errors of the adapters.
var (
	// ErrUnknownEngine is returned by Lookup for an engine without an adapter.
	ErrUnknownEngine = errors.New("unknown engine")
	// ErrEngineArgs is wrapped when the engine's own arguments cannot be used.
	ErrEngineArgs = engargs.ErrArgs
	// ErrMetrics is wrapped when an engine's /metrics (or the endpoint an
	// engine reports its block size on) cannot be read.
	ErrMetrics = errors.New("engine metrics")
	// ErrAdvertiseHost is wrapped when the engine binds every interface and
	// no address of this machine can be advertised for it.
	ErrAdvertiseHost = errors.New("no advertise host")
)

// Adapter knows one engine: how to launch it from the worker's settings and
// the engine's own command line, what to advertise for it, and how to read
// its load from its Prometheus metrics. Adapters are stateless.
type Adapter interface {
	// Name is the --engine value and the record's "engine" field.
	Name() string
	// Prepare parses the engine arguments (what follows the program name on
	// the engine's own command line, e.g. after `vllm serve`), adds what the
	// worker must (a free port when none is given, the KV-event publisher)
	// and returns the launch with everything the worker advertises.
	Prepare(opts Options, args []string) (Launch, error)
	// Inspect reads one Prometheus text exposition of the engine's /metrics.
	Inspect(metrics io.Reader) (Stats, error)
}

// blockSizeProber is implemented by adapters whose engine reports its
// resolved block size, and its cache size, on an HTTP endpoint other than
// /metrics (SGLang's /get_server_info). The worker asks it once the engine
// is healthy.
type blockSizeProber interface {
	blockSizePath() string
	// parseBlockSize returns the block size and the cache size in blocks
	// (0 when the body does not give it).
	parseBlockSize(body io.Reader) (size, blocks int, err error)
}

// Options are the worker settings an adapter may use when preparing a launch.
type Options struct {
	// Bin overrides the engine executable (--engine-bin); empty means the
	// adapter's default (sim: this binary; vllm: "vllm"; sglang and atom:
	// Python with -m and the engine's module).
	Bin string
	// Python is the interpreter for engines started as `python -m module`
	// (--python); empty means "python3".
	Python string
	// AdvertiseHost is --advertise-host; empty derives it from the host the
	// engine binds (see advertiseHost).
	AdvertiseHost string
	// NoKVEvents disables the KV-event publisher the worker would add, and
	// its advertisement (--no-kv-events).
	NoKVEvents bool
	// KVEventsRouter is the tcp://HOST:PORT of a router's KV-event
	// listener (--kv-events-router): the engine's publisher connects to it
	// under kvcache.WorkerTopic(worker id) and no endpoint is advertised.
	KVEventsRouter string
	// KVDSocket is the kvd daemon's Unix socket (--kvd-socket): the engine
	// gets it in INFERA_KVD_SOCKET and its connector configured (see
	// PrepareLaunch); empty: none.
	KVDSocket string
	// LookupEnv reads the environment the engine inherits; nil means
	// os.LookupEnv. Settings engines take from the environment (the sim's
	// INFERA_* variables, vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT) are read
	// with it.
	LookupEnv func(string) (string, bool)

	// Test seams; nil means the real thing.
	portBlock  func(host string, n int) (int, error) // first of n consecutive free ports
	interfaces func() ([]netInterface, error)        // the machine's interfaces for advertiseHost
	newID      func() string                         // a random token for generated engine ids
}

func (o Options) lookupEnv(key string) (string, bool) {
	if o.LookupEnv != nil {
		return o.LookupEnv(key)
	}
	return os.LookupEnv(key)
}

// freePorts returns the first of n consecutive ports that are free on host.
func (o Options) freePorts(host string, n int) (int, error) {
	if o.portBlock != nil {
		return o.portBlock(host, n)
	}
	return freePortBlock(host, n)
}

func (o Options) python() string {
	if o.Python != "" {
		return o.Python
	}
	return "python3"
}

func (o Options) randomID() string {
	if o.newID != nil {
		return o.newID()
	}
	return randomHex(4)
}

// Launch is a prepared engine start and what the worker advertises for it.
type Launch struct {
	Command  Command
	Endpoint Endpoint
	// Warnings are things about the launch the operator should know (a
	// publisher the worker cannot advertise, a layout it does not model);
	// the worker logs each one at warn level.
	Warnings []string
}

// Endpoint is what the engine serves, as parsed from its arguments and
// completed by the adapter. Record turns it into the worker record.
type Endpoint struct {
	// Host is the address the engine binds; it may be unspecified (0.0.0.0).
	Host string
	// Port is the engine's HTTP port.
	Port int
	// AdvertiseHost is the host other machines reach the engine at.
	AdvertiseHost string
	// Model is the served model name clients use in "model".
	Model string
	// BlockSize is the KV block (page) size in tokens; 0 when unknown until
	// the engine reports it.
	BlockSize int
	// KVBlocks is the engine's KV cache size in blocks (per rank), as it
	// reports it; 0 when unknown.
	KVBlocks int
	// KVEvents and KVEventsReplay are the advertised tcp://host:port of the
	// KV-event publisher and its replay socket (for a rank-multiplexed
	// worker: rank 0's, rank r being on port + r); empty when none.
	KVEvents       string
	KVEventsReplay string
	// DPRank is set for one rank of an externally load-balanced
	// data-parallel deployment; DPSize is the number of data-parallel ranks
	// (a worker with DPSize > 1 and no DPRank multiplexes them all).
	DPRank *int
	DPSize int
	// DisaggMode and DisaggMeta describe the prefill/decode role.
	DisaggMode discovery.DisaggMode
	DisaggMeta discovery.DisaggMeta
	// Imitates, when set, is the engine the record names instead of the
	// one running (the simulator registers as its --flavor), which is then
	// kept in real_engine.
	Imitates string
}

// Record is the worker record of this endpoint for engine.
func (e *Endpoint) Record(engine string) discovery.Record {
	id := net.JoinHostPort(e.AdvertiseHost, strconv.Itoa(e.Port))
	rec := discovery.Record{
		WorkerID:         id,
		URL:              "http://" + id,
		ModelName:        e.Model,
		Engine:           engine,
		DisaggMode:       e.DisaggMode,
		DisaggMeta:       e.DisaggMeta,
		DPSize:           max(e.DPSize, 1),
		RequestTransport: discovery.TransportHTTP,
		Status:           discovery.StatusActive,
	}
	if rec.DisaggMode == "" {
		rec.DisaggMode = discovery.DisaggMixed
	}
	if e.Imitates != "" && e.Imitates != engine {
		rec.Engine, rec.RealEngine = e.Imitates, engine
	}
	if e.BlockSize > 0 {
		bs := e.BlockSize
		rec.KVBlockSize = &bs
		rec.KVCapacityBlocks = e.KVBlocks
	}
	if e.KVEvents != "" {
		ep := e.KVEvents
		rec.KVEventsEndpoint = &ep
	}
	if e.KVEventsReplay != "" {
		ep := e.KVEventsReplay
		rec.KVEventsReplayEndpoint = &ep
	}
	if e.DPRank != nil {
		r := *e.DPRank
		rec.DPRank = &r
	}
	return rec
}

// Stats is what the worker reads from an engine's metrics.
type Stats struct {
	// Running and Waiting are the engine's request counts, summed over
	// every label set (models, DP ranks).
	Running, Waiting float64
	// BlockSize is the block size the engine reports; 0 when it does not.
	BlockSize int
	// KVBlocks is the cache size in blocks the engine reports (its
	// cache_config_info's num_gpu_blocks); 0 when it does not.
	KVBlocks int
}

// kvCapacity is a cache size the engine reports, in blocks, as the worker
// registers it: whole blocks within what a router accepts
// (1..discovery.MaxKVCapacityBlocks), else 0, unknown — an absurd report
// must leave the capacity to the router's own learning, not fail the
// registration.
func kvCapacity(blocks float64) int {
	if blocks >= 1 && blocks <= discovery.MaxKVCapacityBlocks {
		return int(blocks)
	}
	return 0
}

// Idle reports whether the engine has no running or waiting request.
func (s Stats) Idle() bool { return s.Running+s.Waiting == 0 }

// adapters is the explicit registry of engines; config.WorkerEngines lists
// the same names in the same order for flag validation (a test keeps them
// in step).
var adapters = []Adapter{simAdapter{}, vllmAdapter{}, sglangAdapter{}, atomAdapter{}}

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

// pythonEnv is the environment added to Python engines: without it Python
// block-buffers stdout into the pipe, and the engine's log lines would reach
// the worker's log late and in bursts, or not at all before a crash.
func pythonEnv(opts Options) []string {
	if _, ok := opts.lookupEnv("PYTHONUNBUFFERED"); ok {
		return nil
	}
	return []string{"PYTHONUNBUFFERED=1"}
}

// appendArgs adds the worker's flags after the user's arguments but before a
// "--" among them, after which the engine would not read them as flags.
// Python engines (argparse) accept options after positionals, so the user's
// command line stays first and reads as they wrote it.
func appendArgs(args []string, extra ...string) []string {
	if len(extra) == 0 {
		return args
	}
	out := make([]string, 0, len(args)+len(extra))
	i := slices.Index(args, "--")
	if i < 0 {
		i = len(args)
	}
	out = append(out, args[:i]...)
	out = append(out, extra...)
	return append(out, args[i:]...)
}

// resolvePort returns the engine's HTTP port and the arguments to launch it
// with: the given port, or a free one when none (or 0) is given, put in
// place of a 0 or added with addFlag. flag is the engine's port flag name.
func resolvePort(opts Options, args []string, flag, value string, given bool, host string) (int, []string, []string, error) {
	port := 0
	var err error
	if given {
		if port, err = parsePort("--"+flag, value); err != nil {
			return 0, nil, nil, err
		}
	}
	if port != 0 {
		return port, args, nil, nil
	}
	if port, err = opts.freePorts(host, 1); err != nil {
		return 0, nil, nil, err
	}
	if given {
		// --port 0 would make the engine choose a port the worker cannot
		// see; the chosen one takes its place.
		args, err = replaceEngineFlag(args, flag, strconv.Itoa(port))
		return port, args, nil, err
	}
	return port, args, []string{"--" + flag, strconv.Itoa(port)}, nil
}

// parseEngineFlags reads the worker-relevant flags out of an engine command
// line without interpreting the rest, which is forwarded verbatim. names are
// flags that take a value; each may be given as "--name value",
// "--name=value", "-name value" or "-name=value" (the forms Go's flag package
// and Python's argparse accept), with "_" for "-" as vLLM allows, and the
// last occurrence wins. A value is consumed even when it looks like a flag
// ("--model --weird-name"). Parsing stops at "--". Flags not in names are
// skipped without their values, which the worker cannot know.
func parseEngineFlags(args []string, names ...string) (map[string]string, error) {
	found := make(map[string]string, len(names))
	err := walkEngineFlags(args, names, func(f engargs.Flag) { found[f.Name] = f.Value })
	return found, err
}

// firstEngineFlag is like parseEngineFlags for one flag but keeps the first
// occurrence (vLLM's first --served-model-name is the primary name).
func firstEngineFlag(args []string, name string) (string, bool, error) {
	var v string
	found := false
	err := walkEngineFlags(args, []string{name}, func(f engargs.Flag) {
		if !found {
			v, found = f.Value, true
		}
	})
	return v, found, err
}

// hasEngineFlag reports whether a flag without a value (a switch) is
// present before "--", in any of the spellings parseEngineFlags accepts
// (without a value) or as --name=true.
func hasEngineFlag(args []string, names ...string) bool {
	for _, arg := range args {
		if arg == "--" {
			return false
		}
		name, value, inline, ok := engargs.Split(arg)
		if ok && slices.Contains(names, name) && (!inline || strings.EqualFold(value, "true") || value == "1") {
			return true
		}
	}
	return false
}

// replaceEngineFlag returns a copy of args with every value of flag name
// replaced, keeping the form it was written in.
func replaceEngineFlag(args []string, name, value string) ([]string, error) {
	out := slices.Clone(args)
	err := walkEngineFlags(args, []string{name}, func(f engargs.Flag) {
		if f.Inline {
			prefix, _, _ := strings.Cut(args[f.At], "=")
			out[f.At] = prefix + "=" + value
		} else {
			out[f.At] = value
		}
	})
	return out, err
}

// walkEngineFlags calls fn for each occurrence of a flag in names before
// "--" (see engargs.Walk).
func walkEngineFlags(args, names []string, fn func(engargs.Flag)) error {
	return engargs.Walk(args, engargs.Names(names...), func(f engargs.Flag) error {
		fn(f)
		return nil
	})
}

// lookup returns the value of the first of several spellings of one flag
// (e.g. "tensor-parallel-size" and its alias "tp") found in flags.
func lookup(flags map[string]string, names ...string) (string, bool) {
	for _, n := range names {
		if v, ok := flags[n]; ok {
			return v, true
		}
	}
	return "", false
}

// parseCount parses a positive integer flag value (a size); absent gives def.
func parseCount(flags map[string]string, def int, names ...string) (int, error) {
	v, ok := lookup(flags, names...)
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > discovery.MaxDPSize {
		return 0, fmt.Errorf("%w: --%s %q: want an integer 1..%d", ErrEngineArgs, names[0], v, discovery.MaxDPSize)
	}
	return n, nil
}

// parseBlockSize parses a --block-size/--page-size value.
func parseBlockSizeFlag(flag, v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > discovery.MaxKVBlockSize {
		return 0, fmt.Errorf("%w: --%s %q: want an integer 1..%d", ErrEngineArgs, flag, v, discovery.MaxKVBlockSize)
	}
	return n, nil
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

// checkHost accepts an IP address or a host name; anything a worker record
// could not carry as a host is refused.
func checkHost(h string) error {
	if !validHostName(h) {
		return fmt.Errorf("%w: --host %q: want an IP address or host name", ErrEngineArgs, clipArg(h))
	}
	return nil
}

// validHostName accepts an IP address or a name made of the characters a
// worker record allows in a host.
func validHostName(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// checkModel refuses a model name the record could not carry.
func checkModel(name string) error {
	if strings.TrimSpace(name) == "" {
		return fmt.Errorf("%w: empty model name", ErrEngineArgs)
	}
	if len(name) > discovery.MaxModelNameBytes || !utf8.ValidString(name) ||
		strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("%w: model name %q: want at most %d bytes of UTF-8 without control characters", ErrEngineArgs, clipArg(name), discovery.MaxModelNameBytes)
	}
	return nil
}

// clipArg keeps error messages short when an argument is huge.
func clipArg(s string) string { return engargs.Clip(s) }

// The preamble every adapter shares: which flags name the served model,
// the bind host, the HTTP port and the KV block size, and how they become
// the Endpoint the worker advertises.

// endpointFlags names an engine's preamble flags.
type endpointFlags struct {
	host, port, blockSize string
	defaultHost           string
	// emptyHostIsDefault: `--host ""` means the default (vLLM), rather than
	// an invalid host.
	emptyHostIsDefault bool
}

// servedModel returns the name clients use: --served-model-name when given
// (it wins over the model path, as in vLLM), else model; checked.
func servedModel(flags map[string]string, model string) (string, error) {
	if v, ok := flags["served-model-name"]; ok {
		model = v
	}
	if err := checkModel(model); err != nil {
		return "", err
	}
	return model, nil
}

// requiredModel is servedModel over the first of the model flags given;
// the first name is the one an error asks for.
func requiredModel(flags map[string]string, names ...string) (string, error) {
	model, ok := lookup(flags, names...)
	if !ok {
		return "", fmt.Errorf("%w: --%s is required", ErrEngineArgs, names[0])
	}
	return servedModel(flags, model)
}

// resolveHost sets ep.Host (checked) and ep.AdvertiseHost.
func resolveHost(opts Options, flags map[string]string, f endpointFlags, ep *Endpoint) error {
	ep.Host = f.defaultHost
	if v, ok := flags[f.host]; ok && !(f.emptyHostIsDefault && v == "") {
		if err := checkHost(v); err != nil {
			return err
		}
		ep.Host = v
	}
	var err error
	ep.AdvertiseHost, err = advertiseHost(opts.AdvertiseHost, ep.Host, opts.interfaces)
	return err
}

// resolveBlockSize sets ep.BlockSize when the block-size flag is given.
func resolveBlockSize(flags map[string]string, f endpointFlags, ep *Endpoint) error {
	v, ok := flags[f.blockSize]
	if !ok {
		return nil
	}
	var err error
	ep.BlockSize, err = parseBlockSizeFlag(f.blockSize, v)
	return err
}

// resolveEndpoint runs the preamble after the model: host, advertised
// host, port (see resolvePort: the rewritten args and the flags to add)
// and block size.
func resolveEndpoint(opts Options, args []string, flags map[string]string, f endpointFlags, ep *Endpoint) (newArgs, extra []string, err error) {
	if err := resolveHost(opts, flags, f, ep); err != nil {
		return nil, nil, err
	}
	portValue, portGiven := flags[f.port]
	ep.Port, args, extra, err = resolvePort(opts, args, f.port, portValue, portGiven, portCheckHost(ep.Host))
	if err != nil {
		return nil, nil, err
	}
	if err := resolveBlockSize(flags, f, ep); err != nil {
		return nil, nil, err
	}
	return args, extra, nil
}
