package config

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// Serve configures `infera serve`, the router in front of the fleet.
type Serve struct {
	Log  Log
	Etcd Etcd
	Kube Kube

	// Listen is the host:port of the OpenAI endpoint (port 0 picks one).
	Listen string
	// RouterPolicy names the routing policy (see KnownPolicies).
	RouterPolicy string
	// RouterMode is auto (the router picks) or direct (a Gateway API
	// Inference Extension endpoint picker names the worker in a header).
	RouterMode string
	// MaxBodyBytes bounds a request body; larger bodies get 413.
	MaxBodyBytes int
	// ClientReadTimeout bounds reading one request (headers and body) from a
	// client; ClientIdleTimeout bounds a keep-alive connection between
	// requests.
	ClientReadTimeout time.Duration
	ClientIdleTimeout time.Duration
	// UpstreamConnectTimeout bounds dialing a worker and waiting for a free
	// connection to it.
	UpstreamConnectTimeout time.Duration
	// UpstreamTimeout is the longest wait for the next byte from a worker:
	// its response headers, or the next chunk of a stream.
	UpstreamTimeout time.Duration
	// UpstreamIdleConnTimeout closes pooled worker connections idle this
	// long; it must stay below the engines' own keep-alive timeout (uvicorn:
	// 5s) so that a request never lands on a connection the engine closed.
	UpstreamIdleConnTimeout time.Duration
	// MaxConnsPerWorker bounds concurrent connections (= in-flight requests)
	// to one worker.
	MaxConnsPerWorker int
	// ShutdownTimeout bounds the wait for in-flight requests on shutdown;
	// streams still running then are cut.
	ShutdownTimeout time.Duration

	// Resilience (issue 5).
	//
	// RequestMaxRetries is how many other workers a request may be retried
	// on while nothing of its answer has reached the client.
	RequestMaxRetries int
	// MigrationLimit is how many times a stream that breaks after its
	// first event may be continued on another worker (0: never).
	MigrationLimit int
	// BreakerFailureThreshold consecutive faults open a worker's breaker
	// for BreakerCooldown, doubled on each re-trip up to
	// BreakerMaxCooldown.
	BreakerFailureThreshold int
	BreakerCooldown         time.Duration
	BreakerMaxCooldown      time.Duration
	// MaxInflightPerWorker caps requests in flight per worker (0: no cap);
	// when every candidate is full a request queues up to QueueTimeout.
	MaxInflightPerWorker int
	QueueTimeout         time.Duration
	// TTFTTimeout bounds the wait for a worker's first byte (for a stream
	// its first event; for a unary request its whole answer);
	// StreamIdleTimeout the silence between stream events; RequestTimeout
	// a whole request.
	TTFTTimeout       time.Duration
	StreamIdleTimeout time.Duration
	RequestTimeout    time.Duration
	// PDPrefillTimeout bounds the prefill leg of a disaggregated request;
	// PDMinUncachedTokens sends a request with fewer uncached prompt
	// tokens to its decode worker alone (0: always disaggregate).
	PDPrefillTimeout    time.Duration
	PDMinUncachedTokens int
	// HeartbeatInterval is the SSE comment cadence on a silent stream.
	HeartbeatInterval time.Duration

	// Stalled engines and absurd requests (issue 12).
	//
	// StallWindow: a worker with requests in flight that produced no byte
	// of an answer for this long is suspected stalled and probed; while it
	// stays stalled it gets no new request, and streams waiting there for
	// their first event move to other workers (0: no stall detection).
	// StallProbeInterval is the cadence of the probes (GET /health) that
	// confirm a stall or bring the worker back.
	StallWindow        time.Duration
	StallProbeInterval time.Duration
	// MaxTokensCeiling: a request asking for more completion tokens than
	// this is refused with 400 before it reaches an engine (0: no ceiling).
	MaxTokensCeiling int64

	// Security.
	//
	// APIKeysFile holds one client API key per line (# comments); APIKeys
	// adds keys from --api-keys / INFERA_API_KEYS. No keys: no auth.
	APIKeysFile string
	APIKeys     []string
	// AdminListen serves the admin and fleet endpoints on their own address
	// (then not on Listen); AdminToken is the Bearer token they require.
	AdminListen string
	AdminToken  string
	// EnableProfiling serves Go's pprof endpoints (/debug/pprof/*) on
	// AdminListen, behind AdminToken when set; it needs AdminListen.
	EnableProfiling bool
	// TokenizerCanaryCheck rejects a worker whose record's kv block carries
	// a tokenizer_canary other than the first of its model's (the
	// reference's rule; discovery.CanaryCheck).
	TokenizerCanaryCheck bool
	// MaxHeaderBytes bounds a request's headers (431 beyond).
	MaxHeaderBytes int
	// ClientWriteTimeout bounds one write to a client (a stalled reader).
	ClientWriteTimeout time.Duration
	// MaxConnections caps concurrent client connections.
	MaxConnections int
	// ClientHeaderTimeout bounds the wait for a request's headers (from
	// the connection's opening, or the request's first byte on a
	// keep-alive connection); ClientReadTimeout then bounds its body.
	ClientHeaderTimeout time.Duration
	// MaxConnectionsPerIP caps concurrent connections from one client
	// address (0: no cap).
	MaxConnectionsPerIP int
	// FrontDoor is how client connections are served: "goroutine" (one
	// goroutine per connection, fasthttp's server) or "loop" (epoll event
	// loops; router.ServeLoop).
	FrontDoor string
	// BodyBudgetBytes bounds the bytes of large request bodies being read
	// or held at once, all clients together.
	BodyBudgetBytes int64
	// OutageGrace holds the removals an etcd re-list (after a watch
	// outage) reports, so workers can re-register first.
	OutageGrace time.Duration
	// LogPrompts allows request bodies in debug logs.
	LogPrompts bool
	// OTLPTracesEndpoint is the OTLP/gRPC receiver of OpenTelemetry
	// traces (http://HOST:PORT); "" turns tracing off.
	OTLPTracesEndpoint string
	// OTLPTracesSampleRatio is the share of new traces recorded.
	OTLPTracesSampleRatio float64
	// KVDSocket is the Unix socket of infera kvd; it enables POST
	// /v1/cache/prewarm, forwarded as prefetch hints (empty: 503).
	KVDSocket string

	keys []string // APIKeysFile and APIKeys, read by Validate

	// EmbeddedEtcdListen and EmbeddedEtcdDir configure the single-node etcd
	// started when no --etcd-endpoints are given.
	EmbeddedEtcdListen string
	EmbeddedEtcdDir    string

	// KV is the kv-aware policy's configuration.
	KV ServeKV
	// Requests: --request-transport and the nats-req-* settings (the
	// server is KV.NATS's).
	Requests NATSRequests

	// Infera's --host/--port, folded into Listen by Finish.
	inferaHost string
	inferaPort int

	// KnownPolicies, when set (by main, from the policy registry), is the
	// set RouterPolicy must belong to. It is not a flag.
	KnownPolicies []string
}

