package engines

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/infera/infera/discovery"
)

// Engine defaults of the disaggregation side channels.
const (
	vllmMooncakeBootstrapPort = 8998 // VLLM_MOONCAKE_BOOTSTRAP_PORT's default
	sglangBootstrapPort       = 8998 // --disaggregation-bootstrap-port's default
	sglangTransferBackend     = "mooncake"
	atomHandshakePort         = 6301 // ATOM's mooncake connector side channel
)

// roleOf maps a kv_role to the record's disaggregation mode; ok is false for
// a role the worker does not know.
func roleOf(role string) (discovery.DisaggMode, bool) {
	switch role {
	case "", "kv_both":
		return discovery.DisaggMixed, true
	case "kv_producer":
		return discovery.DisaggPrefill, true
	case "kv_consumer":
		return discovery.DisaggDecode, true
	}
	return discovery.DisaggMixed, false
}

// vllmConnectors maps vLLM kv_connector names to PD protocols; MoRIIO is
// resolved by its mode.
var vllmConnectors = map[string]string{
	"MooncakeConnector": discovery.ProtocolVLLMMooncake,
	"NixlConnector":     discovery.ProtocolVLLMNixl,
	"MoRIIOConnector":   discovery.ProtocolVLLMMoriWrite,
}

// vllmDisagg reads vLLM's --kv-transfer-config into ep's disaggregation
// role and protocol parameters. A prefill or decode engine without an
// engine_id gets one: vLLM would make up a random one the worker could not
// advertise, and the Mooncake decode leg must name the prefill's.
func vllmDisagg(opts Options, args []string, ep *Endpoint) (out, extra, warnings []string, err error) {
	cfg, err := parseJSONArg(args, "kv-transfer-config")
	if err != nil || !cfg.Present {
		return args, nil, nil, err
	}
	role, _ := cfg.str("kv_role")
	mode, known := roleOf(role)
	ep.DisaggMode = mode
	if !known {
		warnings = append(warnings, fmt.Sprintf("--kv-transfer-config kv_role %q is unknown: registering as mixed", role))
	}
	if mode == discovery.DisaggMixed {
		return args, nil, warnings, nil
	}
	connector, _ := cfg.str("kv_connector")
	extraCfg := cfg.object("kv_connector_extra_config")
	if connector == "MultiConnector" {
		// The transfer connector is one of several (e.g. an offload cache
		// plus an RDMA transport); its settings are nested with it.
		connector, extraCfg = "", nil
		children, _ := cfg.object("kv_connector_extra_config")["connectors"].([]any)
		for _, c := range children {
			child, _ := c.(map[string]any)
			name, _ := child["kv_connector"].(string)
			if _, ok := vllmConnectors[name]; ok {
				connector = name
				extraCfg, _ = child["kv_connector_extra_config"].(map[string]any)
				break
			}
		}
	}
	protocol, ok := vllmConnectors[connector]
	if !ok {
		warnings = append(warnings, fmt.Sprintf("--kv-transfer-config kv_connector %q has no PD protocol here (known: MooncakeConnector, NixlConnector, MoRIIOConnector): registered as %s without one, the router cannot pair it", connector, mode))
		return args, nil, warnings, nil
	}
	if connector == "MoRIIOConnector" && moriReadMode(opts, extraCfg) {
		protocol = discovery.ProtocolVLLMMoriRead
	}

	params := map[string]any{"kv_connector": connector}
	engineID, hasID := cfg.str("engine_id")
	if !hasID || engineID == "" {
		engineID = "infera-" + opts.randomID()
		out, extra = cfg.add(args, []jsonKey{{"engine_id", jsonString(engineID)}})
	} else {
		out = args
	}
	params["engine_id"] = engineID
	for _, k := range []string{"kv_ip", "kv_port"} {
		if v, ok := cfg.Obj[k]; ok && v != nil {
			params[k] = v
		}
	}
	if len(extraCfg) > 0 {
		params["kv_connector_extra_config"] = extraCfg
	}
	if protocol == discovery.ProtocolVLLMMooncake {
		port := vllmMooncakeBootstrapPort
		if v, ok := opts.lookupEnv("VLLM_MOONCAKE_BOOTSTRAP_PORT"); ok && v != "" {
			if port, err = parsePort("VLLM_MOONCAKE_BOOTSTRAP_PORT", v); err != nil || port == 0 {
				return nil, nil, nil, fmt.Errorf("%w: VLLM_MOONCAKE_BOOTSTRAP_PORT %q: want a port 1-65535", ErrEngineArgs, v)
			}
		}
		// The address vLLM's Mooncake proxy queries (GET <addr>/query) for
		// the prefill's engine ids.
		params["bootstrap_addr"] = "http://" + hostPort(ep.AdvertiseHost, port)
		params["bootstrap_port"] = port
	}
	ep.DisaggMeta = discovery.DisaggMeta{Protocol: protocol, Params: params}
	return out, extra, warnings, nil
}

