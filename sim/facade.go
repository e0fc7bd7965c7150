package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/infera/infera/config"
	"github.com/infera/infera/engargs"
)

// Facades (DESIGN §8): `infera sim --flavor vllm|sglang|atom ENGINE ARGS`
// takes an engine's own command line, so that a shim named like the engine
// can stand in for it under `infera worker --engine X`:
//
//	vllm   (what follows `vllm`):   serve MODEL [--host] [--port 8000] [--served-model-name N…]
//	        [--block-size 16] [--max-model-len] [--max-num-seqs] [--max-num-batched-tokens]
//	        [--seed] [--tokenizer DIR] [--data-parallel-rank R] [--kv-events-config JSON]
//	sglang (what follows `python -m sglang.launch_server`): --model-path M [--host 127.0.0.1]
//	        [--port 30000] [--served-model-name] [--page-size 1] [--context-length]
//	        [--max-running-requests] [--chunked-prefill-size] [--random-seed]
//	        [--tokenizer-path DIR] [--kv-events-config JSON] [--dp-size] [--disaggregation-mode]
//	atom   (what follows `python -m atom.entrypoints.openai_server`): --model M [--host]
//	        [--server-port 8000] [--served-model-name] [--block-size 16] [--max-model-len]
//	        [--max-num-seqs] [--max-num-batched-tokens] [--kv-events-config JSON]
//
// Flags are written as argparse takes them: --name value, --name=value,
// -name, "_" for "-" in names, and vLLM's dotted JSON keys
// (--kv-events-config.endpoint tcp://*:5557). Every other flag is accepted
// and ignored with the values that follow it, so command lines from the
// engines' documentation run (--tensor-parallel-size 8, --trust-remote-code,
// --enable-metrics, --kv-transfer-config …); ApplyFacade returns them for
// the log.
//
// Engine defaults apply where the sim flags before --flavor did not set the
// field: vLLM and ATOM bind 0.0.0.0:8000 with 16-token blocks, SGLang
// 127.0.0.1:30000 with 1-token pages. --kv-events-config is read as the
// engine reads it: vLLM and ATOM publish when "enable_kv_cache_events" is
// true and the publisher is zmq (or unset), SGLang when the publisher is
// zmq; "endpoint" defaults to tcp://*:5557, "replay_endpoint" to none,
// "topic" to "", "buffer_steps" to 10000. A vLLM data-parallel rank R adds
// R to both ports, as vLLM does. Events are encoded as the engine encodes
// them: vLLM as msgspec tagged arrays (vllm-array), SGLang as sglang, ATOM
// as tagged maps (vllm), unless --kv-events-format was given. A model given
// as a directory holding tokenizer.json (or --tokenizer / --tokenizer-path
// naming one) becomes the simulator's tokenizer.
//
// The publisher always binds its endpoints; an engine would connect instead
// to an endpoint without "*" or "::" (the worker never advertises those).
//
// Not modelled: data parallelism inside one engine (SGLang --dp-size > 1 or
// vLLM --data-parallel-size without --data-parallel-rank run as a single
// rank; the requests per X-Data-Parallel-Rank received are counted in
// /metrics), except that an SGLang PD role keeps its KV per rank
// (--pd-dp-size, pd.go). Disaggregated roles (pd.go): vLLM's --kv-transfer-config with
// the NixlConnector (kv_producer / kv_consumer) and SGLang's
// --disaggregation-mode prefill|decode with --disaggregation-bootstrap-port
// select the sim's PD role and protocol.

// ErrFacadeArgs wraps an engine command line the facade cannot run.
var ErrFacadeArgs = errors.New("bad engine arguments")

type argKind uint8

const (
	argValue argKind = iota // one value: --name v or --name=v
	argMulti                // one or more values (argparse nargs="+"); the first is used
)

type facadeFlag struct {
	kind argKind
	set  func(f *facade, v string) error
}

// facade is one engine command line being applied to a sim configuration.
type facade struct {
	cfg      *config.Sim
	explicit func(simFlag string) bool
	flags    map[string]facadeFlag

	model       string
	modelGiven  bool
	tokenizer   string
	events      map[string]any // --kv-events-config, merged with its dotted keys
	eventsGiven bool
	dpSize      int
	ignored     []string

	// set records engine flags that set a config field, so engine
	// defaults do not overwrite them.
	set map[string]bool
}

