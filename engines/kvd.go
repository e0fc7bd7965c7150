package engines

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/kvd"
)

// The kvd connectors of the engines (kvd.md §8.7). Every engine gets the
// daemon's socket in INFERA_KVD_SOCKET, where the connectors (and the
// simulator's --kvd-socket) read it; vLLM loads its connector from
// --kv-transfer-config, SGLang its HiCache storage backend from
// --hicache-storage-backend dynamic.
const (
	// KVDSocketEnv is the variable the engines' kvd connectors connect to.
	KVDSocketEnv = "INFERA_KVD_SOCKET"

	vllmKVDConnector = "InferaKvdConnector"
	vllmKVDModule    = "infera.engine.vllm.kvd_connector"

	// The Python fleet's HiCache adapter, as its worker names it in the
	// dynamic backend's extra config; prefetch_threshold 64 tokens is its
	// value too (SGLang's own default, 256, skips most prefixes).
	sglangKVDBackend           = "infera-kvd"
	sglangKVDModule            = "infera.engine.sglang.kvd_adapter"
	sglangKVDClass             = "InferaKvdBackend"
	sglangKVDPrefetchThreshold = "64"
)

// PrepareLaunch is a.Prepare followed by the kvd wiring of
// Options.KVDSocket: what `infera worker` launches.
func PrepareLaunch(a Adapter, opts Options, args []string) (Launch, error) {
	l, err := a.Prepare(opts, args)
	if err != nil {
		return l, err
	}
	if err := wireKVD(a.Name(), opts.KVDSocket, &l); err != nil {
		return Launch{}, err
	}
	return l, nil
}

// wireKVD points the prepared launch of engine at the kvd daemon on
// socket (worker --kvd-socket): the environment for every engine, plus the
// engine's own connector flags where it has them. The user's settings are
// kept: keys they set are never changed, only missing ones are added; a
// connector of their own that is not kvd's is left alone with a warning.
func wireKVD(engine, socket string, l *Launch) error {
	if socket == "" {
		return nil
	}
	l.Command.Env = append(l.Command.Env, KVDSocketEnv+"="+socket)
	switch engine {
	case "vllm":
		return wireVLLMKVD(l)
	case "sglang":
		if l.Endpoint.DisaggMode == discovery.DisaggDecode {
			// SGLang forces a chunk cache on a PD decode leg, which its
			// hierarchical cache cannot sit on, and the prefill sends
			// that leg its KV anyway: kvd there would only be written.
			l.Warnings = append(l.Warnings, "--kvd-socket: not wiring SGLang's HiCache kvd backend on a PD decode engine (its KV comes from the prefill; kvd would only be written); "+KVDSocketEnv+" is set")
			return nil
		}
		return wireSGLangKVD(l)
	}
	return nil
}

// wireVLLMKVD adds vLLM's kvd connector to --kv-transfer-config.
func wireVLLMKVD(l *Launch) error {
	args := l.Command.Args
	head := 0
	if len(args) > 0 && args[0] == "serve" {
		head = 1
	}
	user := args[head:]
	cfg, err := parseJSONArg(user, "kv-transfer-config")
	if err != nil {
		return fmt.Errorf("--kvd-socket: cannot merge the kvd connector into the engine's --kv-transfer-config: %w", err)
	}
	connector, hasConnector := cfg.str("kv_connector")
	if cfg.has("kv_connector") && !hasConnector {
		return fmt.Errorf("%w: --kv-transfer-config kv_connector must be a string", ErrEngineArgs)
	}
	switch {
	case connector == "MultiConnector":
		children, _ := cfg.object("kv_connector_extra_config")["connectors"].([]any)
		for _, c := range children {
			if child, _ := c.(map[string]any); child != nil && child["kv_connector"] == vllmKVDConnector {
				return nil
			}
		}
		l.Warnings = append(l.Warnings, "--kvd-socket: --kv-transfer-config is a MultiConnector without "+vllmKVDConnector+
			"; add {\"kv_connector\":\""+vllmKVDConnector+"\",\"kv_role\":\"kv_both\",\"kv_connector_module_path\":\""+vllmKVDModule+
			"\"} to its connectors for vLLM to use kvd ("+KVDSocketEnv+" is set)")
		return nil
	case hasConnector && connector != vllmKVDConnector:
		l.Warnings = append(l.Warnings, fmt.Sprintf("--kvd-socket: --kv-transfer-config names kv_connector %q, left as it is: vLLM will not use kvd unless it is a MultiConnector holding %s (%s is set)",
			connector, vllmKVDConnector, KVDSocketEnv))
		return nil
	}
	var keys []jsonKey
	if !hasConnector {
		keys = append(keys, jsonKey{"kv_connector", jsonString(vllmKVDConnector)})
	}
	if !cfg.has("kv_role") {
		keys = append(keys, jsonKey{"kv_role", jsonString("kv_both")})
	}
	if !cfg.has("kv_connector_module_path") {
		keys = append(keys, jsonKey{"kv_connector_module_path", jsonString(vllmKVDModule)})
	}
	out, extra := cfg.add(user, keys)
	l.Command.Args = append(slices.Clone(args[:head]), appendArgs(out, extra...)...)
	return nil
}