// Tokenizer modes of --tokenizer besides a directory.
const (
	TokenizerBytes  = "bytes"
	TokenizerEngine = "engine"
)

// ServeKV configures the kv-aware routing policy (DESIGN §5).
type ServeKV struct {
	// Tokenizer is "" (none: approximate routing on text), "bytes",
	// "engine" (each request's worker tokenizes it via POST /tokenize) or a
	// Hugging Face tokenizer directory.
	Tokenizer string
	// EngineTokenizeTimeout bounds one POST /tokenize in engine mode.
	EngineTokenizeTimeout time.Duration
	// OverlapWeight is w in w×(blocks−hits) + active_blocks + recent; the
	// prefill and decode weights apply to the legs of disaggregated
	// serving and default to OverlapWeight.
	OverlapWeight        float64
	PrefillOverlapWeight float64
	DecodeOverlapWeight  float64
	// BlockSize hashes workers whose record has no kv_block_size.
	BlockSize int
	// IndexMaxBlocks bounds the KV-event prefix index (all workers).
	IndexMaxBlocks int
	// ApproxTTL and ApproxMaxBlocks bound the router's own placement
	// records (per worker and DP rank) used in approximate mode.
	ApproxTTL       time.Duration
	ApproxMaxBlocks int
	// RecentDecay is the half-life of the recent-miss charge (0: no
	// charge); RecentWeight its charge per missed block.
	RecentDecay  time.Duration
	RecentWeight float64
	// MaxShare bounds each worker's recent share of requests to
	// MaxShare × fair (0: no bound).
	MaxShare float64
	// MaxShareWarm is the same bound for warm requests (0: none).
	MaxShareWarm float64
	// Cost is the kv-aware cost mode: "blocks" or "ttft".
	Cost string
	// ProvisionalTTL and ProvisionalMaxBlocks bound the provisional hits
	// of precisely routed workers (0 disables them).
	ProvisionalTTL       time.Duration
	ProvisionalMaxBlocks int
	// CoalesceWait is the longest a request waits for another request in
	// flight on its worker that is prefilling its prefix (0: never).
	CoalesceWait time.Duration
	// DivergenceCheck turns the kv divergence alarm on (router/kvdivergence.go).
	DivergenceCheck bool
	// RebuildAfter: a worker whose event stream joined a running engine
	// or resynced is precise again this long after (0: only on
	// AllBlocksCleared).
	RebuildAfter time.Duration
	// EventsListen is --kv-events-listen: a tcp://HOST:PORT SUB socket the
	// router binds for engines whose publishers connect (worker
	// --kv-events-router); empty = none.
	EventsListen string
	// EventTransport is --kv-event-transport: zmq or nats.
	EventTransport string
	// NATS reaches the NATS server (--kv-event-transport nats).
	NATS NATS
	// PeerHints (--kvd-peer-hints) directs kvd-to-kvd pulls: a request
	// sent to a worker whose host's kvd lacks a prefix another host's kvd
	// holds is preceded by a hint to the first to pull it from the second
	// (records' kvd_peer), waited for at most PeerWait; PeerSecret is the
	// kvds' --peer-secret.
	PeerHints  bool
	PeerSecret string
	PeerWait   time.Duration
	// KVDPrefix (--etcd-kvd-prefix) is the kvd registry the router reads,
	// with --kvd-peer-hints and the etcd backend, to name each worker's
	// host's kvd.
	KVDPrefix string
}

