package discovery

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrInvalidRecord is wrapped by every error about a worker record that does
// not satisfy the wire format of DESIGN §4.
var ErrInvalidRecord = errors.New("invalid worker record")

// Bounds on record fields. A record is outside input (anything that can write
// to etcd can write one), so every size is capped before the router trusts it.
const (
	// MaxRecordBytes caps the encoded JSON value of one record.
	MaxRecordBytes = 64 << 10
	// MaxModelNameBytes caps model_name (HF repo ids and local paths fit easily).
	MaxModelNameBytes = 1024
	// MaxKVBlockSize caps kv_block_size; engines use 1..1024 tokens per block.
	MaxKVBlockSize = 1 << 16
	// MaxKVCapacityBlocks caps kv_capacity_blocks (a GPU's cache is at
	// most some millions of blocks).
	MaxKVCapacityBlocks = 1 << 30
	// MaxDPSize caps dp_size; a worker with dp_size N and no dp_rank becomes N
	// routing targets, so an absurd value must not reach the router.
	MaxDPSize = 1024

	maxHostPortBytes = 300
	maxProtocolBytes = 64
)

// Status is the routing state a worker advertises.
type Status string

// Worker states. Readers treat a missing status as active (Infera's Python
// workers do not write one).
const (
	StatusActive   Status = "active"
	StatusDraining Status = "draining"
	// StatusDead is Infera's: the worker is listed but never routed.
	StatusDead Status = "dead"
)

// DisaggMode says which phase of prefill/decode disaggregation a worker serves.
type DisaggMode string

// Disaggregation modes.
const (
	DisaggMixed   DisaggMode = "mixed"
	DisaggPrefill DisaggMode = "prefill"
	DisaggDecode  DisaggMode = "decode"
)

// Engines a record may name.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
	EngineATOM   = "atom"
	EngineSim    = "sim"
)

// TransportHTTP is the only request transport spoken today. Records naming
// another one (Infera's workers default to "nats") are accepted and listed,
// but not routed: see Record.Unroutable.
const TransportHTTP = "http"

// PD protocol names of DESIGN §6, as DisaggMeta.Protocol carries them:
// the worker writes them, the router and the simulator read them.
const (
	ProtocolSGLangBootstrap = "sglang-bootstrap"
	ProtocolVLLMMooncake    = "vllm-mooncake"
	ProtocolVLLMNixl        = "vllm-nixl"
	ProtocolVLLMMoriRead    = "vllm-mori-read"
	ProtocolVLLMMoriWrite   = "vllm-mori-write"
	ProtocolATOMMooncake    = "atom-mooncake"
)

// DisaggMeta carries the PD protocol of a prefill or decode worker (§6).
// The zero value encodes as {} as Infera writes it for mixed workers.
type DisaggMeta struct {
	Protocol string         `json:"protocol,omitempty"`
	Params   map[string]any `json:"params,omitempty"`
}