// wireSGLangKVD turns on SGLang's hierarchical cache with kvd as its
// storage backend (loaded by SGLang's dynamic backend factory).
func wireSGLangKVD(l *Launch) error {
	args := l.Command.Args
	head := 0
	if len(args) >= 2 && args[0] == "-m" {
		head = 2
	}
	user := args[head:]
	backend, hasBackend, err := firstEngineFlag(user, "hicache-storage-backend")
	if err != nil {
		return err
	}
	if hasBackend && backend != "dynamic" {
		l.Warnings = append(l.Warnings, fmt.Sprintf("--kvd-socket: --hicache-storage-backend %q left as it is: SGLang will not use kvd (%s is set)", backend, KVDSocketEnv))
		return nil
	}
	cfg, err := parseJSONArg(user, "hicache-storage-backend-extra-config")
	if err != nil {
		return fmt.Errorf("--kvd-socket: cannot merge the kvd backend into the engine's --hicache-storage-backend-extra-config: %w", err)
	}
	if name, ok := cfg.str("backend_name"); ok && name != sglangKVDBackend {
		l.Warnings = append(l.Warnings, fmt.Sprintf("--kvd-socket: the dynamic HiCache backend is %q, left as it is: SGLang will not use kvd (%s is set)", name, KVDSocketEnv))
		return nil
	}
	var extra []string
	if !hasEngineFlag(user, "enable-hierarchical-cache") {
		extra = append(extra, "--enable-hierarchical-cache")
	}
	if !hasBackend {
		extra = append(extra, "--hicache-storage-backend", "dynamic")
	}
	var keys []jsonKey
	for _, k := range []jsonKey{{"backend_name", jsonString(sglangKVDBackend)}, {"module_path", jsonString(sglangKVDModule)},
		{"class_name", jsonString(sglangKVDClass)}, {"prefetch_threshold", sglangKVDPrefetchThreshold}} {
		if !cfg.has(k.key) {
			keys = append(keys, k)
		}
	}
	out, cfgExtra := cfg.add(user, keys)
	l.Command.Args = append(slices.Clone(args[:head]), appendArgs(out, append(extra, cfgExtra...)...)...)
	return nil
}

// kvdProbeTimeout bounds the start-up check of --kvd-socket.
const kvdProbeTimeout = 5 * time.Second

// ProbeKVD checks that the kvd daemon on socket answers a hello, so a
// worker refuses to start an engine (minutes of model loading) whose
// connector would find no daemon; the Python worker refuses the same way.
func ProbeKVD(ctx context.Context, socket string) error {
	ctx, cancel := context.WithTimeout(ctx, kvdProbeTimeout)
	defer cancel()
	c, err := kvd.Dial(ctx, socket, kvd.ClientOptions{ClientID: "infera-worker-probe", Timeout: kvdProbeTimeout})
	if err != nil {
		return fmt.Errorf("--kvd-socket %s: kvd does not answer (start infera kvd first, or drop --kvd-socket): %w", socket, err)
	}
	return c.Close()
}