// defaultOverlapWeight is the default of --kv-overlap-weight, and so of the
// per-role weights, which follow it unless set (see Finish).
const defaultOverlapWeight = 4

func (k *ServeKV) flags() []cli.Flag {
	prefill := Float("kv-prefill-overlap-weight", "overlap weight of prefill workers (disaggregated serving)", &k.PrefillOverlapWeight, defaultOverlapWeight)
	prefill.DefaultText = "same as --kv-overlap-weight"
	decode := Float("kv-decode-overlap-weight", "overlap weight of decode workers (disaggregated serving)", &k.DecodeOverlapWeight, defaultOverlapWeight)
	decode.DefaultText = "same as --kv-overlap-weight"
	return append([]cli.Flag{
		String("tokenizer", "kv-aware tokenization: a Hugging Face tokenizer directory, \"bytes\", \"engine\" (ask the worker's /tokenize), or empty for approximate routing on text", &k.Tokenizer, ""),
		Duration("tokenizer-engine-timeout", "longest POST /tokenize in --tokenizer engine mode (then the request is routed on its text)", &k.EngineTokenizeTimeout, 2*time.Second),
		Float("kv-overlap-weight", "kv-aware cost weight of one uncached prompt block against one block of load", &k.OverlapWeight, defaultOverlapWeight),
		prefill,
		decode,
		Int("kv-block-size", "block size hashed for workers whose record has no kv_block_size", &k.BlockSize, 16),
		Int("kv-index-max-blocks", "most (worker, block) entries in the KV-event prefix index; the worker holding most loses its least recent", &k.IndexMaxBlocks, 4<<20),
		Duration("kv-approx-ttl", "approximate mode: how long a prompt block the router sent to a worker counts as cached there", &k.ApproxTTL, 10*time.Minute),
		Int("kv-approx-max-blocks", "approximate mode: most recorded prompt blocks per worker (and DP rank)", &k.ApproxMaxBlocks, 256<<10),
		Duration("kv-recent-decay", "half-life of the recent-miss charge that spreads serial traffic (0 disables it)", &k.RecentDecay, 2*time.Second),
		Float("kv-recent-weight", "recent-miss charge per prompt block a finished request had to prefill", &k.RecentWeight, 0.5),
		Float("kv-max-share", "kv-aware: a cold request (no worker holds a quarter of it) skips workers that recently got more than this many times their fair share of requests (0: no bound)", &k.MaxShare, 1.1),
		Float("kv-max-share-warm", "kv-aware: the same bound for warm requests (a worker holds a quarter of the prompt): they skip workers that recently got more than this many times their fair share (0: no bound; looser than --kv-max-share, so that a conversation or a hot prefix leaves its worker only when that worker is clearly busier)", &k.MaxShareWarm, 1.15),
		String("kv-cost", "kv-aware cost: \"ttft\" (the default: an estimated time to first token from each worker's queued prefill and decode load, learned from the first tokens it returns; cold requests spread evenly) or \"blocks\" (uncached blocks weighed against load, with the --kv-max-share bounds)", &k.Cost, "ttft"),
		Duration("kv-provisional-ttl", "how long a prompt the router just placed on a precisely routed worker counts as cached there before its KV events land (0 disables provisional hits)", &k.ProvisionalTTL, 2*time.Second),
		Int("kv-provisional-max-blocks", "most provisional blocks per worker (and DP rank)", &k.ProvisionalMaxBlocks, 16384),
		Duration("kv-coalesce-wait", "kv-aware --kv-cost ttft: a request whose prompt prefix another request on the same worker is still prefilling is held until that request's first token (the prefix is then cached whole, and is not prefilled a second time beside it), until its estimated first token, or this long at most (0: send it at once)", &k.CoalesceWait, time.Second),
		Bool("kv-divergence-check", "compare each worker's engine-reported usage (prompt_tokens, cached_tokens) with the kv-aware prediction and warn once when they diverge (a tokenizer or chat-template mismatch); =false turns the alarm off", &k.DivergenceCheck, true),
		Duration("kv-rebuild-after", "after a KV-event stream joined a running engine or resynced, route the worker precisely again this long later (0: only once its engine clears its cache)", &k.RebuildAfter, 5*time.Second),
		String("kv-events-listen", "bind one ZMQ SUB socket, tcp://HOST:PORT, that workers' engines connect to and publish KV events on (worker --kv-events-router); empty = subscribe to each worker's own endpoint only", &k.EventsListen, ""),
		kvEventTransportFlag(&k.EventTransport),
		Bool("kvd-peer-hints", "kv-aware: before sending a request to a worker whose host's kvd lacks a prefix that a worker on another host holds, have that kvd pull the blocks from the other host's kvd (each host's kvd is the one registered in the kvd registry for the host of the worker's id, kvd --etcd-endpoints; else the one its record names, worker --kvd-peer)", &k.PeerHints, false),
		KVDPrefixFlag(&k.KVDPrefix),
		String("kvd-peer-secret", "the kvds' --peer-secret, carried by every prefetch hint the router sends (--kvd-peer-hints)", &k.PeerSecret, ""),
		Duration("kvd-peer-wait", "longest wait for a directed pull before the request goes on to the engine (which computes what has not arrived); at most 5s", &k.PeerWait, 100*time.Millisecond),
	}, k.NATS.Flags()...)
}