// Record is one worker's entry under <prefix><worker_id>, with the JSON keys
// Infera's workers use so that fleets of either implementation interoperate.
type Record struct {
	WorkerID         string     `json:"worker_id"`
	URL              string     `json:"url"`
	ModelName        string     `json:"model_name"`
	Engine           string     `json:"engine"`
	DisaggMode       DisaggMode `json:"disagg_mode"`
	DisaggMeta       DisaggMeta `json:"disagg_meta"`
	KVEventsEndpoint *string    `json:"kv_events_endpoint"`
	// KVEventsReplayEndpoint is ours, not Infera's: tcp://host:port of the
	// engine's replay (ROUTER) socket, or null. Python readers ignore it;
	// our readers treat it as absent when missing.
	KVEventsReplayEndpoint *string `json:"kv_events_replay_endpoint"`
	KVBlockSize            *int    `json:"kv_block_size"`
	DPRank                 *int    `json:"dp_rank"`
	DPSize                 int     `json:"dp_size"`
	RequestTransport       string  `json:"request_transport"`
	Status                 Status  `json:"status"`
	// KV is Infera's nested "kv" block (tokenizer digest and canary, index
	// block size, tiers…), kept verbatim so that it survives a round trip
	// and shows in /v1/workers; the router does not read it yet. Absent or
	// null reads as nil; anything else must be a JSON object.
	KV json.RawMessage `json:"kv,omitempty"`
	// RealEngine is ours: the engine actually running when Engine names the
	// engine it imitates (`infera sim --flavor vllm` registers as vllm so
	// that Python servers route it, with real_engine "sim").
	RealEngine string `json:"real_engine,omitempty"`
	// KVDPeer is ours: host:port of the control listener (--peer-listen)
	// of the kvd beside this worker, where routers send prefetch hints
	// and other hosts' kvds locate its blocks (kvd/peer). Absent when the
	// worker runs without one; Infera's Python readers ignore it.
	KVDPeer string `json:"kvd_peer,omitempty"`
	// KVCapacityBlocks is ours: the engine's KV cache size in blocks of
	// kv_block_size (per data-parallel rank), as the engine reports it
	// (the cache_config_info num_gpu_blocks of vLLM, ATOM and the
	// simulator; SGLang's max_total_num_tokens over its page size); 0 or
	// absent when unknown. The kv-aware router prices room in the cache
	// with it before the engine's removal events have revealed as much.
	// Infera's Python readers ignore it.
	KVCapacityBlocks int `json:"kv_capacity_blocks,omitempty"`
}

// DecodeRecord parses and validates an etcd value. Unknown fields are ignored
// (Infera may add some); defaults are filled in so that every accepted record
// reads the same whichever implementation wrote it: status → active,
// engine → sglang (as Infera reads a record without one), dp_size 0 → 1,
// disagg_mode → mixed, request_transport → http, an empty kv_events_endpoint
// or kv_events_replay_endpoint → null, an unbracketed IPv6 host in url or
// the endpoints (Infera writes http://::1:28106) → bracketed. worker_id is
// kept as written, since it must match the key. Every error wraps
// ErrInvalidRecord.
func DecodeRecord(value []byte) (Record, error) {
	return decodeWire[Record](value, MaxRecordBytes, ErrInvalidRecord)
}

// Encode validates the record and returns its JSON value with defaults filled
// in (status, dp_size, disagg_mode, request_transport are always written so
// that Python readers need no defaults of their own).
func (r *Record) Encode() ([]byte, error) {
	return encodeWire(r, MaxRecordBytes, ErrInvalidRecord)
}

func (r *Record) keyID() (field, id string) { return "worker_id", r.WorkerID }

// Active reports whether the worker takes new requests.
func (r *Record) Active() bool {
	return (r.Status == StatusActive || r.Status == "") && r.Unroutable() == ""
}

// Unroutable says why the router cannot send requests to a valid worker at
// all, whatever its status: "" when it can. The reason is shown in
// /v1/workers and is the label of the unroutable-workers gauge.
func (r *Record) Unroutable() string {
	switch {
	case r.RequestTransport != "" && r.RequestTransport != TransportHTTP:
		return "unroutable: " + r.RequestTransport + " transport"
	case r.Status == StatusDead:
		return "unroutable: status dead"
	}
	return ""
}

// EffectiveDPSize returns dp_size with the wire default applied (0 means 1).
func (r *Record) EffectiveDPSize() int {
	if r.DPSize == 0 {
		return 1
	}
	return r.DPSize
}

