package config

import (
	"math"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// KVD configures `infera kvd`, the per-host KV-cache daemon (DESIGN §9).
// Sizes are parsed from strings with ParseBytes; the typed fields below
// hold the results after Validate.
type KVD struct {
	Log Log

	Socket       string
	AdminListen  string
	AllowUIDs    []int
	MaxBytesText string
	ArenaText    string
	MaxFrameText string
	SlotText     string
	ArenaHugetlb bool
	ArenaMlock   bool
	// ArenaHIPRegister: auto, on or off (the GPU build registers the arena
	// with hipHostRegister); HIPLibrary is the runtime it loads.
	ArenaHIPRegister string
	HIPLibrary       string
	PrefetchQueue    int
	LongQueue        int

	// L3 tablespace (kvd/tablespace); no path = no L3.
	LongPath             string
	LongPaths            []string // every shard path: LongPath plus --long-paths
	LongBytesText        string
	SlotBytesText        string
	ContainerBytesText   string
	LongDirectIO         string
	LongGroupCommit      bool
	LongSnapshotInterval time.Duration
	SkipSelfCheck        bool

	LongBytes      int64
	SlotBytes      int64
	ContainerBytes int64

	// RESP listener (kvd/resp); empty RESPListen = none.
	RESPListen     string
	RESPUser       string
	RESPPassword   string
	RESPModel      string
	RESPCompatKey  string
	RESPRetention  string
	RESPLoops      int
	RESPMaxClients int
	// RESPMaxOutput bounds one RESP client's unwritten replies;
	// RESPOutputTimeout disconnects one that reads none of them that long.
	RESPMaxOutput     int64
	RESPOutputTimeout time.Duration
	respMaxOutputText string
	MaxConns          int
	MaxLeases         int
	LeaseTimeout      time.Duration

	// L4 on Redis/Valkey (kvd/l4); no URL = no L4.
	L4Redis     []string
	L4Prefix    string
	L4TTL       time.Duration
	L4Queue     int
	L4Timeout   time.Duration
	l4RedisText []string

	// LongBackend: tablespace (L3 + optional Redis L4) or mooncake (L4 on
	// Mooncake Store, below L3 when --long-path is set); Mooncake holds
	// its settings after Validate.
	LongBackend    string
	MooncakeConfig string
	Mooncake       MooncakeL4

	// kvd-to-kvd pulls (kvd/peer): PeerListen serves this kvd's arena to
	// other hosts' kvds (empty: off); pulls are always possible.
	PeerListen    string
	PeerAdvertise string
	PeerSecret    string
	PeerAllow     []netip.Prefix
	peerAllowText []string
	// PeerTransport moves the bytes: tcp (every build) or mooncake (the
	// GPU build: Mooncake Transfer Engine, RDMA where the NICs allow).
	PeerTransport        string
	PeerMooncakeLibrary  string
	PeerMooncakeMetadata string
	PeerMooncakeName     string
	PeerMooncakeProtocol string
	// Etcd (--etcd-endpoints, off when empty) registers this kvd in the
	// kvd registry under Etcd.Prefix (--etcd-kvd-prefix) and fences the
	// peer listener by it; LeaseTTL and KeepAliveInterval tune the lease.
	Etcd              Etcd
	LeaseTTL          time.Duration
	KeepAliveInterval time.Duration

	MaxBytes       int64 // RAM budget: the arena plus inline values
	ArenaBytes     int64 // 0: no shared arena
	MaxFrameBytes  int64
	ArenaSlotBytes int64 // 0: the first value decides

	allowUIDText  []string
	longPathsText []string
}

// ValidKVDSocket reports whether path can name kvd's Unix socket: an
// absolute path that fits sockaddr_un.
func ValidKVDSocket(path string) bool {
	return strings.HasPrefix(path, "/") && len(path) <= 103
}

// DefaultKVDSocket is where engines' connectors look for kvd.
const DefaultKVDSocket = "/run/infera/kvd.sock"

// Flags returns the kvd flags, binding each to its field.
func (k *KVD) Flags() []cli.Flag {
	return append(append(k.Log.Flags(),
		String("socket", "Unix socket the daemon listens on (created 0600; a stale socket is replaced)", &k.Socket, DefaultKVDSocket),
		String("admin-listen", "host:port of the Prometheus /metrics and /health endpoint (empty = none)", &k.AdminListen, "127.0.0.1:9478"),
		StringSlice("allow-uid", "peer uids allowed on the socket (SO_PEERCRED), comma-separated; unset = the daemon's own uid and root", nil),
		String("max-bytes", "host-RAM budget (L2): the shared arena plus values kept inline, e.g. 64GiB", &k.MaxBytesText, "4GiB"),
		String("shared-arena-bytes", "size of the memfd arena shared with engines (zero-copy reads): auto (= --max-bytes), a size, or 0 for none", &k.ArenaText, "auto"),
		String("arena-slot-bytes", "largest arena slot (the arena's page), 16-byte header included (rounded up to 64); size classes cut pages into smaller slots; 0 = arena/16 within 64KiB–4MiB", &k.SlotText, "0"),
		Bool("arena-hugetlb", "back the arena with 2 MiB huge pages (falls back to normal pages when none are reserved)", &k.ArenaHugetlb, false),
		String("arena-hip-register", "register the arena with the GPUs (hipHostRegister, GPU build): auto (when HIP and a GPU are there), on (fail without) or off", &k.ArenaHIPRegister, "auto"),
		String("hip-library", "HIP runtime library the GPU build loads", &k.HIPLibrary, "libamdhip64.so"),
		Bool("arena-mlock", "lock the arena in RAM (falls back to unlocked memory when RLIMIT_MEMLOCK is too low)", &k.ArenaMlock, true),
		String("max-frame-bytes", "largest request frame accepted; a longer one closes its connection", &k.MaxFrameText, "1GiB"),
		Int("prefetch-queue", "pending prefetch_hint keys; more are dropped and counted", &k.PrefetchQueue, 64),
		Int("long-write-queue", "pending write-throughs of long entries to L3; more are dropped and counted", &k.LongQueue, 1024),
		String("long-path", "directory of the L3 tablespace on local NVMe (empty = no L3: long entries live in RAM only)", &k.LongPath, ""),
		StringSlice("long-paths", "more tablespace directories, one shard each (keys striped by hash), comma-separated", nil),
		String("long-bytes", "L3 capacity over all paths, pre-allocated in container files", &k.LongBytesText, "64GiB"),
		String("tablespace-slot-bytes", "fixed L3 slot size (a multiple of 4096; a value must fit one slot)", &k.SlotBytesText, "1MiB"),
		String("tablespace-container-bytes", "size of each pre-allocated L3 container file", &k.ContainerBytesText, "1GiB"),
		String("long-direct-io", "O_DIRECT for L3: auto (where the filesystem allows), on or off", &k.LongDirectIO, "auto"),
		Bool("long-group-commit", "share data and journal syncs between concurrent L3 writers", &k.LongGroupCommit, false),
		Duration("long-snapshot-interval", "periodic L3 index snapshot (0 = on shutdown and by journal size only)", &k.LongSnapshotInterval, 5*time.Minute),
		Bool("skip-selfcheck", "skip the startup L3 write-speed self-check", &k.SkipSelfCheck, false),
		String("resp-listen", "host:port of the Redis-protocol (RESP2) listener for redis-cli, Redis clients and LMCache; a bare port or :port binds loopback (empty = none)", &k.RESPListen, ""),
		String("resp-user", "ACL user RESP clients authenticate as (AUTH user password); empty = Redis's default user", &k.RESPUser, ""),
		String("resp-password", "password RESP clients must AUTH with (empty = none; with --resp-user, that user's password)", &k.RESPPassword, ""),
		String("resp-model", "kvd namespace (model) of keys set over RESP", &k.RESPModel, "resp"),
		String("resp-compat-key", "kvd namespace compat_key of keys set over RESP", &k.RESPCompatKey, ""),
		String("resp-retention", "retention of values set over RESP: none, ephemeral, short or long (long ones go down to L3/L4)", &k.RESPRetention, "short"),
		String("resp-max-output-bytes", "replies one RESP client may have waiting unwritten (Redis's client-output-buffer-limit); one command's reply past it (an MGET of many large values) disconnects the client", &k.respMaxOutputText, "1GiB"),
		Duration("resp-output-timeout", "a RESP client that takes none of its waiting replies for this long is disconnected (one that sends and does not read); 0 = never", &k.RESPOutputTimeout, time.Minute),
		Int("resp-max-clients", "open RESP connections allowed (Redis's maxclients); one more gets -ERR max number of clients reached and is closed", &k.RESPMaxClients, 10000),
		Int("max-leases-per-conn", "uncommitted set_reserve leases one connection may hold; one more is refused with reason too_many_leases", &k.MaxLeases, 1024),
		Duration("lease-timeout", "an uncommitted lease is cancelled after this; a connection silent (or not reading its replies) this long while holding leases is closed", &k.LeaseTimeout, time.Minute),
		Int("max-conns", "open Unix-socket connections allowed; one more is closed before its hello", &k.MaxConns, 4096),
		Int("resp-loops", "event loops serving RESP connections (1 = as redis-server's one thread, the least CPU per request; more keep clients moving while a GET reads L3/L4)", &k.RESPLoops, 1),
		StringSlice("l4-redis", "L4 tier on Redis/Valkey: redis:// or rediss:// URL (user:password@, /db); several (comma-separated) = one cluster's seed nodes", nil),
		String("l4-prefix", "prefix of every L4 key (before model and compat_key), to share one Redis between fleets", &k.L4Prefix, "infera:kv:"),
		Duration("l4-ttl", "TTL of entries written to L4 (long retention); 0 = none", &k.L4TTL, 24*time.Hour),
		Int("l4-write-queue", "pending L4 write-behinds; more are dropped and counted", &k.L4Queue, 4096),
		Duration("l4-timeout", "deadline of one L4 read on an L2/L3 miss (a slower or unreachable Redis counts as a miss)", &k.L4Timeout, 50*time.Millisecond),
		String("peer-listen", "host:port where other hosts' kvds locate blocks in this kvd's arena and read them (kvd-to-kvd pull; empty = off); the arena itself is read over a second port, the next one up", &k.PeerListen, ""),
		String("peer-advertise", "host other kvds reach this one at (default: the --peer-listen host)", &k.PeerAdvertise, ""),
		String("peer-secret", "shared secret every peer request must carry (empty = none; set it, or --peer-allow, outside a trusted network)", &k.PeerSecret, ""),
		String("peer-transport", "what moves pulled blocks between kvds: tcp (every build) or mooncake (Mooncake Transfer Engine, the GPU build)", &k.PeerTransport, "tcp"),
		String("peer-mooncake-library", "Mooncake Transfer Engine library the GPU build loads for --peer-transport mooncake", &k.PeerMooncakeLibrary, "libtransfer_engine.so"),
		String("peer-mooncake-metadata", "Mooncake metadata connection string (P2PHANDSHAKE, etcd://…, http://…)", &k.PeerMooncakeMetadata, "P2PHANDSHAKE"),
		String("peer-mooncake-name", "this kvd's Mooncake segment name, host:port (default: the --peer-listen address, or the host name for a kvd that only pulls)", &k.PeerMooncakeName, ""),
		String("peer-mooncake-protocol", "Mooncake transport to install: rdma or tcp (empty: the engine decides)", &k.PeerMooncakeProtocol, ""),
		StringSlice("peer-allow", "networks (CIDR) whose kvds may pull from this one, comma-separated (empty = any; with --etcd-endpoints, the networks admitted beside the registered kvds: the routers' that send hints)", nil),
		Duration("lease-ttl", "etcd lease TTL of this kvd's record in the kvd registry (--etcd-endpoints)", &k.LeaseTTL, 10*time.Second),
		Duration("keepalive-interval", "etcd lease keepalive interval (less than --lease-ttl)", &k.KeepAliveInterval, 3*time.Second),
		String("long-backend", "where long entries go below RAM: tablespace (the L3 of --long-path, Redis L4 with --l4-redis) or mooncake (L4 on Mooncake Store, below L3 when --long-path is set; needs the GPU build)", &k.LongBackend, LongBackendTablespace),
		String("mooncake-config", "YAML with the Mooncake Store settings (master_address, cluster_id, local_hostname, metadata_server, protocol, device_name, global_segment_size, local_buffer_size, max_value_bytes, library); INFERA_L4_<KEY> variables win over it", &k.MooncakeConfig, ""),
	), k.etcdFlags()...)
}

// DefaultKVDPrefix is the etcd prefix of the kvd registry (kvd and serve
// --etcd-kvd-prefix): beside Infera's worker prefix, not below it.
const DefaultKVDPrefix = "/infera/kvds/"

// KVDPrefixFlag is --etcd-kvd-prefix, for kvd and serve.
func KVDPrefixFlag(dest *string) cli.Flag {
	return String("etcd-kvd-prefix", "key prefix of the kvd registry: kvds register their host, peer listener and transport there (kvd --etcd-endpoints), routers read it to name the kvd of a worker's host", dest, DefaultKVDPrefix)
}

// etcdFlags are the shared etcd client flags with the kvd registry's
// prefix in place of the worker prefix, and no endpoint by default.
func (k *KVD) etcdFlags() []cli.Flag {
	var out []cli.Flag
	for _, f := range k.Etcd.Flags() {
		switch f.Names()[0] {
		case "etcd-prefix":
			out = append(out, KVDPrefixFlag(&k.Etcd.Prefix))
		case "etcd-endpoints":
			sf := f.(*cli.StringSliceFlag)
			sf.Usage = "etcd endpoints (host:port or URL), comma-separated: register this kvd in the kvd registry and serve the peer listener only to registered kvds (and --peer-allow); needs --peer-listen (empty = no registry)"
			out = append(out, sf)
		default:
			out = append(out, f)
		}
	}
	return out
}

// Finish copies slice flags out of the parsed command line.
func (k *KVD) Finish(c *cli.Context) {
	k.Etcd.Finish(c)
	k.allowUIDText = SplitList(c.StringSlice("allow-uid"))
	k.longPathsText = SplitList(c.StringSlice("long-paths"))
	k.l4RedisText = SplitList(c.StringSlice("l4-redis"))
	k.peerAllowText = SplitList(c.StringSlice("peer-allow"))
}

// Validate parses the sizes and reports every problem at once.
func (k *KVD) Validate() error {
	var p Problems
	k.Log.Validate(&p)
	if !ValidKVDSocket(k.Socket) {
		p.Addf("--socket %q: want an absolute path of at most 103 bytes", k.Socket)
	}
	if k.AdminListen != "" {
		if err := serveCheckListen(k.AdminListen); err != "" {
			p.Addf("--admin-listen %q: %s", k.AdminListen, err)
		}
	}
	k.AllowUIDs = k.AllowUIDs[:0]
	for _, s := range k.allowUIDText {
		uid, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			p.Addf("--allow-uid %q: want a numeric uid", s)
			continue
		}
		k.AllowUIDs = append(k.AllowUIDs, int(uid))
	}
	var err error
	if k.MaxBytes, err = ParseBytes(k.MaxBytesText); err != nil || k.MaxBytes <= 0 {
		p.Addf("--max-bytes %q: want a positive size such as 64GiB", k.MaxBytesText)
	}
	switch {
	case k.ArenaText == "auto":
		k.ArenaBytes = k.MaxBytes
	default:
		if k.ArenaBytes, err = ParseBytes(k.ArenaText); err != nil {
			p.Addf("--shared-arena-bytes %q: want auto, 0 or a size", k.ArenaText)
		} else if k.ArenaBytes > k.MaxBytes {
			p.Addf("--shared-arena-bytes %s exceeds --max-bytes %s", k.ArenaText, k.MaxBytesText)
		} else if k.ArenaBytes > 0 && k.ArenaBytes < 1<<20 {
			p.Addf("--shared-arena-bytes %s: at least 1MiB (or 0 for none)", k.ArenaText)
		}
	}
	if k.ArenaSlotBytes, err = ParseBytes(k.SlotText); err != nil || (k.ArenaSlotBytes != 0 && (k.ArenaSlotBytes <= 16 || k.ArenaSlotBytes > k.ArenaBytes)) {
		p.Addf("--arena-slot-bytes %q: want 0 or a size above 16 bytes that fits the arena", k.SlotText)
	}
	if k.MaxFrameBytes, err = ParseBytes(k.MaxFrameText); err != nil || k.MaxFrameBytes < 1024 || k.MaxFrameBytes > math.MaxUint32 {
		p.Addf("--max-frame-bytes %q: want a size from 1KiB to 4GiB", k.MaxFrameText)
	}
	k.LongPaths = k.LongPaths[:0]
	if k.LongPath != "" {
		k.LongPaths = append(k.LongPaths, k.LongPath)
	}
	k.LongPaths = append(k.LongPaths, k.longPathsText...)
	for name, f := range map[string]struct {
		text string
		dst  *int64
	}{"--long-bytes": {k.LongBytesText, &k.LongBytes}, "--tablespace-slot-bytes": {k.SlotBytesText, &k.SlotBytes}, "--tablespace-container-bytes": {k.ContainerBytesText, &k.ContainerBytes}} {
		if *f.dst, err = ParseBytes(f.text); err != nil || *f.dst <= 0 {
			p.Addf("%s %q: want a positive size", name, f.text)
		}
	}
	if k.SlotBytes%4096 != 0 {
		p.Addf("--tablespace-slot-bytes %s: want a multiple of 4096", k.SlotBytesText)
	}
	switch k.LongDirectIO {
	case "auto", "on", "off":
	default:
		p.Addf("--long-direct-io %q: want auto, on or off", k.LongDirectIO)
	}
	if k.LongSnapshotInterval < 0 {
		p.Addf("--long-snapshot-interval must not be negative")
	}
	if k.RESPMaxOutput, err = ParseBytes(k.respMaxOutputText); err != nil || k.RESPMaxOutput < 1<<20 || k.RESPMaxOutput > 8<<30 {
		p.Addf("--resp-max-output-bytes %q: want a size from 1MiB to 8GiB", k.respMaxOutputText)
	}
	if k.RESPOutputTimeout < 0 {
		p.Addf("--resp-output-timeout must not be negative")
	}
	if k.RESPMaxClients < 1 {
		p.Addf("--resp-max-clients must be at least 1")
	}
	if k.MaxLeases < 1 {
		p.Addf("--max-leases-per-conn must be at least 1")
	}
	if k.LeaseTimeout <= 0 {
		p.Addf("--lease-timeout must be positive")
	}
	if k.MaxConns < 1 {
		p.Addf("--max-conns must be at least 1")
	}
	if k.PrefetchQueue < 1 {
		p.Addf("--prefetch-queue must be at least 1")
	}
	if k.LongQueue < 1 {
		p.Addf("--long-write-queue must be at least 1")
	}
	k.validateRESPL4(&p)
	k.PeerAllow = k.PeerAllow[:0]
	for _, c := range k.peerAllowText {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			p.Addf("--peer-allow %q: want a CIDR such as 10.0.0.0/8", c)
			continue
		}
		k.PeerAllow = append(k.PeerAllow, pfx)
	}
	switch k.PeerTransport {
	case "tcp", "mooncake":
	default:
		p.Addf("--peer-transport %q: want tcp or mooncake", k.PeerTransport)
	}
	if k.PeerListen != "" {
		if err := serveCheckListen(k.PeerListen); err != "" {
			p.Addf("--peer-listen %q: %s", k.PeerListen, err)
		} else if k.ArenaBytes == 0 {
			p.Addf("--peer-listen needs the shared arena (--shared-arena-bytes is 0)")
		}
	}
	if len(k.Etcd.Endpoints) > 0 {
		// Etcd.Prefix is --etcd-kvd-prefix here.
		if !strings.HasPrefix(k.Etcd.Prefix, "/") {
			p.Addf("--etcd-kvd-prefix %q: must start with /", k.Etcd.Prefix)
		}
		prefix := k.Etcd.Prefix
		k.Etcd.Prefix = "/"
		k.Etcd.Validate(&p)
		k.Etcd.Prefix = prefix
		if k.PeerListen == "" {
			p.Addf("--etcd-endpoints registers this kvd's peer listener: set --peer-listen too")
		} else if h := k.PeerRegistryHost(); h == "" {
			p.Addf("--etcd-endpoints: --peer-listen %q binds every address; set --peer-advertise to the host other kvds and this host's workers know it by", k.PeerListen)
		}
		if k.LeaseTTL < time.Second {
			p.Addf("--lease-ttl must be at least 1s")
		}
		if k.KeepAliveInterval <= 0 || k.KeepAliveInterval >= k.LeaseTTL {
			p.Addf("--keepalive-interval must be positive and less than --lease-ttl")
		}
	}
	switch k.ArenaHIPRegister {
	case "auto", "on", "off":
	default:
		p.Addf("--arena-hip-register %q: want auto, on or off", k.ArenaHIPRegister)
	}
	switch k.LongBackend {
	case LongBackendTablespace:
		if k.MooncakeConfig != "" {
			p.Addf("--mooncake-config is set but --long-backend is %s (want mooncake)", k.LongBackend)
		}
	case LongBackendMooncake:
		if len(k.L4Redis) > 0 {
			p.Addf("--long-backend mooncake and --l4-redis: one L4 only")
		}
		k.Mooncake = loadMooncakeL4(&p, k.MooncakeConfig, os.Getenv)
	default:
		p.Addf("--long-backend %q: want tablespace or mooncake", k.LongBackend)
	}
	return p.Err()
}

