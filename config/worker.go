package config

import (
	"net"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// WorkerEngines lists the values --engine accepts. The engines package has
// an adapter for each (a test there keeps the two lists in step); config
// keeps its own copy because it imports nothing of the project.
var WorkerEngines = []string{"sim", "vllm", "sglang", "atom"}

// DefaultWorkerEtcdEndpoint is where a worker looks for etcd without
// --etcd-endpoints: the embedded etcd that `infera serve` starts by default.
const DefaultWorkerEtcdEndpoint = "http://127.0.0.1:2379"

// Worker configures `infera worker`: one engine process, registered in etcd.
type Worker struct {
	Log  Log
	Etcd Etcd
	Kube Kube

	Engine        string // adapter name, e.g. "sim"
	EngineBin     string // engine executable; empty = the adapter's default
	Python        string // interpreter for sglang/atom (python -m ...)
	AdvertiseHost string // host put into worker_id/url; empty = the engine's host
	NoKVEvents    bool   // do not configure or advertise a KV-event publisher
	// KVEventsRouter is --kv-events-router: the tcp://HOST:PORT of a
	// router's --kv-events-listen socket; the engine's publisher connects
	// there under the topic kv@<worker id> instead of binding a port.
	KVEventsRouter string
	// KVEventTransport is --kv-event-transport: zmq (routers subscribe to
	// the engine) or nats (the worker relays the engine's events to NATS).
	KVEventTransport string
	// NATS reaches the NATS server (--kv-event-transport nats,
	// --request-transport nats).
	NATS NATS
	// Requests: --request-transport and the nats-req-* settings.
	Requests NATSRequests
	// KVDSocket is --kvd-socket: the kvd daemon's Unix socket, passed to
	// the engine (INFERA_KVD_SOCKET and its kvd connector); empty = none.
	KVDSocket string
	// KVDPeer is --kvd-peer: host:port of the control listener of the kvd
	// on this host (its --peer-listen), written to the worker record as
	// kvd_peer so that routers direct kvd-to-kvd pulls; empty = none.
	KVDPeer           string
	LeaseTTL          time.Duration // etcd lease TTL of the record
	KeepAliveInterval time.Duration // how often the lease is refreshed
	ReadyTimeout      time.Duration // how long the engine may take to answer /health
	HealthInterval    time.Duration // /health poll period while starting
	DrainTimeout      time.Duration // longest wait for in-flight requests on shutdown
	StopGrace         time.Duration // SIGTERM → SIGKILL delay when stopping the engine
	// RuntimeDir holds the engine pidfiles (engine-<port>.pid) a restarted
	// worker uses to reclaim its port; empty: the engines package default.
	RuntimeDir string

	// AllowTCP lets a prefill/decode worker register although its KV would
	// move over TCP (no active RDMA port, or an unroutable advertise host).
	AllowTCP  bool
	SysfsRoot string // where the node's GPUs and RDMA devices are read
	Preflight bool   // print the PD preflight findings and exit
	JSON      bool   // --preflight output as JSON

	// EngineArgs are the engine's own arguments (everything after "--"),
	// forwarded verbatim except what the adapter must add.
	EngineArgs []string

	// Infera's --enable-kv-events, folded into NoKVEvents by Finish.
	inferaEnableKVEvents bool
}

// Flags returns the worker flags.
func (w *Worker) Flags() []cli.Flag {
	etcd := w.Etcd.Flags()
	// A worker without --etcd-endpoints talks to serve's embedded etcd; the
	// default is set on the flag itself so --help shows it.
	for _, f := range etcd {
		if sf, ok := f.(*cli.StringSliceFlag); ok && sf.Name == "etcd-endpoints" {
			sf.Value = cli.NewStringSlice(DefaultWorkerEtcdEndpoint)
			sf.DefaultText = DefaultWorkerEtcdEndpoint
		}
	}
	flags := []cli.Flag{
		withDefaultText(String("engine", "engine to run: "+strings.Join(WorkerEngines, ", ")+" (required)", &w.Engine, ""), "none"),
		withDefaultText(String("engine-bin", "engine executable, run with the engine args (sglang/atom: instead of --python -m MODULE)", &w.EngineBin, ""),
			"sim: this infera binary; vllm: vllm; sglang, atom: --python -m the engine's module"),
		String("python", "Python interpreter that runs sglang and atom (-m sglang.launch_server, -m atom.entrypoints.openai_server)", &w.Python, "python3"),
		withDefaultText(String("advertise-host", "host advertised in the worker record", &w.AdvertiseHost, ""),
			"the engine's --host; the first non-loopback IPv4 address of this machine if the engine binds 0.0.0.0"),
		Bool("no-kv-events", "do not configure the engine's KV-event publisher nor advertise one", &w.NoKVEvents, false),
		String("kv-events-router", "tcp://HOST:PORT of a router's --kv-events-listen: the engine's KV-event publisher connects there (topic kv@<worker id>) instead of binding a port routers subscribe to", &w.KVEventsRouter, ""),
		String("kvd-socket", "Unix socket of infera kvd: the engine gets it in INFERA_KVD_SOCKET, vLLM the kvd connector in --kv-transfer-config (merged with yours), SGLang kvd as its HiCache storage backend, the simulator kvd as its second-level cache (empty = none)", &w.KVDSocket, ""),
		String("kvd-peer", "host:port of this host's kvd peer listener (its --peer-listen address as other hosts reach it), advertised in the worker record (kvd_peer) so that the router can have this kvd pull a prompt's blocks from the kvd of the host that computed them (empty = none)", &w.KVDPeer, ""),
		Duration("lease-ttl", "etcd lease TTL of the worker record", &w.LeaseTTL, 10*time.Second),
		Duration("keepalive-interval", "etcd lease keepalive interval (less than --lease-ttl)", &w.KeepAliveInterval, 3*time.Second),
		Duration("ready-timeout", "how long the engine may take to become healthy", &w.ReadyTimeout, 10*time.Minute),
		Duration("health-interval", "engine /health poll interval while starting", &w.HealthInterval, 500*time.Millisecond),
		Duration("drain-timeout", "on shutdown, longest wait for the engine's running and waiting requests to finish", &w.DrainTimeout, 30*time.Second),
		Duration("stop-grace", "time between SIGTERM and SIGKILL when stopping the engine", &w.StopGrace, 10*time.Second),
		withDefaultText(String("runtime-dir", "directory of the engine pidfiles (engine-<port>.pid): a restarted worker kills the engine a previous worker on the same port left behind, verified by its command line", &w.RuntimeDir, ""),
			"$XDG_RUNTIME_DIR/infera, else $TMPDIR/infera-<uid>"),
		Bool("disaggregation-allow-tcp", "let a prefill/decode worker register without an active RDMA port or with an unroutable advertise host (KV then moves over TCP)", &w.AllowTCP, false),
		String("sysfs-root", "sysfs mount the node's GPUs (KFD topology) and RDMA devices are read from", &w.SysfsRoot, "/sys"),
		Bool("preflight", "print the PD preflight findings (GPUs, RDMA devices, ports, GIDs, advertise host, verdict) and exit, non-zero on a blocking finding", &w.Preflight, false),
		Bool("json", "with --preflight: print the findings as JSON", &w.JSON, false),
	}
	flags = append(flags, kvEventTransportFlag(&w.KVEventTransport))
	flags = append(flags, w.NATS.Flags()...)
	flags = append(flags, w.Requests.Flags()...)
	flags = append(flags, etcd...)
	flags = append(flags, w.Kube.Flags(false)...)
	flags = append(flags, Bool("enable-kv-events", "Infera's name: false is --no-kv-events (--no-enable-kv-events is an alias of it)", &w.inferaEnableKVEvents, true))
	return withInferaAliases(append(flags, w.Log.Flags()...))
}

// withDefaultText says in --help what an empty default means, which says
// more than "unset".
func withDefaultText(f *cli.StringFlag, text string) *cli.StringFlag {
	f.DefaultText = text
	return f
}

// Finish copies slice flags and the engine arguments out of the parsed
// command line.
func (w *Worker) Finish(c *cli.Context) {
	w.Etcd.Finish(c)
	if len(w.Etcd.Endpoints) == 0 {
		// INFERA_ETCD_ENDPOINTS="" or "--etcd-endpoints ," leaves nothing.
		w.Etcd.Endpoints = []string{DefaultWorkerEtcdEndpoint}
	}
	w.EngineArgs = c.Args().Slice()
	finishEnableKVEvents(c, &w.NoKVEvents, w.inferaEnableKVEvents)
}

// Validate reports every problem of the worker configuration at once.
func (w *Worker) Validate() error {
	var p Problems
	w.Log.Validate(&p)
	w.Etcd.Validate(&p)
	validateKVEventTransport(&p, w.KVEventTransport)
	w.NATS.Validate(&p)
	w.Requests.Validate(&p)
	if w.Requests.Transport == RequestTransportNATS && w.Engine == "atom" {
		p.Addf("--request-transport nats: ATOM workers are always reached over HTTP")
	}
	if w.KVEventTransport == KVEventTransportNATS && w.KVEventsRouter != "" {
		p.Addf("--kv-events-router and --kv-event-transport nats are exclusive")
	}
	w.Kube.Validate(&p, false)
	if w.KVEventsRouter != "" {
		simEndpoint(&p, "--kv-events-router", w.KVEventsRouter)
		if strings.Contains(w.KVEventsRouter, "*") || strings.HasSuffix(w.KVEventsRouter, ":0") {
			p.Addf("--kv-events-router %q: want the router's host and port", w.KVEventsRouter)
		}
	}
	switch {
	case w.Engine == "" && w.Preflight:
		// A node-only preflight: judged as for a prefill/decode worker.
	case w.Engine == "":
		p.Addf("--engine is required: one of %s", strings.Join(WorkerEngines, ", "))
	case !slices.Contains(WorkerEngines, w.Engine):
		p.Addf("--engine %q: supported engines: %s", w.Engine, strings.Join(WorkerEngines, ", "))
	}
	if w.Python == "" {
		p.Addf("--python must not be empty")
	}
	if w.AdvertiseHost != "" && !validHost(w.AdvertiseHost) {
		p.Addf("--advertise-host %q: want an IP address or host name without port or scheme", w.AdvertiseHost)
	}
	// etcd lease TTLs are whole seconds; anything shorter cannot be honoured.
	if w.LeaseTTL < time.Second {
		p.Addf("--lease-ttl %v: must be at least 1s", w.LeaseTTL)
	}
	if w.KeepAliveInterval <= 0 {
		p.Addf("--keepalive-interval %v: must be positive", w.KeepAliveInterval)
	} else if w.KeepAliveInterval >= w.LeaseTTL {
		p.Addf("--keepalive-interval %v: must be less than --lease-ttl %v", w.KeepAliveInterval, w.LeaseTTL)
	}
	if w.KVDSocket != "" && !ValidKVDSocket(w.KVDSocket) {
		p.Addf("--kvd-socket %q: want an absolute path of at most 103 bytes", w.KVDSocket)
	}
	if w.KVDPeer != "" {
		if host, port, err := net.SplitHostPort(w.KVDPeer); err != nil || host == "" || port == "" {
			p.Addf("--kvd-peer %q: want host:port", w.KVDPeer)
		}
	}
	if w.ReadyTimeout <= 0 {
		p.Addf("--ready-timeout %v: must be positive", w.ReadyTimeout)
	}
	if w.HealthInterval <= 0 {
		p.Addf("--health-interval %v: must be positive", w.HealthInterval)
	}
	if w.DrainTimeout < 0 {
		p.Addf("--drain-timeout %v: must not be negative", w.DrainTimeout)
	}
	if w.StopGrace < 0 {
		p.Addf("--stop-grace %v: must not be negative", w.StopGrace)
	}
	if w.SysfsRoot == "" {
		p.Addf("--sysfs-root must not be empty")
	}
	if w.JSON && !w.Preflight {
		p.Addf("--json applies only with --preflight")
	}
	if w.SysfsRoot == "" {
		p.Addf("--sysfs-root must not be empty")
	}
	if w.JSON && !w.Preflight {
		p.Addf("--json applies only with --preflight")
	}
	if len(w.Etcd.Endpoints) == 0 {
		p.Addf("--etcd-endpoints: at least one endpoint is needed")
	}
	return p.Err()
}

// validHost accepts an IP address or a host name: what can stand before
// ":port" in a worker id.
func validHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	// The characters a worker record accepts in a host name.
	return h != "" && len(h) <= 253 && strings.Trim(h, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") == ""
}