// ApplyFacade applies an engine command line of cfg.Flavor to cfg, which
// holds the sim flags given before --flavor; explicit reports whether a sim
// flag (by name) was set on the command line or in the environment, so that
// engine defaults do not override it. It returns the engine flags accepted
// but not modelled. The caller validates cfg afterwards.
func ApplyFacade(cfg *config.Sim, args []string, explicit func(simFlag string) bool) ([]string, error) {
	if explicit == nil {
		explicit = func(string) bool { return false }
	}
	f := &facade{cfg: cfg, explicit: explicit, set: map[string]bool{}, dpSize: 1}
	switch cfg.Flavor {
	case config.FlavorVLLM:
		f.flags = vllmFlags()
	case config.FlavorSGLang:
		f.flags = sglangFlags()
	case config.FlavorATOM:
		f.flags = atomFlags()
	default:
		return nil, fmt.Errorf("%w: unknown flavor %q", ErrFacadeArgs, cfg.Flavor)
	}
	if err := f.parse(args); err != nil {
		return f.ignored, err
	}
	if err := f.finish(); err != nil {
		return f.ignored, err
	}
	return f.ignored, nil
}

func vllmFlags() map[string]facadeFlag {
	return map[string]facadeFlag{
		"model":                  {argValue, setModel},
		"served-model-name":      {argMulti, setServed},
		"host":                   {argValue, setHost},
		"port":                   {argValue, setPort},
		"block-size":             {argValue, setBlockSize},
		"max-model-len":          {argValue, setMaxModelLen},
		"max-num-seqs":           {argValue, setMaxSeqs},
		"max-num-batched-tokens": {argValue, setMaxBatched},
		"seed":                   {argValue, setSeed},
		"tokenizer":              {argValue, setTokenizer},
		"kv-events-config":       {argValue, setEventsConfig},
		"data-parallel-rank":     {argValue, setDPRank},
		"kv-transfer-config":     {argValue, setKVTransferConfig},
		"dpn":                    {argValue, setDPRank},
	}
}

func sglangFlags() map[string]facadeFlag {
	return map[string]facadeFlag{
		"model-path":                    {argValue, setModel},
		"model":                         {argValue, setModel},
		"served-model-name":             {argValue, setServed},
		"host":                          {argValue, setHost},
		"port":                          {argValue, setPort},
		"page-size":                     {argValue, setBlockSize},
		"context-length":                {argValue, setMaxModelLen},
		"max-running-requests":          {argValue, setMaxSeqs},
		"chunked-prefill-size":          {argValue, setChunkedPrefill},
		"random-seed":                   {argValue, setSeed},
		"tokenizer-path":                {argValue, setTokenizer},
		"kv-events-config":              {argValue, setEventsConfig},
		"dp-size":                       {argValue, setDPSize},
		"dp":                            {argValue, setDPSize},
		"disaggregation-mode":           {argValue, setDisaggMode},
		"disaggregation-bootstrap-port": {argValue, setBootstrapPort},
	}
}

func atomFlags() map[string]facadeFlag {
	return map[string]facadeFlag{
		"model":                  {argValue, setModel},
		"served-model-name":      {argValue, setServed},
		"host":                   {argValue, setHost},
		"server-port":            {argValue, setPort},
		"kv-transfer-config":     {argValue, setATOMKVTransferConfig},
		"block-size":             {argValue, setBlockSize},
		"max-model-len":          {argValue, setMaxModelLen},
		"max-num-seqs":           {argValue, setMaxSeqs},
		"max-num-batched-tokens": {argValue, setMaxBatched},
		"tokenizer":              {argValue, setTokenizer},
		"kv-events-config":       {argValue, setEventsConfig},
	}
}

