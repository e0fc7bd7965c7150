package config

import (
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// KV-event transports (--kv-event-transport).
const (
	KVEventTransportZMQ  = "zmq"
	KVEventTransportNATS = "nats"
)

// NATS is how a role reaches the fleet's NATS server. Credentials may
// also ride in the URL (nats://user:password@host:4222, nats://token@host).
type NATS struct {
	URL       string // --nats-server; empty: NATS_SERVER, else nats://127.0.0.1:4222
	CredsFile string // --nats-creds: JWT + seed .creds file
	NKeyFile  string // --nats-nkey: nkey seed file
	CAFile    string // --nats-ca: PEM CA bundle for tls:// servers
}

// Flags returns the NATS connection flags.
func (n *NATS) Flags() []cli.Flag {
	url := String("nats-server", "NATS server URL(s), comma-separated; user:password@ or token@ in the URL authenticate (used by --kv-event-transport nats and --request-transport nats)", &n.URL, "")
	url.EnvVars = append(url.EnvVars, "NATS_SERVER")
	url.DefaultText = "$NATS_SERVER, else nats://127.0.0.1:4222"
	return []cli.Flag{
		url,
		String("nats-creds", "NATS credentials file (JWT and nkey seed, .creds)", &n.CredsFile, ""),
		String("nats-nkey", "NATS nkey seed file", &n.NKeyFile, ""),
		String("nats-ca", "PEM CA bundle that verifies a tls:// NATS server", &n.CAFile, ""),
	}
}

// Validate checks the URL's shape; whether the server accepts us is
// checked by connecting at start-up.
func (n *NATS) Validate(p *Problems) {
	if n.URL == "" {
		return
	}
	for _, u := range strings.Split(n.URL, ",") {
		scheme, rest, ok := strings.Cut(strings.TrimSpace(u), "://")
		if !ok || rest == "" || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, scheme) {
			p.Addf("--nats-server: %q is no nats://, tls://, ws:// or wss:// URL", redactURL(u))
		}
	}
	if n.CredsFile != "" && n.NKeyFile != "" {
		p.Addf("--nats-creds and --nats-nkey are exclusive")
	}
}

// redactURL hides the credentials of a URL in a message.
func redactURL(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return u
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		return scheme + "://***@" + rest[at+1:]
	}
	return u
}

// kvEventTransportFlag declares --kv-event-transport.
func kvEventTransportFlag(dest *string) cli.Flag {
	return String("kv-event-transport", "how KV events travel from engines to routers: zmq (routers subscribe to each engine) or nats (workers relay to the INFERA_KV_EVENTS JetStream stream; router and every worker must agree)", dest, KVEventTransportZMQ)
}

func validateKVEventTransport(p *Problems, v string) {
	if v != KVEventTransportZMQ && v != KVEventTransportNATS {
		p.Addf("--kv-event-transport %q: want zmq or nats", v)
	}
}

// Request transports (--request-transport).
const (
	RequestTransportHTTP = "http"
	RequestTransportNATS = "nats"
)

// NATSRequests are the worker's requests-over-NATS settings, named and
// defaulted as the reference's (INFERA_NATS_REQ_*).
type NATSRequests struct {
	Transport   string        // --request-transport: http or nats
	IdleTimeout time.Duration // --nats-req-idle-timeout: reset per chunk; 0 = none
	MaxDuration time.Duration // --nats-req-max-duration: whole request; 0 = none
	MaxPending  int           // --nats-req-max-pending: > 0 = JetStream admission
}

// Flags returns the worker's request transport flags.
func (r *NATSRequests) Flags() []cli.Flag {
	return r.flags("how the router reaches this worker: http, or nats (the worker takes requests on infera.req.<token> and proxies them to its engine; the record says request_transport nats)",
		"so that routers refuse it once its backlog reaches this many (must match the routers')")
}

// ServeFlags returns the router's request transport flags: the same names,
// variables and defaults as the worker's.
func (r *NATSRequests) ServeFlags() []cli.Flag {
	return r.flags("how the router reaches workers: http, or nats (the router connects to --nats-server at start-up, a refusal is fatal, and sends requests over NATS to the workers whose record says request_transport nats; the others stay on HTTP)",
		"so that a worker whose backlog (its durable consumer's pending and unacknowledged requests, read at most every 200ms) reaches this many gets no more requests; when every candidate is full the client gets 429 with Retry-After: 1 (must match the workers')")
}

func (r *NATSRequests) flags(transport, pending string) []cli.Flag {
	return []cli.Flag{
		String("request-transport", transport, &r.Transport, RequestTransportHTTP),
		Duration("nats-req-idle-timeout", "requests over NATS: longest wait for the next bytes of an answer, reset per chunk (0 = none)", &r.IdleTimeout, 900*time.Second),
		Duration("nats-req-max-duration", "requests over NATS: longest whole request (0 = none)", &r.MaxDuration, 0),
		Int("nats-req-max-pending", "requests over NATS: > 0 sends them through the INFERA_REQUESTS JetStream work queue, one durable consumer per worker, "+pending, &r.MaxPending, 0),
	}
}

// Validate checks the request transport settings.
func (r *NATSRequests) Validate(p *Problems) {
	if r.Transport != RequestTransportHTTP && r.Transport != RequestTransportNATS {
		p.Addf("--request-transport %q: want http or nats", r.Transport)
	}
	if r.IdleTimeout < 0 || r.MaxDuration < 0 {
		p.Addf("--nats-req-idle-timeout and --nats-req-max-duration must not be negative")
	}
	if r.MaxPending < 0 {
		p.Addf("--nats-req-max-pending must not be negative")
	}
}