// normalize applies the defaults readers of the wire format agree on, so that
// records decoded from either implementation compare equal.
func (r *Record) normalize() {
	if r.Status == "" {
		r.Status = StatusActive
	}
	if r.DPSize == 0 {
		r.DPSize = 1
	}
	if r.DisaggMode == "" {
		r.DisaggMode = DisaggMixed
	}
	if r.RequestTransport == "" {
		r.RequestTransport = TransportHTTP
	}
	if r.Engine == "" {
		r.Engine = EngineSGLang
	}
	if string(r.KV) == "null" {
		r.KV = nil
	} else if len(r.KV) > 0 {
		// Compact, as Encode writes it, so a round trip is stable.
		var buf bytes.Buffer
		if json.Compact(&buf, r.KV) == nil {
			r.KV = buf.Bytes()
		}
	}
	r.URL = bracketURL(r.URL)
	if r.KVEventsEndpoint != nil {
		if b := bracketURL(*r.KVEventsEndpoint); b != *r.KVEventsEndpoint {
			r.KVEventsEndpoint = &b
		}
	}
	if r.KVEventsReplayEndpoint != nil {
		if b := bracketURL(*r.KVEventsReplayEndpoint); b != *r.KVEventsReplayEndpoint {
			r.KVEventsReplayEndpoint = &b
		}
	}
	if r.KVEventsEndpoint != nil && *r.KVEventsEndpoint == "" {
		r.KVEventsEndpoint = nil
	}
	if r.KVEventsReplayEndpoint != nil && *r.KVEventsReplayEndpoint == "" {
		r.KVEventsReplayEndpoint = nil
	}
	if len(r.DisaggMeta.Params) == 0 {
		// {} and absent must read the same, or a decode/encode round trip
		// would not be stable.
		r.DisaggMeta.Params = nil
	}
}

// Validate checks every field against the wire format. Zero values that have
// a wire default (status, dp_size, disagg_mode, request_transport) are
// accepted. Errors wrap ErrInvalidRecord and name the offending field.
func (r *Record) Validate() error {
	if err := checkHostPort(r.WorkerID); err != nil {
		return invalidf("worker_id %q: %v", clip(r.WorkerID), err)
	}
	if err := checkURL(r.URL, r.WorkerID); err != nil {
		return invalidf("url %q: %v", clip(r.URL), err)
	}
	if err := checkText(r.ModelName, MaxModelNameBytes); err != nil {
		return invalidf("model_name: %v", err)
	}
	switch r.Engine {
	case "", EngineVLLM, EngineSGLang, EngineATOM, EngineSim:
	default:
		return invalidf("engine %q: want vllm, sglang, atom or sim", clip(r.Engine))
	}
	switch r.DisaggMode {
	case "", DisaggMixed, DisaggPrefill, DisaggDecode:
	default:
		return invalidf("disagg_mode %q: want mixed, prefill or decode", clip(string(r.DisaggMode)))
	}
	if p := r.DisaggMeta.Protocol; p != "" && !isToken(p, maxProtocolBytes) {
		return invalidf("disagg_meta.protocol %q: want up to %d characters of [a-z0-9._-]", clip(p), maxProtocolBytes)
	}
	if ep := r.KVEventsEndpoint; ep != nil && *ep != "" {
		if err := checkTCPEndpoint(*ep); err != nil {
			return invalidf("kv_events_endpoint %q: %v", clip(*ep), err)
		}
	}
	if ep := r.KVEventsReplayEndpoint; ep != nil && *ep != "" {
		if err := checkTCPEndpoint(*ep); err != nil {
			return invalidf("kv_events_replay_endpoint %q: %v", clip(*ep), err)
		}
	}
	if bs := r.KVBlockSize; bs != nil && (*bs <= 0 || *bs > MaxKVBlockSize) {
		return invalidf("kv_block_size %d: want 1..%d", *bs, MaxKVBlockSize)
	}
	if r.KVCapacityBlocks < 0 || r.KVCapacityBlocks > MaxKVCapacityBlocks {
		return invalidf("kv_capacity_blocks %d: want 0..%d", r.KVCapacityBlocks, MaxKVCapacityBlocks)
	}
	if r.DPSize < 0 || r.DPSize > MaxDPSize {
		return invalidf("dp_size %d: want 1..%d", r.DPSize, MaxDPSize)
	}
	if rank := r.DPRank; rank != nil && (*rank < 0 || *rank >= r.EffectiveDPSize()) {
		return invalidf("dp_rank %d: want 0..%d", *rank, r.EffectiveDPSize()-1)
	}
	if t := r.RequestTransport; t != "" && !isToken(t, maxProtocolBytes) {
		return invalidf("request_transport %q: want up to %d characters of [a-z0-9._-]", clip(t), maxProtocolBytes)
	}
	switch r.Status {
	case "", StatusActive, StatusDraining, StatusDead:
	default:
		return invalidf("status %q: want active, draining or dead", clip(string(r.Status)))
	}
	if len(r.KV) > 0 && (r.KV[0] != '{' || !json.Valid(r.KV)) {
		return invalidf("kv: want a JSON object")
	}
	if r.RealEngine != "" && !isToken(r.RealEngine, maxProtocolBytes) {
		return invalidf("real_engine %q: want up to %d characters of [a-z0-9._-]", clip(r.RealEngine), maxProtocolBytes)
	}
	if r.KVDPeer != "" {
		if err := checkHostPort(r.KVDPeer); err != nil {
			return invalidf("kvd_peer %q: %v", clip(r.KVDPeer), err)
		}
	}
	return nil
}