// parse reads the command line as the engine's argparse does (see
// engargs): after "--" every argument is positional, and negative numbers
// are values, not flags.
func (f *facade) parse(args []string) error {
	positional := 0
	if f.cfg.Flavor == config.FlavorVLLM && len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	afterDashes := false
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" && !afterDashes {
			afterDashes = true
			continue
		}
		name, value, inline, isFlag := engargs.Split(arg)
		if afterDashes || !isFlag {
			// vLLM takes the model as its one positional argument.
			if f.cfg.Flavor != config.FlavorVLLM || positional > 0 {
				return fmt.Errorf("%w: unexpected argument %q", ErrFacadeArgs, arg)
			}
			positional++
			if err := setModel(f, arg); err != nil {
				return err
			}
			continue
		}
		if key, ok := strings.CutPrefix(name, "kv-events-config."); ok {
			v, at, err := engargs.Value(args, i, value, inline)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrFacadeArgs, err)
			}
			i = at
			if f.events, err = engargs.SetDotted(f.events, key, v); err != nil {
				return fmt.Errorf("%w: %w", ErrFacadeArgs, err)
			}
			f.eventsGiven = true
			continue
		}
		spec, known := f.flags[name]
		if !known {
			// Not modelled: skip it and any values it was given.
			f.ignored = append(f.ignored, arg)
			i = f.skipValues(args, i, inline, true)
			continue
		}
		v, at, err := engargs.Value(args, i, value, inline)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrFacadeArgs, err)
		}
		i = at
		if err := spec.set(f, v); err != nil {
			return fmt.Errorf("%w: --%s %q: %w", ErrFacadeArgs, name, v, err)
		}
		if spec.kind == argMulti {
			// Further names: the simulator serves the first.
			i = f.skipValues(args, i, inline, false)
		}
	}
	return nil
}

// skipValues moves past the values following args[i] (not flags, not
// "--"), recording them as ignored if record, and returns the index of the
// last one.
func (f *facade) skipValues(args []string, i int, inline, record bool) int {
	for !inline && i+1 < len(args) && !engargs.IsFlag(args[i+1]) && args[i+1] != "--" {
		i++
		if record {
			f.ignored = append(f.ignored, args[i])
		}
	}
	return i
}

func (f *facade) has(field string) bool { return f.set[field] || f.explicit(field) }

// finish applies engine defaults and the events configuration.
func (f *facade) finish() error {
	cfg := f.cfg
	if !f.modelGiven {
		switch cfg.Flavor {
		case config.FlavorVLLM:
			return fmt.Errorf("%w: no model: give it as in `vllm serve MODEL`", ErrFacadeArgs)
		case config.FlavorSGLang:
			return fmt.Errorf("%w: --model-path is required", ErrFacadeArgs)
		default:
			return fmt.Errorf("%w: --model is required", ErrFacadeArgs)
		}
	}
	host, port, block := "0.0.0.0", 8000, 16
	if cfg.Flavor == config.FlavorSGLang {
		host, port, block = "127.0.0.1", 30000, 1
	}
	if !f.has("host") {
		cfg.Host = host
	}
	if !f.has("port") {
		cfg.Port = port
	}
	if !f.has("block-size") {
		cfg.BlockSize = block
	}
	// Keep the default cache's capacity in tokens whatever the block size
	// (SGLang's 1-token pages would otherwise hold 4096 tokens), and never
	// below one sequence of the context length.
	if !f.has("kv-blocks") && cfg.BlockSize > 0 {
		def := config.DefaultSim()
		tokens := max(def.KVBlocks*def.BlockSize, cfg.MaxModelLen)
		cfg.KVBlocks = (tokens + cfg.BlockSize - 1) / cfg.BlockSize
	}
	if f.tokenizer == "" && hasTokenizerJSON(f.model) {
		f.tokenizer = f.model
	}
	if f.tokenizer != "" && !f.explicit("tokenizer") {
		cfg.Tokenizer = f.tokenizer
	}
	if !f.explicit("kv-events-format") {
		switch cfg.Flavor {
		case config.FlavorVLLM:
			cfg.KVEventsFormat = config.KVFormatVLLMArray
		case config.FlavorSGLang:
			cfg.KVEventsFormat = config.KVFormatSGLang
		default:
			cfg.KVEventsFormat = config.KVFormatVLLM
		}
	}
	switch {
	case f.dpSize > 1 && cfg.PDProtocol == "sglang-bootstrap" && cfg.PDRole != "":
		// A PD role keeps its KV per rank (pd.go); decoding runs as one.
		if !f.explicit("pd-dp-size") {
			cfg.PDDPSize = f.dpSize
		}
	case f.dpSize > 1:
		f.ignored = append(f.ignored, "--dp-size "+strconv.Itoa(f.dpSize)+" (simulated as one rank)")
	}
	return f.applyEvents()
}

