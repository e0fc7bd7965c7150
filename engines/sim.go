package engines

import (
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/infera/infera/config"
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
	names := []string{"host", "port", "model", "served-model-name", "block-size"}
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
	ep := Endpoint{Host: simDefaultHost, Model: simDefaultModel, BlockSize: simDefaultBlockSize}
	if v, ok := flags["host"]; ok {
		if err := checkHost(v); err != nil {
			return Launch{}, err
		}
		ep.Host = v
	}
	if v, ok := flags["model"]; ok {
		ep.Model = v
	}
	// The served name is what clients put in "model", so it wins over the
	// model path, as in vLLM.
	if v, ok := flags["served-model-name"]; ok {
		ep.Model = v
	}
	if strings.TrimSpace(ep.Model) == "" {
		return Launch{}, fmt.Errorf("%w: empty --model/--served-model-name", ErrEngineArgs)
	}
	if v, ok := flags["block-size"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return Launch{}, fmt.Errorf("%w: --block-size %q: want a positive integer", ErrEngineArgs, v)
		}
		ep.BlockSize = n
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
		if port, err = freePort(ep.Host); err != nil {
			return Launch{}, err
		}
	}
	ep.Port = port

	engineArgs := make([]string, 0, len(args)+3)
	engineArgs = append(engineArgs, "sim")
	if argPort, ok := argFlags["port"]; ok {
		if argPort != strconv.Itoa(port) {
			// --port 0 in the arguments: put the chosen port in its place.
			if args, err = replaceEngineFlag(args, "port", strconv.Itoa(port)); err != nil {
				return Launch{}, err
			}
		}
	} else {
		// Absent, or from INFERA_PORT: said explicitly so the sim cannot
		// disagree. Added before the user's arguments rather than after: Go's
		// flag parsing stops at the first positional argument or "--", and a
		// port placed after one would be silently ignored.
		engineArgs = append(engineArgs, "--port", strconv.Itoa(port))
	}
	engineArgs = append(engineArgs, args...)
	return Launch{
		Command:  Command{Name: "sim", Path: bin, Args: engineArgs},
		Endpoint: ep,
	}, nil
}

func (simAdapter) Inspect(metrics io.Reader) (Stats, error) { return vllmStats(metrics) }

// checkHost accepts an IP address or a host name; anything that could not
// be put into a URL as a host is refused.
func checkHost(h string) error {
	if net.ParseIP(h) != nil {
		return nil
	}
	if h == "" || strings.ContainsAny(h, ":/?#[]@ \t") {
		return fmt.Errorf("%w: --host %q: want an IP address or host name", ErrEngineArgs, h)
	}
	return nil
}