// wireRecord is a registry record type (Record, KVDRecord): a JSON value
// capped in size, normalized to the form readers agree on, then validated.
type wireRecord[T any] interface {
	*T
	normalize()
	Validate() error
	// keyID returns the record's id, the last element of its key, and
	// the JSON field that holds it.
	keyID() (field, id string)
}

// decodeWire parses value (at most limit bytes) as a T, normalizes and
// validates it; every error wraps invalid.
func decodeWire[T any, P wireRecord[T]](value []byte, limit int, invalid error) (T, error) {
	var r, zero T
	if len(value) > limit {
		return zero, fmt.Errorf("%w: %d bytes exceeds %d", invalid, len(value), limit)
	}
	if err := json.Unmarshal(value, &r); err != nil {
		return zero, fmt.Errorf("%w: decode json: %w", invalid, err)
	}
	P(&r).normalize()
	if err := P(&r).Validate(); err != nil {
		return zero, err
	}
	return r, nil
}

// decodeKeyed decodes a value listed or watched under prefix as
// decodeWire does, and also requires its key to be prefix plus the
// record's id: the key is what a delete event names, so a record stored
// under another key could never be removed from the view.
func decodeKeyed[T any, P wireRecord[T]](prefix, key string, value []byte, limit int, invalid error) (T, error) {
	r, err := decodeWire[T, P](value, limit, invalid)
	if err != nil {
		return r, err
	}
	if field, id := P(&r).keyID(); key != prefix+id {
		var zero T
		return zero, fmt.Errorf("%w: key does not end in %s %q", invalid, field, clip(id))
	}
	return r, nil
}

// encodeWire normalizes and validates a copy of *r and returns its JSON
// value, at most limit bytes; every error wraps invalid.
func encodeWire[T any, P wireRecord[T]](r P, limit int, invalid error) ([]byte, error) {
	c := *r
	P(&c).normalize()
	if err := P(&c).Validate(); err != nil {
		return nil, err
	}
	// Not json.Marshal: it would rewrite <, > and & inside the raw "kv"
	// block as \u escapes, so a record would not read back byte for byte.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&c); err != nil {
		return nil, fmt.Errorf("%w: encode json: %w", invalid, err)
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(b) > limit {
		return nil, fmt.Errorf("%w: encoded %d bytes exceeds %d", invalid, len(b), limit)
	}
	return b, nil
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRecord, fmt.Sprintf(format, args...))
}

// clip keeps error messages (and the log lines built from them) short when a
// hostile record carries a huge field.
func clip(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}