// applyEvents maps --kv-events-config onto the publisher settings.
func (f *facade) applyEvents() error {
	if !f.eventsGiven {
		return nil
	}
	cfg, ev := f.cfg, f.events
	publisher, hasPublisher := ev["publisher"].(string)
	enabled := false
	switch cfg.Flavor {
	case config.FlavorSGLang:
		enabled = hasPublisher && publisher == "zmq"
	default:
		on, _ := boolValue(ev["enable_kv_cache_events"])
		enabled = on && (!hasPublisher || publisher == "zmq")
	}
	if !enabled {
		cfg.KVEventsEndpoint, cfg.KVEventsReplayEndpoint = "", ""
		return nil
	}
	str := func(key, def string) (string, error) {
		v, ok := ev[key]
		if !ok || v == nil {
			return def, nil
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("%w: --kv-events-config %s: want a string", ErrFacadeArgs, key)
		}
		return s, nil
	}
	var err error
	if cfg.KVEventsEndpoint, err = str("endpoint", "tcp://*:5557"); err != nil {
		return err
	}
	if cfg.KVEventsReplayEndpoint, err = str("replay_endpoint", ""); err != nil {
		return err
	}
	if cfg.KVEventsTopic, err = str("topic", ""); err != nil {
		return err
	}
	if v, ok := ev["buffer_steps"]; ok {
		n, ok := intValue(v)
		if !ok {
			return fmt.Errorf("%w: --kv-events-config buffer_steps: want an integer", ErrFacadeArgs)
		}
		cfg.KVEventsBuffer = n
	}
	// vLLM offsets both sockets by the data-parallel rank, so the ranks of
	// one node do not collide.
	if cfg.DPRank > 0 {
		if cfg.KVEventsEndpoint, err = offsetPort(cfg.KVEventsEndpoint, cfg.DPRank); err != nil {
			return err
		}
		if cfg.KVEventsReplayEndpoint, err = offsetPort(cfg.KVEventsReplayEndpoint, cfg.DPRank); err != nil {
			return err
		}
	}
	return nil
}

// offsetPort adds n to a tcp:// endpoint's port (0 stays 0: a free port).
func offsetPort(endpoint string, n int) (string, error) {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return endpoint, nil // validation reports it
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return endpoint, nil
	}
	p, err := strconv.Atoi(port)
	if err != nil || p == 0 {
		return endpoint, nil
	}
	if p+n > 65535 {
		return "", fmt.Errorf("%w: %s + data-parallel rank %d is past port 65535", ErrFacadeArgs, endpoint, n)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+n)), nil
}

func hasTokenizerJSON(dir string) bool {
	if dir == "" {
		return false
	}
	st, err := os.Stat(filepath.Join(dir, "tokenizer.json"))
	return err == nil && st.Mode().IsRegular()
}

// setEventsKey applies a dotted --kv-events-config.KEY VALUE: JSON when it
// parses, else the plain string, as vLLM reads it.

func boolValue(v any) (bool, bool) {
	switch v := v.(type) {
	case bool:
		return v, true
	case json.Number:
		b, err := strconv.ParseBool(v.String())
		return b, err == nil
	case string:
		b, err := strconv.ParseBool(v)
		return b, err == nil
	}
	return false, false
}

func intValue(v any) (int, bool) {
	switch v := v.(type) {
	case json.Number:
		x, err := v.Float64()
		if err != nil {
			return 0, false
		}
		return intValue(x)
	case float64:
		if v != math.Trunc(v) || v < math.MinInt32 || v > math.MaxInt32 {
			return 0, false
		}
		return int(v), true
	case string:
		n, err := strconv.Atoi(v)
		return n, err == nil
	}
	return 0, false
}

// parseHumanInt parses an integer, with vLLM's human-readable suffixes for
// sizes: k/m/g for powers of 1000 (decimals allowed, "25.6k"), K/M/G for
// powers of 1024.
func parseHumanInt(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		return n, nil
	}
	if s == "" {
		return 0, errors.New("empty number")
	}
	mult := map[byte]float64{'k': 1e3, 'm': 1e6, 'g': 1e9, 'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}[s[len(s)-1]]
	if mult == 0 {
		return 0, errors.New("not an integer")
	}
	v, err := strconv.ParseFloat(s[:len(s)-1], 64)
	if err != nil || v < 0 {
		return 0, errors.New("not a size")
	}
	n := v * mult
	if n != math.Trunc(n) || n > math.MaxInt32 {
		return 0, errors.New("not a whole number of tokens")
	}
	return int(n), nil
}