// moriReadMode is the MoRIIO connector's mode: kv_connector_extra_config
// "read_mode" in current vLLM, VLLM_MORIIO_CONNECTOR_READ_MODE in older
// ones; write is the default.
func moriReadMode(opts Options, extraCfg map[string]any) bool {
	if v, ok := extraCfg["read_mode"]; ok {
		return isTrueValue(v)
	}
	v, _ := opts.lookupEnv("VLLM_MORIIO_CONNECTOR_READ_MODE")
	return isTrueValue(v)
}

// atomDisagg reads ATOM's --kv-transfer-config. ATOM's PD path through the
// router is its Mooncake connector; the parameters are what the
// atom-mooncake protocol needs to replay ATOM's proxy hand-off.
func atomDisagg(args []string, ep *Endpoint, tpSize int) (warnings []string, err error) {
	cfg, err := parseJSONArg(args, "kv-transfer-config")
	if err != nil || !cfg.Present {
		return nil, err
	}
	role, _ := cfg.str("kv_role")
	mode, known := roleOf(role)
	ep.DisaggMode = mode
	if !known {
		warnings = append(warnings, fmt.Sprintf("--kv-transfer-config kv_role %q is unknown: registering as mixed", role))
	}
	if mode == discovery.DisaggMixed {
		return warnings, nil
	}
	connector := "mooncake"
	if s, ok := cfg.str("kv_connector"); ok {
		connector = s
	}
	if connector != "mooncake" {
		warnings = append(warnings, fmt.Sprintf("--kv-transfer-config kv_connector %q: only ATOM's mooncake connector has a PD protocol here; registered as %s without one", connector, mode))
		return warnings, nil
	}
	handshake, err := jsonInt(cfg.Obj, "handshake_port", atomHandshakePort)
	if err != nil {
		return nil, err
	}
	dp, err := jsonInt(cfg.Obj, "dp_size", 1)
	if err != nil {
		return nil, err
	}
	ep.DisaggMeta = discovery.DisaggMeta{Protocol: discovery.ProtocolATOMMooncake, Params: map[string]any{
		"host":           ep.AdvertiseHost,
		"http_port":      ep.Port,
		"handshake_port": handshake,
		"tp_size":        tpSize,
		"dp_size":        max(dp, 1),
	}}
	return warnings, nil
}

// jsonInt reads an integer key of a JSON object (a number or a numeric
// string); absent or null gives def.
func jsonInt(obj map[string]any, key string, def int) (int, error) {
	v, ok := obj[key]
	if !ok || v == nil {
		return def, nil
	}
	var s string
	switch v := v.(type) {
	case json.Number:
		s = v.String()
	case string:
		s = v
	default:
		return 0, fmt.Errorf("%w: --kv-transfer-config %s: want an integer", ErrEngineArgs, key)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 65535 {
		return 0, fmt.Errorf("%w: --kv-transfer-config %s %q: want an integer 0-65535", ErrEngineArgs, key, s)
	}
	return n, nil
}

// sglangDisagg reads SGLang's --disaggregation-* flags.
func sglangDisagg(flags map[string]string, ep *Endpoint) error {
	mode := flags["disaggregation-mode"]
	switch mode {
	case "", "null":
		ep.DisaggMode = discovery.DisaggMixed
		return nil
	case "prefill":
		ep.DisaggMode = discovery.DisaggPrefill
	case "decode":
		ep.DisaggMode = discovery.DisaggDecode
	default:
		return fmt.Errorf("%w: --disaggregation-mode %q: want null, prefill or decode", ErrEngineArgs, mode)
	}
	backend := sglangTransferBackend
	if v, ok := flags["disaggregation-transfer-backend"]; ok && v != "" {
		backend = v
	}
	params := map[string]any{"transfer_backend": backend}
	if ep.DisaggMode == discovery.DisaggPrefill {
		// Only the prefill side serves the bootstrap; the router gives its
		// address to both legs.
		port := sglangBootstrapPort
		if v, ok := flags["disaggregation-bootstrap-port"]; ok {
			n, err := parsePort("--disaggregation-bootstrap-port", v)
			if err != nil || n == 0 {
				return fmt.Errorf("%w: --disaggregation-bootstrap-port %q: want a port 1-65535", ErrEngineArgs, v)
			}
			port = n
		}
		params["bootstrap_host"] = ep.AdvertiseHost
		params["bootstrap_port"] = port
		// Infera's own key for the same address, so its routers pair ours.
		params["bootstrap_addr"] = hostPort(ep.AdvertiseHost, port)
	}
	ep.DisaggMeta = discovery.DisaggMeta{Protocol: discovery.ProtocolSGLangBootstrap, Params: params}
	return nil
}