// checkHostPort accepts host:port where host is a DNS name or an IP literal
// (IPv6 in brackets, or without them as Infera writes it: ::1:28106) and
// port is 1..65535.
func checkHostPort(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > maxHostPortBytes {
		return fmt.Errorf("longer than %d bytes", maxHostPortBytes)
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return errors.New("want host:port")
	}
	host, port := s[:i], s[i+1:]
	if err := checkPort(port); err != nil {
		return err
	}
	if strings.HasPrefix(host, "[") {
		if !strings.HasSuffix(host, "]") {
			return errors.New("unterminated IPv6 literal")
		}
		a, err := netip.ParseAddr(host[1 : len(host)-1])
		if err != nil || !a.Is6() || a.Is4In6() {
			return errors.New("bad IPv6 literal")
		}
		return nil
	}
	if host == "" {
		return errors.New("empty host")
	}
	return checkHost(host)
}

// checkHost accepts a DNS name or an IP literal without port or brackets.
func checkHost(h string) error {
	if h == "" {
		return errors.New("empty")
	}
	if len(h) > maxHostPortBytes {
		return fmt.Errorf("longer than %d bytes", maxHostPortBytes)
	}
	if strings.IndexByte(h, ':') >= 0 {
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is6() || a.Is4In6() || a.Zone() != "" {
			return errors.New("bad IPv6 address")
		}
		return nil
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("bad host character %q", c)
		}
	}
	return nil
}

func checkPort(p string) error {
	// ParseUint would accept neither sign nor spaces, but it does accept
	// leading zeros; those are harmless because worker_id and url are compared
	// as strings.
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return fmt.Errorf("bad port %q", clip(p))
	}
	return nil
}

// checkURL accepts http(s)://<workerID> with an empty or "/" path: the
// router derives request URLs from it, so anything else would be ambiguous.
func checkURL(s, workerID string) error {
	if len(s) > maxHostPortBytes+len("https:///") {
		return errors.New("too long")
	}
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("scheme must be http or https")
	}
	if u.Opaque != "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return errors.New("must be scheme://host:port only")
	}
	if u.Path != "" && u.Path != "/" {
		return errors.New("must not have a path")
	}
	if u.Host != bracketHostPort(workerID) {
		return errors.New("host:port differs from worker_id")
	}
	return nil
}

// checkTCPEndpoint accepts the ZMQ publisher address tcp://host:port.
func checkTCPEndpoint(s string) error {
	rest, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return errors.New("want tcp://host:port")
	}
	return checkHostPort(rest)
}

// checkText accepts non-empty valid UTF-8 without control characters (the
// value lands in logs, headers and metrics labels).
func checkText(s string, max int) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > max {
		return fmt.Errorf("longer than %d bytes", max)
	}
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f {
			return errors.New("contains control characters")
		}
	}
	return nil
}

func isToken(s string, max int) bool {
	if len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// bracketHostPort writes host:port with an unbracketed IPv6 host (::1:28106)
// in the form URLs and dialers need ([::1]:28106); anything else is returned
// as is.
func bracketHostPort(hp string) string {
	if strings.HasPrefix(hp, "[") || strings.Count(hp, ":") < 2 {
		return hp
	}
	i := strings.LastIndexByte(hp, ':')
	if a, err := netip.ParseAddr(hp[:i]); err != nil || !a.Is6() {
		return hp
	}
	return "[" + hp[:i] + "]" + hp[i:]
}

// bracketURL brackets an unbracketed IPv6 host in scheme://host:port.
func bracketURL(s string) string {
	i := strings.Index(s, "://")
	if i < 0 {
		return s
	}
	rest := s[i+3:]
	end := strings.IndexByte(rest, '/')
	if end < 0 {
		end = len(rest)
	}
	b := bracketHostPort(rest[:end])
	if b == rest[:end] {
		return s
	}
	return s[:i+3] + b + rest[end:]
}