func (k *ServeKV) finish(c *cli.Context) {
	k.KVDPrefix = withSlash(k.KVDPrefix)
	if !c.IsSet("kv-prefill-overlap-weight") {
		k.PrefillOverlapWeight = k.OverlapWeight
	}
	if !c.IsSet("kv-decode-overlap-weight") {
		k.DecodeOverlapWeight = k.OverlapWeight
	}
}

func (k *ServeKV) validate(p *Problems) {
	if !strings.HasPrefix(k.KVDPrefix, "/") {
		p.Addf("--etcd-kvd-prefix %q: must start with /", k.KVDPrefix)
	}
	if k.PeerWait < 0 || k.PeerWait > 5*time.Second {
		p.Addf("--kvd-peer-wait %v: want 0 to 5s", k.PeerWait)
	}
	switch k.Tokenizer {
	case "", TokenizerBytes, TokenizerEngine:
	default:
		if st, err := os.Stat(filepath.Join(k.Tokenizer, "tokenizer.json")); err != nil || !st.Mode().IsRegular() {
			p.Addf("--tokenizer %q: want bytes, engine, or a directory holding tokenizer.json", k.Tokenizer)
		}
	}
	if k.EngineTokenizeTimeout <= 0 {
		p.Addf("--tokenizer-engine-timeout must be positive")
	}
	for _, w := range []struct {
		name string
		v    float64
	}{
		{"--kv-overlap-weight", k.OverlapWeight},
		{"--kv-prefill-overlap-weight", k.PrefillOverlapWeight},
		{"--kv-decode-overlap-weight", k.DecodeOverlapWeight},
		{"--kv-recent-weight", k.RecentWeight},
	} {
		if !(w.v >= 0 && w.v <= 1e6) { // also rejects NaN
			p.Addf("%s must be from 0 to 1e6", w.name)
		}
	}
	if k.BlockSize < 1 || k.BlockSize > 1<<16 {
		p.Addf("--kv-block-size must be from 1 to 65536")
	}
	if k.IndexMaxBlocks < 1 {
		p.Addf("--kv-index-max-blocks must be positive")
	}
	if k.ApproxMaxBlocks < 1 {
		p.Addf("--kv-approx-max-blocks must be positive")
	}
	if k.ApproxTTL <= 0 {
		p.Addf("--kv-approx-ttl must be positive")
	}
	if k.RecentDecay < 0 {
		p.Addf("--kv-recent-decay must not be negative")
	}
	if k.ProvisionalTTL < 0 || k.ProvisionalMaxBlocks < 0 {
		p.Addf("--kv-provisional-ttl and --kv-provisional-max-blocks must not be negative")
	}
	if k.CoalesceWait < 0 || k.CoalesceWait > 30*time.Second {
		p.Addf("--kv-coalesce-wait %v: want 0 (off) to 30s", k.CoalesceWait)
	}
	if k.MaxShare != 0 && !(k.MaxShare >= 1 && k.MaxShare <= 1e6) {
		p.Addf("--kv-max-share must be 0 (off) or from 1 to 1e6")
	}
	if k.MaxShareWarm != 0 && !(k.MaxShareWarm >= 1 && k.MaxShareWarm <= 1e6) {
		p.Addf("--kv-max-share-warm must be 0 (off) or from 1 to 1e6")
	}
	if k.RebuildAfter < 0 {
		p.Addf("--kv-rebuild-after must not be negative")
	}
	validateKVEventTransport(p, k.EventTransport)
	k.NATS.Validate(p)
	if k.Cost != "blocks" && k.Cost != "ttft" {
		p.Addf("--kv-cost must be blocks or ttft")
	}
	if k.EventsListen != "" {
		simEndpoint(p, "--kv-events-listen", k.EventsListen)
	}
}

