package engines

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/infera/infera/kvcache"
)

// eventsTopic is the topic the worker gives the publishers it configures.
// Routers subscribe to every topic; a fixed one only makes captures readable.
const eventsTopic = "kv-events"

// zmqEndpoint is a tcp ZMQ endpoint as an engine's KV-event settings write
// it; other transports (ipc, inproc) cannot be reached from another host.
type zmqEndpoint struct {
	tcp  bool
	host string // "*" for every interface; IPv6 without brackets
	port int
}

func parseZMQ(flag, s string) (zmqEndpoint, error) {
	rest, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return zmqEndpoint{}, nil
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return zmqEndpoint{}, fmt.Errorf("%w: %s %q: want tcp://host:port", ErrEngineArgs, flag, clipArg(s))
	}
	host, portText := rest[:i], rest[i+1:]
	if h, ok := strings.CutPrefix(host, "["); ok {
		host = strings.TrimSuffix(h, "]")
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 || (host != "*" && !validHostName(host)) {
		return zmqEndpoint{}, fmt.Errorf("%w: %s %q: want tcp://host:port with a port 1-65535", ErrEngineArgs, flag, clipArg(s))
	}
	return zmqEndpoint{tcp: true, host: host, port: port}, nil
}

// pyBinds is the rule vLLM's and SGLang's publishers use to choose between
// binding the endpoint and connecting to it: bind when it contains "*" or
// "::". Only a bound publisher is something routers can subscribe to.
func pyBinds(s string) bool { return strings.Contains(s, "*") || strings.Contains(s, "::") }

// advertisedEvents is the endpoint routers subscribe to for a publisher the
// engine binds at zep, whose real port is zep.port + offset (engines add
// their data-parallel rank). A publisher on every interface or on the
// engine's own HTTP host is advertised under the worker's advertised host,
// as the HTTP endpoint is; one bound to another address under that address.
func advertisedEvents(flag string, zep zmqEndpoint, ep *Endpoint, offset int) (string, error) {
	port := zep.port + offset
	if port > 65535 {
		return "", fmt.Errorf("%w: %s port %d + data-parallel rank %d exceeds 65535", ErrEngineArgs, flag, zep.port, offset)
	}
	host := zep.host
	if isUnspecified(host) || host == ep.Host || host == "::" {
		host = ep.AdvertiseHost
	}
	return tcpEndpoint(host, port), nil
}

// eventsStyle says which engine's --kv-events-config conventions apply.
type eventsStyle int

const (
	// vllmStyle: vLLM (and ATOM when it takes the flag): events need
	// "enable_kv_cache_events": true and a "zmq" publisher.
	vllmStyle eventsStyle = iota
	// sglangStyle: SGLang: no enable key (it is refused by newer versions);
	// the publisher defaults to "null".
	sglangStyle
)

// eventsSpec is the data-parallel shape of an engine's publishers.
type eventsSpec struct {
	style eventsStyle
	// ranks is how many ranks publish from this engine, each on the
	// configured port + its rank (a rank-multiplexed worker); the worker
	// reserves that many consecutive ports.
	ranks int
	// offset is the rank one externally balanced engine publishes as; its
	// real port is the configured one + offset.
	offset int
}