func intFlag(dst *int, f *facade, field, v string) error {
	n, err := parseHumanInt(v)
	if err != nil {
		return err
	}
	*dst = n
	f.set[field] = true
	return nil
}

func setModel(f *facade, v string) error {
	if v == "" {
		return errors.New("empty model")
	}
	f.model, f.modelGiven = v, true
	f.cfg.Model = v
	return nil
}

func setServed(f *facade, v string) error {
	f.cfg.ServedModelName = v
	return nil
}

func setHost(f *facade, v string) error {
	f.cfg.Host = v
	f.set["host"] = true
	return nil
}

func setPort(f *facade, v string) error { return intFlag(&f.cfg.Port, f, "port", v) }

func setBlockSize(f *facade, v string) error { return intFlag(&f.cfg.BlockSize, f, "block-size", v) }

func setMaxModelLen(f *facade, v string) error {
	return intFlag(&f.cfg.MaxModelLen, f, "max-model-len", v)
}

func setMaxSeqs(f *facade, v string) error { return intFlag(&f.cfg.MaxNumSeqs, f, "max-num-seqs", v) }

func setMaxBatched(f *facade, v string) error {
	return intFlag(&f.cfg.MaxNumBatchedTokens, f, "max-num-batched-tokens", v)
}

// setChunkedPrefill: SGLang's per-step prefill budget; -1 disables
// chunking, which the simulator approximates with its default budget.
func setChunkedPrefill(f *facade, v string) error {
	n, err := parseHumanInt(v)
	if err != nil {
		return err
	}
	if n > 0 {
		f.cfg.MaxNumBatchedTokens = n
	}
	return nil
}

func setSeed(f *facade, v string) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return errors.New("not an integer")
	}
	f.cfg.Seed = n
	return nil
}

// setTokenizer takes a tokenizer directory; a hub name (no local
// tokenizer.json) cannot be loaded offline and is ignored.
func setTokenizer(f *facade, v string) error {
	if hasTokenizerJSON(v) {
		f.tokenizer = v
	} else {
		f.ignored = append(f.ignored, "tokenizer "+v+" (no tokenizer.json there)")
	}
	return nil
}

func setEventsConfig(f *facade, v string) error {
	obj, err := engargs.DecodeObject(v)
	if err != nil {
		return err
	}
	// A whole object replaces what came before, as argparse keeps the last.
	f.events, f.eventsGiven = obj, true
	return nil
}

func setDPRank(f *facade, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return errors.New("want a rank ≥ 0")
	}
	f.cfg.DPRank = n
	return nil
}

func setDPSize(f *facade, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return errors.New("want a size ≥ 1")
	}
	f.dpSize = n
	return nil
}

// setDisaggMode: SGLang's --disaggregation-mode is the sim's PD role with
// the sglang-bootstrap protocol; the prefill's bootstrap server is its KV
// server, on --disaggregation-bootstrap-port (8998 by default).
func setDisaggMode(f *facade, v string) error {
	switch v {
	case "null":
		f.cfg.PDRole, f.cfg.PDProtocol = "", ""
		return nil
	case "prefill", "decode":
		f.cfg.PDRole, f.cfg.PDProtocol = v, "sglang-bootstrap"
		if v == "prefill" && !f.set["pd-kv-port"] && !f.explicit("pd-kv-port") {
			f.cfg.PDKVPort = sglangBootstrapPort
		}
		return nil
	}
	return errors.New("want null, prefill or decode")
}

// sglangBootstrapPort is --disaggregation-bootstrap-port's default.
const sglangBootstrapPort = 8998

func setBootstrapPort(f *facade, v string) error {
	if err := intFlag(&f.cfg.PDKVPort, f, "pd-kv-port", v); err != nil {
		return err
	}
	if f.cfg.PDKVPort < 1 || f.cfg.PDKVPort > 65535 {
		return errors.New("want a port 1-65535")
	}
	return nil
}