// DefaultStateDir returns where Infera keeps local state:
// $XDG_STATE_HOME/infera, else ~/.local/state/infera, else a directory under
// the system temporary directory.
func DefaultStateDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "infera")
	}
	if home, err := os.UserHomeDir(); err == nil && home != "" {
		return filepath.Join(home, ".local", "state", "infera")
	}
	return filepath.Join(os.TempDir(), "infera-state")
}

// DefaultServe returns the serve configuration with every flag at its
// default: the one place the router's and the kv-aware policy's defaults
// are declared (router.DefaultConfig and router.DefaultKVAwareConfig map
// it).
func DefaultServe() Serve {
	var s Serve
	s.Flags()
	return s
}

// Flags returns the serve flags, binding each to its field.
func (s *Serve) Flags() []cli.Flag {
	flags := append(s.Log.Flags(), s.Etcd.Flags()...)
	flags = append(flags, s.Kube.Flags(true)...)
	return withInferaAliases(append(append(flags,
		String("listen", "host:port of the OpenAI endpoint (port 0 picks a free port; the bound address is logged)", &s.Listen, "0.0.0.0:8000"),
		String("router-policy", "routing policy: round-robin, least-load or kv-aware", &s.RouterPolicy, "round-robin"),
		String("router-mode", "auto (the router picks) or direct (an endpoint picker names the worker in X-Worker-Instance-Id, and the prefill worker of a PD pair in X-Prefill-Instance-Id: that worker or pair serves the request, no failover; requests without the header are routed as in auto)", &s.RouterMode, "auto"),
		Int("max-body-bytes", "largest request body accepted; larger ones get 413", &s.MaxBodyBytes, 32<<20),
		Duration("client-read-timeout", "longest time to read one request from a client", &s.ClientReadTimeout, 60*time.Second),
		Duration("client-idle-timeout", "longest time a client keep-alive connection may sit idle", &s.ClientIdleTimeout, 120*time.Second),
		Duration("upstream-connect-timeout", "longest time to connect to a worker (or wait for a free connection to it)", &s.UpstreamConnectTimeout, 3*time.Second),
		Duration("upstream-timeout", "longest wait for the next byte from a worker: response headers or the next stream chunk", &s.UpstreamTimeout, 5*time.Minute),
		Duration("upstream-idle-conn-timeout", "close pooled worker connections idle this long (keep below the engine's keep-alive timeout)", &s.UpstreamIdleConnTimeout, 3*time.Second),
		Int("max-conns-per-worker", "most concurrent connections (in-flight requests) to one worker", &s.MaxConnsPerWorker, 1024),
		Duration("shutdown-timeout", "on SIGTERM, longest wait for in-flight requests before cutting them", &s.ShutdownTimeout, 30*time.Second),
		Int("request-max-retries", "retries of a failed request on other workers, while nothing of its answer reached the client", &s.RequestMaxRetries, 1),
		Int("migration-limit", "continuations of a stream that breaks after its first event (engine lost, drained, silent), each on another worker (0 = off: the stream ends with an error event)", &s.MigrationLimit, 3),
		Int("breaker-failure-threshold", "consecutive faults (connect errors, 5xx, timeouts) that open a worker's circuit breaker", &s.BreakerFailureThreshold, 3),
		Duration("breaker-cooldown", "first open period of a tripped breaker, doubled on each re-trip", &s.BreakerCooldown, 5*time.Second),
		Duration("breaker-max-cooldown", "longest open period of a breaker", &s.BreakerMaxCooldown, 60*time.Second),
		Int("max-inflight-per-worker", "most requests in flight per worker (0 = unlimited); full workers are skipped", &s.MaxInflightPerWorker, 0),
		Duration("queue-timeout", "when every worker is full, longest wait for a free slot before 429", &s.QueueTimeout, 5*time.Second),
		Duration("ttft-timeout", "longest wait for a worker's first byte: a stream's first event, a unary request's whole answer (then failover)", &s.TTFTTimeout, 60*time.Second),
		Duration("stream-idle-timeout", "longest silence between stream events (then an in-stream error event)", &s.StreamIdleTimeout, 30*time.Second),
		Duration("request-timeout", "longest time for a whole request", &s.RequestTimeout, 10*time.Minute),
		Duration("pd-prefill-timeout", "longest wait for the prefill leg of a disaggregated request (then the decode leg is aborted and the request fails or fails over)", &s.PDPrefillTimeout, 60*time.Second),
		Int("pd-min-uncached-tokens", "a disaggregated request with fewer uncached prompt tokens (kv-aware estimate) runs on its decode worker alone; 0 = always disaggregate", &s.PDMinUncachedTokens, 0),
		Duration("heartbeat-interval", "SSE comment cadence on a silent stream, so that a gone client is noticed", &s.HeartbeatInterval, time.Second),
		Duration("stall-window", "a worker with requests in flight and no answer byte for this long is probed and, while stalled, gets no new request (0 = no stall detection)", &s.StallWindow, 2*time.Second),
		Duration("stall-probe-interval", "cadence of the GET /health probes that confirm a stalled worker or bring it back", &s.StallProbeInterval, time.Second),
		Int64("max-tokens-ceiling", "refuse with 400 a request asking for more completion tokens (max_tokens, max_completion_tokens) than this (0 = no ceiling)", &s.MaxTokensCeiling, 1<<24),
		String("api-keys-file", "file of client API keys, one per line (# comments); no keys = no auth", &s.APIKeysFile, ""),
		StringSlice("api-keys", "client API keys, comma-separated (prefer INFERA_API_KEYS or --api-keys-file)", nil),
		String("admin-listen", "host:port for /v1/workers, /v1/admin/* and /metrics (then not served on --listen)", &s.AdminListen, ""),
		String("admin-token", "Bearer token required on the admin endpoints", &s.AdminToken, ""),
		Bool("enable-profiling", "serve Go's pprof endpoints (/debug/pprof/) on --admin-listen, behind --admin-token when set", &s.EnableProfiling, false),
		Bool("tokenizer-canary-check", "reject a worker whose kv block's tokenizer_canary differs from the first worker's of its model (counted in infera_canary_rejections_total); =false to route them anyway", &s.TokenizerCanaryCheck, true),
		Int("max-header-bytes", "largest request header block; larger ones get 431", &s.MaxHeaderBytes, 16384),
		Duration("client-write-timeout", "longest time one write to a client may block", &s.ClientWriteTimeout, 5*time.Minute),
		Int("max-connections", "most concurrent client connections; beyond, a new connection gets 503 (OpenAI error, Retry-After)", &s.MaxConnections, 10000),
		String("front-door", "how client connections are served: goroutine (a goroutine per connection) or loop (epoll event loops hand complete requests to goroutines; same answers)", &s.FrontDoor, "goroutine"),
		Int("max-connections-per-ip", "most concurrent client connections from one address (0 = no cap); beyond, 429 (OpenAI error, Retry-After)", &s.MaxConnectionsPerIP, 0),
		Duration("client-header-timeout", "longest wait for a request's headers, from the connection's opening (idle connections that send nothing are closed after it); the body then has --client-read-timeout", &s.ClientHeaderTimeout, 10*time.Second),
		Int64("body-budget-bytes", "most bytes of request bodies above 64 KiB read or held at once, all clients together; a body that does not fit gets 503 (Retry-After) before it is read", &s.BodyBudgetBytes, 1<<30),
		Duration("etcd-outage-grace", "after an etcd outage that may have expired leases (a re-list, or no quorum read while the leader kept its term), how long removals wait for the worker to re-register (about the workers' --keepalive-interval plus margin; 0 = remove at once)", &s.OutageGrace, 10*time.Second),
		Bool("log-prompts", "allow request bodies in debug logs", &s.LogPrompts, false),
		String("otlp-traces-endpoint", "export OpenTelemetry traces of proxied requests over OTLP/gRPC to this receiver, http://HOST:PORT (plaintext) or https://HOST:PORT, e.g. a Jaeger or an OpenTelemetry Collector on :4317; engines get each leg's W3C traceparent (empty = tracing off)", &s.OTLPTracesEndpoint, ""),
		Float("otlp-traces-sample-ratio", "share of new traces recorded with --otlp-traces-endpoint (0..1); a request arriving with a traceparent follows its sampled flag", &s.OTLPTracesSampleRatio, 1),
		String("kvd-socket", "Unix socket of infera kvd: enables POST /v1/cache/prewarm (model, block_hashes as 16-hex-digit kvd keys, compat_key, deadline_ms), forwarded to kvd as a prefetch_hint (empty = the route answers 503)", &s.KVDSocket, ""),
		String("embedded-etcd-listen", "client host:port of the embedded etcd started when no --etcd-endpoints are given", &s.EmbeddedEtcdListen, "127.0.0.1:2379"),
		String("embedded-etcd-dir", "data directory of the embedded etcd", &s.EmbeddedEtcdDir, filepath.Join(DefaultStateDir(), "etcd")),
	), append(append(s.KV.flags(), s.Requests.ServeFlags()...), serveInferaFlags(&s.inferaHost, &s.inferaPort)...)...))
}

