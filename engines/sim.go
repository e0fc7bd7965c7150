package engines

import (
	"fmt"
	"io"
	"maps"
	"os"
	"strconv"
	"strings"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
)

// Defaults of `infera sim` that the worker must know when the arguments
// leave them out (they match the sim's own flag defaults).
const (
	simDefaultHost      = "127.0.0.1"
	simDefaultModel     = "sim-model"
	simDefaultBlockSize = 16
)

// simAdapter runs the simulator, `infera sim`, as the engine: by default the
// worker's own executable, so one binary is the whole fleet.
type simAdapter struct{}

func (simAdapter) Name() string { return "sim" }

func (simAdapter) Prepare(opts Options, args []string) (Launch, error) {
	bin := opts.Bin
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return Launch{}, fmt.Errorf("sim: find own executable (set --engine-bin): %w", err)
		}
		bin = exe
	}
	names := []string{"host", "port", "model", "served-model-name", "block-size", "kv-events-endpoint", "kv-events-replay-endpoint",
		"pd-role", "pd-protocol", "pd-kv-port", "pd-engine-id"}
	argFlags, err := parseEngineFlags(args, names...)
	if err != nil {
		return Launch{}, err
	}
	flags := maps.Clone(argFlags)
	// The sim inherits the worker's environment and, like every infera
	// command, reads INFERA_<FLAG> when a flag is absent; the worker must
	// see the same values to advertise what the sim really serves.
	for _, name := range names {
		if _, ok := flags[name]; ok {
			continue
		}
		if v, ok := opts.lookupEnv(config.EnvName(name)); ok && v != "" {
			flags[name] = v
		}
	}
	ep := Endpoint{BlockSize: simDefaultBlockSize, DPSize: 1, Imitates: simFlavor(opts, args)}
	model := simDefaultModel
	if v, ok := flags["model"]; ok {
		model = v
	}
	if ep.Model, err = servedModel(flags, model); err != nil {
		return Launch{}, err
	}
	simFlags := endpointFlags{host: "host", blockSize: "block-size", defaultHost: simDefaultHost}
	if err := resolveBlockSize(flags, simFlags, &ep); err != nil {
		return Launch{}, err
	}
	if err := resolveHost(opts, flags, simFlags, &ep); err != nil {
		return Launch{}, err
	}

	// The worker must know the port to advertise it, so it picks a free one
	// when none is given, or when the given one is 0 (which would make the
	// sim choose one the worker cannot see).
	port := 0
	if v, ok := flags["port"]; ok {
		if port, err = parsePort("--port", v); err != nil {
			return Launch{}, err
		}
	}
	if port == 0 {
		if port, err = opts.freePorts(portCheckHost(ep.Host), 1); err != nil {
			return Launch{}, err
		}
	}
	ep.Port = port

	// Added before the user's arguments rather than after: Go's flag
	// parsing stops at the first positional argument or "--", and a flag
	// placed after one would be silently ignored.
	var added []string
	if argPort, ok := argFlags["port"]; ok {
		if argPort != strconv.Itoa(port) {
			// --port 0 in the arguments: put the chosen port in its place.
			if args, err = replaceEngineFlag(args, "port", strconv.Itoa(port)); err != nil {
				return Launch{}, err
			}
		}
	} else {
		// Absent, or from INFERA_PORT: said explicitly so the sim cannot
		// disagree.
		added = append(added, "--port", strconv.Itoa(port))
	}
	evArgs, warnings, err := simEvents(opts, flags, &ep)
	if err != nil {
		return Launch{}, err
	}
	added = append(added, evArgs...)
	pdArgs, err := simDisagg(opts, flags, &ep)
	if err != nil {
		return Launch{}, err
	}
	added = append(added, pdArgs...)

	engineArgs := make([]string, 0, 1+len(added)+len(args))
	engineArgs = append(engineArgs, "sim")
	engineArgs = append(engineArgs, added...)
	engineArgs = append(engineArgs, args...)
	return Launch{
		Command:  Command{Name: "sim", Path: bin, Args: engineArgs},
		Endpoint: ep,
		Warnings: warnings,
	}, nil
}