// setKVTransferConfig reads vLLM's --kv-transfer-config: kv_role
// kv_producer / kv_consumer is the sim's prefill / decode role; the
// NixlConnector is the vllm-nixl protocol, the MooncakeConnector
// vllm-mooncake (others are not simulated and refused, so a test cannot
// silently run decode-only); engine_id is handed off. The Nixl side
// channel (the prefill's KV server) listens on VLLM_NIXL_SIDE_CHANNEL_PORT,
// else on a free port (the hand-off carries the port, and one host runs
// many simulated prefills); Mooncake's bootstrap server on
// VLLM_MOONCAKE_BOOTSTRAP_PORT, 8998 by default, as the worker registers.
func setKVTransferConfig(f *facade, v string) error {
	obj, disaggregated, err := readKVRole(f, v)
	if err != nil || !disaggregated {
		return err
	}
	connector, _ := obj["kv_connector"].(string)
	portEnv := ""
	switch connector {
	case "NixlConnector":
		f.cfg.PDProtocol, portEnv = "vllm-nixl", "VLLM_NIXL_SIDE_CHANNEL_PORT"
	case "MooncakeConnector":
		f.cfg.PDProtocol, portEnv = "vllm-mooncake", "VLLM_MOONCAKE_BOOTSTRAP_PORT"
		if f.cfg.PDRole == "prefill" && !f.explicit("pd-kv-port") {
			f.cfg.PDKVPort = vllmMooncakeBootstrapPort
		}
	case "MoRIIOConnector":
		extra, _ := obj["kv_connector_extra_config"].(map[string]any)
		f.cfg.PDProtocol = "vllm-mori-write"
		read, ok := boolValue(extra["read_mode"])
		if !ok {
			read, _ = boolValue(os.Getenv("VLLM_MORIIO_CONNECTOR_READ_MODE"))
		}
		if read {
			f.cfg.PDProtocol = "vllm-mori-read"
		}
		// The prefill's KV server is its handshake port.
		if hp, ok := intValue(extra["handshake_port"]); ok && f.cfg.PDRole == "prefill" && !f.explicit("pd-kv-port") {
			f.cfg.PDKVPort = hp
		}
	default:
		return fmt.Errorf("kv_connector %q: the simulator models NixlConnector, MooncakeConnector and MoRIIOConnector only", connector)
	}
	if id, ok := obj["engine_id"].(string); ok && id != "" {
		f.cfg.PDEngineID = id
	}
	if p, ok := os.LookupEnv(portEnv); ok && p != "" && !f.explicit("pd-kv-port") {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%s %q: want a port", portEnv, p)
		}
		f.cfg.PDKVPort = n
	}
	return nil
}

// readKVRole decodes a --kv-transfer-config object and sets the sim's PD
// role from its kv_role, as vLLM and ATOM both spell it: kv_producer is
// prefill, kv_consumer decode, kv_both (or none) a mixed engine, which
// reports disaggregated false.
func readKVRole(f *facade, v string) (obj map[string]any, disaggregated bool, err error) {
	obj, err = engargs.DecodeObject(v)
	if err != nil {
		return nil, false, err
	}
	role, _ := obj["kv_role"].(string)
	switch role {
	case "", "kv_both":
		f.cfg.PDRole, f.cfg.PDProtocol = "", ""
		return obj, false, nil
	case "kv_producer":
		f.cfg.PDRole = "prefill"
	case "kv_consumer":
		f.cfg.PDRole = "decode"
	default:
		return nil, false, fmt.Errorf("kv_role %q: want kv_producer, kv_consumer or kv_both", role)
	}
	return obj, true, nil
}

// setATOMKVTransferConfig reads ATOM's --kv-transfer-config: kv_role as
// vLLM's, the mooncake connector (the default) is atom-mooncake, and a
// prefill's KV server listens on its handshake_port (6301 by default).
func setATOMKVTransferConfig(f *facade, v string) error {
	obj, disaggregated, err := readKVRole(f, v)
	if err != nil || !disaggregated {
		return err
	}
	if c, ok := obj["kv_connector"].(string); ok && c != "mooncake" {
		return fmt.Errorf("kv_connector %q: the simulator models ATOM's mooncake connector only", c)
	}
	f.cfg.PDProtocol = "atom-mooncake"
	if f.cfg.PDRole == "prefill" && !f.explicit("pd-kv-port") {
		f.cfg.PDKVPort = 6301
		if hp, ok := intValue(obj["handshake_port"]); ok {
			f.cfg.PDKVPort = hp
		}
	}
	return nil
}

// vllmMooncakeBootstrapPort is VLLM_MOONCAKE_BOOTSTRAP_PORT's default.
const vllmMooncakeBootstrapPort = 8998