// Finish copies slice flags out of the parsed command line.
func (s *Serve) Finish(c *cli.Context) {
	s.Etcd.Finish(c)
	s.APIKeys = SplitList(c.StringSlice("api-keys"))
	s.KV.finish(c)
	finishListen(c, &s.Listen, s.inferaHost, s.inferaPort)
}

// Validate reports every configuration problem at once.
func (s *Serve) Validate() error {
	var p Problems
	s.Log.Validate(&p)
	s.Etcd.Validate(&p)
	s.Kube.Validate(&p, true)
	if err := serveCheckListen(s.Listen); err != "" {
		p.Addf("--listen %q: %s", s.Listen, err)
	}
	switch {
	case s.RouterPolicy == "":
		p.Addf("--router-policy must not be empty")
	case len(s.KnownPolicies) > 0 && !slices.Contains(s.KnownPolicies, s.RouterPolicy):
		p.Addf("--router-policy %q: want one of %s", s.RouterPolicy, strings.Join(s.KnownPolicies, ", "))
	}
	if s.RouterMode != "auto" && s.RouterMode != "direct" {
		p.Addf("--router-mode %q: want auto or direct", s.RouterMode)
	}
	if s.MaxBodyBytes <= 0 {
		p.Addf("--max-body-bytes must be positive")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"--client-read-timeout", s.ClientReadTimeout},
		{"--client-idle-timeout", s.ClientIdleTimeout},
		{"--upstream-connect-timeout", s.UpstreamConnectTimeout},
		{"--upstream-timeout", s.UpstreamTimeout},
		{"--upstream-idle-conn-timeout", s.UpstreamIdleConnTimeout},
		{"--shutdown-timeout", s.ShutdownTimeout},
		{"--breaker-cooldown", s.BreakerCooldown},
		{"--breaker-max-cooldown", s.BreakerMaxCooldown},
		{"--queue-timeout", s.QueueTimeout},
		{"--ttft-timeout", s.TTFTTimeout},
		{"--stream-idle-timeout", s.StreamIdleTimeout},
		{"--request-timeout", s.RequestTimeout},
		{"--pd-prefill-timeout", s.PDPrefillTimeout},
		{"--heartbeat-interval", s.HeartbeatInterval},
		{"--client-write-timeout", s.ClientWriteTimeout},
		{"--client-header-timeout", s.ClientHeaderTimeout},
	} {
		if d.v <= 0 {
			p.Addf("%s must be positive", d.name)
		}
	}
	if s.MaxConnsPerWorker <= 0 {
		p.Addf("--max-conns-per-worker must be positive")
	}
	if s.PDMinUncachedTokens < 0 {
		p.Addf("--pd-min-uncached-tokens must not be negative")
	}
	if e := s.OTLPTracesEndpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Port() == "" {
			p.Addf("--otlp-traces-endpoint %q: want http://HOST:PORT or https://HOST:PORT", e)
		}
	}
	if r := s.OTLPTracesSampleRatio; !(r >= 0 && r <= 1) {
		p.Addf("--otlp-traces-sample-ratio %v: want a fraction in [0, 1]", r)
	}
	if s.KVDSocket != "" && !ValidKVDSocket(s.KVDSocket) {
		p.Addf("--kvd-socket %q: want an absolute path of at most 103 bytes", s.KVDSocket)
	}
	s.validateResilience(&p)
	s.validateSecurity(&p)
	s.KV.validate(&p)
	s.Requests.Validate(&p)
	if len(s.Etcd.Endpoints) == 0 {
		// Only then is the embedded etcd started.
		if err := serveCheckListen(s.EmbeddedEtcdListen); err != "" {
			p.Addf("--embedded-etcd-listen %q: %s", s.EmbeddedEtcdListen, err)
		}
		if s.EmbeddedEtcdDir == "" {
			p.Addf("--embedded-etcd-dir must not be empty when no --etcd-endpoints are given")
		}
	}
	return p.Err()
}