// simEvents sets up the sim's KV-event publisher and replay socket: the
// ones given (flags or INFERA_KV_EVENTS_*), or free ports on the sim's own
// host, which the sim binds (it always binds, whatever the address).
func simEvents(opts Options, flags map[string]string, ep *Endpoint) (args, warnings []string, err error) {
	if opts.NoKVEvents {
		return nil, nil, nil
	}
	if opts.KVEventsRouter != "" {
		return routerSimEvents(opts, flags, ep)
	}
	// Both sockets' free ports come from one block: two separate picks
	// can be handed the same just-released port.
	var auto []int
	socket := func(flag string) (string, error) {
		v, given := flags[flag]
		if !given {
			if len(auto) == 0 {
				base, err := opts.freePorts(portCheckHost(ep.Host), 2)
				if err != nil {
					return "", err
				}
				auto = []int{base, base + 1}
			}
			p := auto[0]
			auto = auto[1:]
			args = append(args, "--"+flag, tcpEndpoint(ep.Host, p))
			return tcpEndpoint(ep.AdvertiseHost, p), nil
		}
		if v == "" {
			return "", nil // explicitly off
		}
		zep, err := parseZMQ("--"+flag, v)
		if err != nil {
			return "", err
		}
		if !zep.tcp {
			warnings = append(warnings, fmt.Sprintf("--%s %q is not tcp: other hosts cannot subscribe, not advertised", flag, v))
			return "", nil
		}
		return advertisedEvents("--"+flag, zep, ep, 0)
	}
	if ep.KVEvents, err = socket("kv-events-endpoint"); err != nil || ep.KVEvents == "" {
		return nil, warnings, err
	}
	if ep.KVEventsReplay, err = socket("kv-events-replay-endpoint"); err != nil {
		return nil, nil, err
	}
	return args, warnings, nil
}

// simDisagg registers a sim in a PD role (--pd-role, --pd-protocol; sim/pd.go)
// as the engines of its protocol register: a prefill's KV server port
// (picked when absent or 0) and host become its bootstrap address, and a
// vLLM protocol's prefill gets an engine id. It returns the sim arguments
// to add.
func simDisagg(opts Options, flags map[string]string, ep *Endpoint) ([]string, error) {
	switch flags["pd-role"] {
	case "":
		return nil, nil
	case "prefill":
		ep.DisaggMode = discovery.DisaggPrefill
	case "decode":
		ep.DisaggMode = discovery.DisaggDecode
	default:
		return nil, fmt.Errorf("%w: --pd-role %q: want prefill or decode", ErrEngineArgs, flags["pd-role"])
	}
	protocol := flags["pd-protocol"]
	switch protocol {
	case discovery.ProtocolVLLMNixl, discovery.ProtocolVLLMMooncake, discovery.ProtocolSGLangBootstrap:
	default:
		return nil, fmt.Errorf("%w: --pd-protocol %q: want vllm-nixl, vllm-mooncake or sglang-bootstrap", ErrEngineArgs, protocol)
	}
	params := map[string]any{}
	var added []string
	if ep.DisaggMode == discovery.DisaggPrefill {
		port := 0
		if v, ok := flags["pd-kv-port"]; ok {
			var err error
			if port, err = parsePort("--pd-kv-port", v); err != nil {
				return nil, err
			}
		}
		if port == 0 {
			ports, err := opts.freePorts(portCheckHost(ep.Host), 1)
			if err != nil {
				return nil, err
			}
			port = ports
			added = append(added, "--pd-kv-port", strconv.Itoa(port))
		}
		added = append(added, "--pd-kv-host", ep.AdvertiseHost)
		switch protocol {
		case discovery.ProtocolSGLangBootstrap:
			params["bootstrap_host"], params["bootstrap_port"] = ep.AdvertiseHost, port
			params["bootstrap_addr"] = hostPort(ep.AdvertiseHost, port)
		case discovery.ProtocolVLLMMooncake:
			params["bootstrap_addr"] = "http://" + hostPort(ep.AdvertiseHost, port)
			params["bootstrap_port"] = port
		}
	}
	if protocol != discovery.ProtocolSGLangBootstrap {
		id := flags["pd-engine-id"]
		if id == "" {
			id = "infera-" + opts.randomID()
			added = append(added, "--pd-engine-id", id)
		}
		params["engine_id"] = id
	}
	ep.DisaggMeta = discovery.DisaggMeta{Protocol: protocol, Params: params}
	return added, nil
}

// simFlavor is the engine the simulator imitates, which its record names so
// that Python Infera servers (which know vllm, sglang and atom only) route
// it: --flavor (or INFERA_FLAVOR), vllm without one, as the sim's own
// metrics and events then are vLLM's.
func simFlavor(opts Options, args []string) string {
	flavor := ""
	if v, ok := opts.lookupEnv(config.EnvName("flavor")); ok {
		flavor = v
	}
	for i, a := range args {
		if a == "--" {
			break
		}
		if v, ok := strings.CutPrefix(strings.TrimLeft(a, "-"), "flavor="); ok && strings.HasPrefix(a, "-") {
			flavor = v
			break
		}
		if (a == "--flavor" || a == "-flavor") && i+1 < len(args) {
			flavor = args[i+1]
			break
		}
	}
	switch flavor {
	case discovery.EngineSGLang, discovery.EngineATOM:
		return flavor
	}
	return discovery.EngineVLLM
}

func (simAdapter) Inspect(metrics io.Reader) (Stats, error) { return vllmStats(metrics) }