// PeerRegistryHost is the host this kvd registers (--peer-advertise, or
// the --peer-listen host), without brackets; "" when neither names one
// (the listener binds every address).
func (k *KVD) PeerRegistryHost() string {
	h := k.PeerAdvertise
	if h == "" {
		h, _, _ = net.SplitHostPort(k.PeerListen)
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if a, err := netip.ParseAddr(h); err == nil && a.IsUnspecified() {
		return ""
	}
	return h
}

// KVDStat configures `infera kvd stat`.
type KVDStat struct {
	Socket string
	JSON   bool
}

// Flags returns the stat flags.
func (s *KVDStat) Flags() []cli.Flag {
	return []cli.Flag{
		String("socket", "Unix socket of the daemon", &s.Socket, DefaultKVDSocket),
		Bool("json", "print the counters as one JSON object", &s.JSON, false),
	}
}

// ParseBytes parses a size: a number of bytes with an optional binary
// (KiB, MiB, GiB, TiB, or K, M, G, T) or decimal (KB, MB, GB, TB) suffix.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || f*mult > math.MaxInt64 {
		return 0, ErrInvalid
	}
	return int64(f * mult), nil
}

// validateRESPL4 checks the RESP listener and L4 flags; a bare port (or
// ":port") for --resp-listen becomes a loopback address.
func (k *KVD) validateRESPL4(p *Problems) {
	if k.RESPListen != "" {
		if _, err := strconv.Atoi(k.RESPListen); err == nil {
			k.RESPListen = ":" + k.RESPListen
		}
		if strings.HasPrefix(k.RESPListen, ":") {
			k.RESPListen = "127.0.0.1" + k.RESPListen
		}
		if err := serveCheckListen(k.RESPListen); err != "" {
			p.Addf("--resp-listen %q: %s", k.RESPListen, err)
		}
	}
	switch k.RESPRetention {
	case "none", "ephemeral", "short", "long":
	default:
		p.Addf("--resp-retention %q: want none, ephemeral, short or long", k.RESPRetention)
	}
	if k.RESPLoops < 1 || k.RESPLoops > 1024 {
		p.Addf("--resp-loops %d: want 1 to 1024", k.RESPLoops)
	}
	if k.RESPUser != "" && k.RESPPassword == "" {
		p.Addf("--resp-user needs --resp-password")
	}
	k.L4Redis = k.L4Redis[:0]
	for _, u := range k.l4RedisText {
		if !strings.HasPrefix(u, "redis://") && !strings.HasPrefix(u, "rediss://") {
			p.Addf("--l4-redis %q: want a redis:// or rediss:// URL", u)
			continue
		}
		k.L4Redis = append(k.L4Redis, u)
	}
	if k.L4TTL < 0 {
		p.Addf("--l4-ttl must not be negative")
	}
	if k.L4Queue < 1 {
		p.Addf("--l4-write-queue must be at least 1")
	}
	if k.L4Timeout <= 0 {
		p.Addf("--l4-timeout must be positive")
	}
}