// serveCheckListen validates a host:port to listen on; it returns what is wrong,
// or "".
func serveCheckListen(hostPort string) string {
	_, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return "want host:port"
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return "port must be a number from 0 to 65535"
	}
	return ""
}

func (s *Serve) validateResilience(p *Problems) {
	if s.RequestMaxRetries < 0 || s.RequestMaxRetries > 16 {
		p.Addf("--request-max-retries must be from 0 to 16")
	}
	if s.MigrationLimit < 0 || s.MigrationLimit > 16 {
		p.Addf("--migration-limit must be from 0 to 16")
	}
	if s.BreakerFailureThreshold < 1 {
		p.Addf("--breaker-failure-threshold must be positive")
	}
	if s.BreakerMaxCooldown < s.BreakerCooldown {
		p.Addf("--breaker-max-cooldown must not be below --breaker-cooldown")
	}
	if s.MaxInflightPerWorker < 0 {
		p.Addf("--max-inflight-per-worker must not be negative")
	}
	if s.StallWindow < 0 {
		p.Addf("--stall-window must not be negative")
	}
	if s.StallWindow > 0 && s.StallProbeInterval <= 0 {
		p.Addf("--stall-probe-interval must be positive")
	}
	if s.MaxTokensCeiling < 0 {
		p.Addf("--max-tokens-ceiling must not be negative")
	}
}