// pyEvents sets up the KV-event publisher of a vLLM-family or SGLang engine
// through its --kv-events-config JSON: unless --no-kv-events, keys the user
// left out are added (a free port for the publisher and for its replay
// socket, bound on every interface as "tcp://*:PORT"), keys the user set are
// kept, and what results is advertised in ep. An explicitly disabled or
// non-zmq publisher is left alone and not advertised.
func pyEvents(opts Options, args []string, ep *Endpoint, spec eventsSpec) (out, extra, warnings []string, err error) {
	cfg, err := parseJSONArg(args, "kv-events-config")
	if err != nil {
		return nil, nil, nil, err
	}
	if opts.NoKVEvents {
		return args, nil, nil, nil
	}
	if pub, ok := cfg.Obj["publisher"]; ok {
		if s, _ := pub.(string); s != "zmq" {
			if s != "null" {
				warnings = append(warnings, fmt.Sprintf("--kv-events-config publisher %v is not zmq: KV events not advertised, routing to this worker is approximate", pub))
			}
			return args, nil, warnings, nil
		}
	}
	var keys []jsonKey
	if spec.style == vllmStyle {
		if cfg.isFalse("enable_kv_cache_events") {
			return args, nil, nil, nil
		}
		if !cfg.has("enable_kv_cache_events") {
			keys = append(keys, jsonKey{"enable_kv_cache_events", "true"})
		}
	}
	if !cfg.has("publisher") {
		keys = append(keys, jsonKey{"publisher", `"zmq"`})
	}
	if opts.KVEventsRouter != "" {
		for _, k := range []string{"endpoint", "replay_endpoint", "topic"} {
			if cfg.has(k) {
				return nil, nil, nil, fmt.Errorf("%w: --kv-events-config %s and --kv-events-router both set the publisher", ErrEngineArgs, k)
			}
		}
		if spec.ranks > 1 || spec.offset > 0 {
			return nil, nil, nil, fmt.Errorf("%w: --kv-events-router supports engines with one data-parallel rank", ErrEngineArgs)
		}
		out, extra = cfg.add(args, append(keys, routerPyKeys(opts, ep)...))
		return out, extra, warnings, nil
	}

	ranks := max(spec.ranks, 1)
	socket := func(key string, optional bool) (string, error) {
		flag := "--kv-events-config " + key
		v, set := cfg.Obj[key]
		if !set {
			base, err := opts.freePorts("0.0.0.0", ranks)
			if err != nil {
				return "", err
			}
			// The engine adds its rank to the configured port, so the
			// configured port is chosen for the real one to be the free one.
			conf := base - spec.offset
			if conf < 1 {
				return "", fmt.Errorf("%w: free port %d is below data-parallel rank %d", ErrEngineArgs, base, spec.offset)
			}
			keys = append(keys, jsonKey{key, jsonString("tcp://*:" + strconv.Itoa(conf))})
			return tcpEndpoint(ep.AdvertiseHost, base), nil
		}
		if v == nil && optional {
			return "", nil // replay explicitly off
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("%w: %s: want a string", ErrEngineArgs, flag)
		}
		zep, err := parseZMQ(flag, s)
		if err != nil {
			return "", err
		}
		switch {
		case !zep.tcp:
			warnings = append(warnings, fmt.Sprintf("%s %q is not tcp: other hosts cannot subscribe, not advertised", flag, s))
			return "", nil
		case !pyBinds(s):
			warnings = append(warnings, fmt.Sprintf("%s %q names no wildcard host, so the engine connects to it instead of binding it: not advertised (use tcp://*:PORT)", flag, s))
			return "", nil
		}
		return advertisedEvents(flag, zep, ep, spec.offset)
	}
	if ep.KVEvents, err = socket("endpoint", false); err != nil {
		return nil, nil, nil, err
	}
	if ep.KVEvents != "" {
		if ep.KVEventsReplay, err = socket("replay_endpoint", true); err != nil {
			return nil, nil, nil, err
		}
	}
	if !cfg.has("topic") {
		keys = append(keys, jsonKey{"topic", jsonString(eventsTopic)})
	}
	if ep.KVEvents == "" {
		// Nothing routers could use: leave the user's settings as they were.
		return args, nil, warnings, nil
	}
	out, extra = cfg.add(args, keys)
	return out, extra, warnings, nil
}

// Connect-only publishing (worker --kv-events-router, router
// --kv-events-listen): the engine's publisher connects to the router's SUB
// listener instead of binding a port, and publishes under the topic
// kvcache.WorkerTopic(worker id), the only thing that tells the listener
// whose events they are. Nothing is advertised: the router follows every
// worker without an event endpoint on its listener. vLLM's publisher
// connects when its endpoint names no wildcard host ("tcp://router:5557");
// the sim does with --kv-events-connect. No replay socket is configured
// (the router joins at the first batch it sees and rebuilds).

// routerTopic is the topic of the worker whose endpoint is ep.
func routerTopic(ep *Endpoint) string {
	return kvcache.WorkerTopic(net.JoinHostPort(ep.AdvertiseHost, strconv.Itoa(ep.Port)))
}

// routerSimEvents points the sim's publisher at the router's listener.
func routerSimEvents(opts Options, flags map[string]string, ep *Endpoint) (args, warnings []string, err error) {
	for _, f := range []string{"kv-events-endpoint", "kv-events-replay-endpoint", "kv-events-topic"} {
		if _, given := flags[f]; given {
			return nil, nil, fmt.Errorf("%w: --%s and --kv-events-router both set the sim's publisher", ErrEngineArgs, f)
		}
	}
	return []string{"--kv-events-endpoint", opts.KVEventsRouter, "--kv-events-connect", "--kv-events-topic", routerTopic(ep)}, nil, nil
}

// routerPyKeys are the --kv-events-config keys that make a vLLM-family or
// SGLang publisher connect to the router's listener.
func routerPyKeys(opts Options, ep *Endpoint) []jsonKey {
	return []jsonKey{
		{"endpoint", jsonString(opts.KVEventsRouter)},
		{"topic", jsonString(routerTopic(ep))},
	}
}