// maxAPIKeyBytes bounds one key: a key is a secret, not a document.
const maxAPIKeyBytes = 1024

func (s *Serve) validateSecurity(p *Problems) {
	if s.AdminListen != "" {
		if err := serveCheckListen(s.AdminListen); err != "" {
			p.Addf("--admin-listen %q: %s", s.AdminListen, err)
		} else if _, port, _ := net.SplitHostPort(s.AdminListen); s.AdminListen == s.Listen && port != "0" {
			p.Addf("--admin-listen must differ from --listen")
		}
	}
	if s.EnableProfiling && s.AdminListen == "" {
		p.Addf("--enable-profiling needs --admin-listen: profiles are served on the admin address only")
	}
	if s.AdminToken != "" && !ValidAPIKey(s.AdminToken) {
		p.Addf("--admin-token must be 1 to %d visible ASCII characters", maxAPIKeyBytes)
	}
	if s.MaxHeaderBytes < 1024 || s.MaxHeaderBytes > 1<<20 {
		p.Addf("--max-header-bytes must be from 1024 to 1048576")
	}
	if s.MaxConnections < 1 {
		p.Addf("--max-connections must be positive")
	}
	if s.FrontDoor != "goroutine" && s.FrontDoor != "loop" {
		p.Addf("--front-door must be goroutine or loop")
	}
	if s.MaxConnectionsPerIP < 0 {
		p.Addf("--max-connections-per-ip must not be negative")
	}
	if s.BodyBudgetBytes < int64(s.MaxBodyBytes) {
		p.Addf("--body-budget-bytes must be at least --max-body-bytes")
	}
	if s.OutageGrace < 0 {
		p.Addf("--etcd-outage-grace must not be negative")
	}
	keys := slices.Clone(s.APIKeys)
	if s.APIKeysFile != "" {
		data, err := os.ReadFile(s.APIKeysFile)
		if err != nil {
			p.Addf("--api-keys-file: %v", err)
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				keys = append(keys, line)
			}
		}
	}
	for i, k := range keys {
		if !ValidAPIKey(k) {
			// Never echo a key, not even a broken one.
			p.Addf("API key #%d must be 1 to %d visible ASCII characters", i+1, maxAPIKeyBytes)
		}
	}
	s.keys = keys
}

// ValidAPIKey reports whether k can be sent as a Bearer token: 1 to 1024
// visible ASCII characters.
func ValidAPIKey(k string) bool {
	if len(k) == 0 || len(k) > maxAPIKeyBytes {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] > '~' {
			return false
		}
	}
	return true
}

// Keys returns the client API keys of --api-keys-file and --api-keys, as
// read by the last Validate.
func (s *Serve) Keys() []string { return s.keys }
