package config

import (
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// Sim configures `infera sim`, the GPU-free engine. Its timing model is
//
//	step time = (step-overhead-ms + prefill tokens/prefill-tokens-per-s
//	             + decoding sequences × decode-ms-per-token) × time-scale
//
// so that a batch costs more than a single sequence, uncached prompt tokens
// cost more than cached ones, and tests can run the same model faster.
type Sim struct {
	Log Log

	Host            string
	Port            int
	Model           string
	ServedModelName string
	MaxModelLen     int

	BlockSize           int
	KVBlocks            int
	MaxNumSeqs          int
	MaxNumBatchedTokens int

	PrefillTokensPerS float64
	DecodeMsPerToken  float64
	StepOverheadMs    float64
	TimeScale         float64

	Seed             int64
	MaxTokensDefault int

	ErrorRate            float64
	HangBeforeFirstToken float64
	DieAfterTokens       int64
	SlowStart            time.Duration

	// Tokenizer is "bytes" or a Hugging Face tokenizer directory; sharing
	// the router's directory makes both compute the same token ids.
	Tokenizer string

	// KV events (DESIGN §7): a ZMQ PUB socket publishing the prefix
	// cache's BlockStored/BlockRemoved/AllBlocksCleared batches in the
	// imitated engine's encoding, and a ROUTER socket replaying the last
	// KVEventsBuffer batches. An empty endpoint disables each.
	KVEventsEndpoint       string
	KVEventsReplayEndpoint string
	KVEventsFormat         string
	KVEventsTopic          string
	KVEventsBuffer         int
	// KVEventsConnect makes the PUB socket connect to KVEventsEndpoint
	// (a central SUB listener, `infera serve --kv-events-listen`) instead
	// of binding it, as vLLM does when its endpoint has no wildcard.
	KVEventsConnect bool
	// KVEventsDelay publishes every batch this long after the step that
	// produced it (an engine's publisher latency; tests of the
	// event-latency window). Replay serves a batch at once.
	KVEventsDelay time.Duration

	// Disaggregated prefill/decode roles (DESIGN §8, sim/pd.go). PDRole is
	// "" (whole requests), "prefill" or "decode"; PDProtocol the PD
	// protocol whose request shapes the role understands. A prefill
	// serves its requests' KV over transport TCP on PDKVPort (0: a free
	// port), advertised as PDKVHost (default: --host, or 127.0.0.1 when
	// that is a wildcard), for PDKVTTL; a decode waits up to PDKVTimeout
	// for the KV a request names. PDEngineID is the engine id a vLLM
	// prefill hands off.
	PDRole      string
	PDProtocol  string
	PDKVHost    string
	PDKVPort    int
	PDKVTTL     time.Duration
	PDKVTimeout time.Duration
	PDEngineID  string
	// PDDPSize is the data-parallel ranks of a PD role (SGLang --dp-size
	// through the facade): an sglang-bootstrap prefill with more than one
	// serves a request's KV on the rank its X-Data-Parallel-Rank names
	// (else bootstrap_room % PDDPSize), and refuses a room not congruent
	// to that rank; its decode finds the KV on disagg_prefill_dp_rank.
	PDDPSize int
	// RecordRequests appends every completion request received (path,
	// PD headers, traceparent, body) as one JSON line to this file; "" = off.
	RecordRequests string
	// ModelTTFTLog writes one JSON line per request at its first token
	// (request id, prompt and cached tokens, modelled TTFT and the model
	// clock, sim/modelttft.go) to this file, created or truncated; "" = off.
	ModelTTFTLog string

	// KVD is kvd as a second-level cache (--kvd-*).
	KVD SimKVD

	// Flavor is the engine the simulator's command line, metrics and
	// events imitate: "" (its own flags, vLLM names), vllm, sglang or atom.
	// With a flavor, the arguments after --flavor are the engine's own
	// command line (sim.ApplyFacade).
	Flavor string
	// DPRank is the data-parallel rank the engine reports in its event
	// batches (vLLM --data-parallel-rank through the facade; no flag).
	DPRank int
}

// Simulator facades (--flavor).
const (
	FlavorVLLM   = "vllm"
	FlavorSGLang = "sglang"
	FlavorATOM   = "atom"
)

// KV-event encodings the simulator publishes (--kv-events-format).
const (
	KVFormatVLLM      = "vllm"       // vLLM batch, events as tagged maps
	KVFormatVLLMArray = "vllm-array" // vLLM batch, events as msgspec tagged arrays
	KVFormatSGLang    = "sglang"     // SGLang: tagged arrays, one block per event, int64 hashes
)

// DefaultSim returns the sim configuration with every flag at its default,
// for in-process use (tests of other packages start a sim this way).
func DefaultSim() Sim {
	var s Sim
	s.Flags()
	return s
}

// Flags returns the sim flags, binding each to its field.
func (s *Sim) Flags() []cli.Flag {
	served := String("served-model-name", "name clients must use in \"model\"", &s.ServedModelName, "")
	served.DefaultText = "the --model value"
	flags := s.Log.Flags()
	flags = append(flags, s.KVD.flags()...)
	return append(flags,
		String("host", "address to listen on", &s.Host, "127.0.0.1"),
		Int("port", "port to listen on (0 picks a free port; the bound address is logged)", &s.Port, 8100),
		String("model", "model the engine pretends to serve", &s.Model, "sim-model"),
		served,
		Int("max-model-len", "context length: prompt plus completion tokens", &s.MaxModelLen, 8192),
		Int("block-size", "KV-cache block size in tokens", &s.BlockSize, 16),
		Int("kv-blocks", "KV-cache capacity in blocks", &s.KVBlocks, 4096),
		Int("max-num-seqs", "most sequences in one batch; the rest wait", &s.MaxNumSeqs, 256),
		Int("max-num-batched-tokens", "token budget of one step (decode tokens plus prefill chunks)", &s.MaxNumBatchedTokens, 2048),
		Float("prefill-tokens-per-s", "prefill speed for uncached prompt tokens", &s.PrefillTokensPerS, 10000),
		Float("decode-ms-per-token", "decode cost per running sequence per step, in ms", &s.DecodeMsPerToken, 0.1),
		Float("step-overhead-ms", "fixed cost of every step, in ms", &s.StepOverheadMs, 5),
		Float("time-scale", "multiplies every simulated step time; 0 runs without sleeping (zero-latency mode)", &s.TimeScale, 1),
		Int64("seed", "seed of the deterministic generated text", &s.Seed, 0),
		Int("max-tokens-default", "completion tokens when the request sets no max_tokens", &s.MaxTokensDefault, 16),
		Float("error-rate", "fraction of completion requests answered with HTTP 500", &s.ErrorRate, 0),
		Float("hang-before-first-token", "fraction of completion requests that never produce a token until the client goes away", &s.HangBeforeFirstToken, 0),
		Int64("die-after-tokens", "exit the process with code 1 after streaming this many tokens in total (0 = never)", &s.DieAfterTokens, 0),
		Duration("slow-start", "time after start before /health and the API answer 200 (wall time, not scaled)", &s.SlowStart, 0),
		String("tokenizer", "\"bytes\" (one token per byte) or a Hugging Face tokenizer directory (tokenizer.json, chat template)", &s.Tokenizer, "bytes"),
		String("kv-events-endpoint", "ZMQ PUB bind address for KV-cache events, e.g. tcp://*:5557 (port 0 picks a free port; empty = no events)", &s.KVEventsEndpoint, ""),
		String("kv-events-replay-endpoint", "ZMQ ROUTER bind address serving buffered KV-event batches for gap recovery, e.g. tcp://*:5558 (empty = none)", &s.KVEventsReplayEndpoint, ""),
		String("kv-events-format", "KV-event encoding: vllm (tagged maps), vllm-array (msgspec tagged arrays) or sglang", &s.KVEventsFormat, KVFormatVLLM),
		String("kv-events-topic", "ZMQ topic frame of every KV-event message", &s.KVEventsTopic, "kv-events"),
		Int("kv-events-buffer", "KV-event batches kept for replay (and queued per subscriber before it drops)", &s.KVEventsBuffer, 10000),
		Bool("kv-events-connect", "connect the KV-event PUB socket to --kv-events-endpoint (a router's --kv-events-listen) instead of binding it", &s.KVEventsConnect, false),
		Duration("kv-events-delay", "publish each KV-event batch this long after its step (simulated publisher latency; replay is not delayed)", &s.KVEventsDelay, 0),
		String("pd-role", "disaggregated serving role: \"\" (whole requests), prefill or decode", &s.PDRole, ""),
		String("pd-protocol", "PD protocol of the role: vllm-nixl, vllm-mooncake, vllm-mori-read, vllm-mori-write, sglang-bootstrap or atom-mooncake", &s.PDProtocol, ""),
		String("pd-kv-host", "host a prefill advertises for its KV transfer server (default: --host, 127.0.0.1 for a wildcard)", &s.PDKVHost, ""),
		Int("pd-kv-port", "port of a prefill's KV transfer server (transport TCP; 0 picks a free port)", &s.PDKVPort, 0),
		Duration("pd-kv-ttl", "how long a prefill keeps a request's KV for its decode", &s.PDKVTTL, 60*time.Second),
		Duration("pd-kv-timeout", "longest wait of a decode for the KV its request names (then HTTP 500)", &s.PDKVTimeout, 30*time.Second),
		String("pd-engine-id", "engine id a vLLM-flavoured prefill hands off (kv_transfer_params.remote_engine_id)", &s.PDEngineID, "sim-engine"),
		Int("pd-dp-size", "data-parallel ranks of an sglang-bootstrap PD role: the prefill serves KV per rank (X-Data-Parallel-Rank, else bootstrap_room % size) and refuses rooms not aligned to it", &s.PDDPSize, 1),
		String("record-requests", "append every completion request received (path, PD headers, W3C traceparent, body) as a JSON line to this file", &s.RecordRequests, ""),
		modelTTFTLogFlag(&s.ModelTTFTLog),
		String("flavor", "imitate an engine's command line, metrics and events: vllm, sglang or atom; must be the last sim flag, the engine's own arguments follow it (e.g. --flavor vllm serve MODEL --port 8000)", &s.Flavor, ""),
	)
}

// Finish copies slice flags out of the parsed command line; sim has none.
func (s *Sim) Finish(*cli.Context) {}

// Name is the model name clients must send.
func (s *Sim) Name() string {
	if s.ServedModelName != "" {
		return s.ServedModelName
	}
	return s.Model
}

// Validate reports every problem of the sim configuration at once.
func (s *Sim) Validate() error {
	var p Problems
	s.Log.Validate(&p)
	if s.Host == "" {
		p.Addf("--host must not be empty")
	}
	if s.Port < 0 || s.Port > 65535 {
		p.Addf("--port %d: want 0..65535", s.Port)
	}
	if s.Model == "" {
		p.Addf("--model must not be empty")
	}
	if s.MaxModelLen < 2 {
		p.Addf("--max-model-len %d: want at least 2", s.MaxModelLen)
	}
	if s.BlockSize < 1 || s.BlockSize > 1024 {
		p.Addf("--block-size %d: want 1..1024", s.BlockSize)
	}
	if s.KVBlocks < 1 {
		p.Addf("--kv-blocks %d: want at least 1", s.KVBlocks)
	}
	// Admission reserves a sequence's blocks up front, so one sequence of
	// max-model-len tokens must fit, or it would wait forever.
	if s.BlockSize >= 1 && s.KVBlocks >= 1 && s.MaxModelLen >= 2 &&
		int64(s.KVBlocks)*int64(s.BlockSize) < int64(s.MaxModelLen) {
		p.Addf("--kv-blocks %d × --block-size %d = %d tokens: must hold --max-model-len %d",
			s.KVBlocks, s.BlockSize, int64(s.KVBlocks)*int64(s.BlockSize), s.MaxModelLen)
	}
	if s.MaxNumSeqs < 1 {
		p.Addf("--max-num-seqs %d: want at least 1", s.MaxNumSeqs)
	}
	if s.MaxNumBatchedTokens < 1 {
		p.Addf("--max-num-batched-tokens %d: want at least 1", s.MaxNumBatchedTokens)
	}
	if !simFinite(s.PrefillTokensPerS) || s.PrefillTokensPerS <= 0 {
		p.Addf("--prefill-tokens-per-s %v: want a positive number", s.PrefillTokensPerS)
	}
	simNonNegative(&p, "--decode-ms-per-token", s.DecodeMsPerToken)
	simNonNegative(&p, "--step-overhead-ms", s.StepOverheadMs)
	simNonNegative(&p, "--time-scale", s.TimeScale)
	if s.MaxTokensDefault < 1 {
		p.Addf("--max-tokens-default %d: want at least 1", s.MaxTokensDefault)
	}
	simFraction(&p, "--error-rate", s.ErrorRate)
	simFraction(&p, "--hang-before-first-token", s.HangBeforeFirstToken)
	if s.DieAfterTokens < 0 {
		p.Addf("--die-after-tokens %d: want 0 (never) or more", s.DieAfterTokens)
	}
	if s.SlowStart < 0 {
		p.Addf("--slow-start %v: must not be negative", s.SlowStart)
	}
	if s.Tokenizer == "" {
		p.Addf("--tokenizer must be \"bytes\" or a directory")
	}
	s.validateKVEvents(&p)
	switch s.Flavor {
	case "", FlavorVLLM, FlavorSGLang, FlavorATOM:
	default:
		p.Addf("--flavor %q: want vllm, sglang or atom", s.Flavor)
	}
	if s.DPRank < 0 || s.DPRank > 65535 {
		p.Addf("data-parallel rank %d: want 0..65535", s.DPRank)
	}
	s.validatePD(&p)
	s.KVD.validate(&p)
	if s.ModelTTFTLog != "" {
		if st, err := os.Stat(filepath.Dir(s.ModelTTFTLog)); err != nil || !st.IsDir() {
			p.Addf("--model-ttft-log %q: its directory must exist", s.ModelTTFTLog)
		}
	}
	return p.Err()
}

// maxKVEventsBuffer bounds the replay buffer: each batch holds a step's
// events, so a larger buffer is memory an operator did not mean to spend.
const maxKVEventsBuffer = 1 << 20

func (s *Sim) validateKVEvents(p *Problems) {
	simEndpoint(p, "--kv-events-endpoint", s.KVEventsEndpoint)
	simEndpoint(p, "--kv-events-replay-endpoint", s.KVEventsReplayEndpoint)
	if s.KVEventsReplayEndpoint != "" && s.KVEventsEndpoint == "" {
		p.Addf("--kv-events-replay-endpoint needs --kv-events-endpoint")
	}
	switch s.KVEventsFormat {
	case KVFormatVLLM, KVFormatVLLMArray, KVFormatSGLang:
	default:
		p.Addf("--kv-events-format %q: want vllm, vllm-array or sglang", s.KVEventsFormat)
	}
	if len(s.KVEventsTopic) > 255 {
		p.Addf("--kv-events-topic: %d bytes, want at most 255", len(s.KVEventsTopic))
	}
	if s.KVEventsConnect && (s.KVEventsEndpoint == "" || strings.Contains(s.KVEventsEndpoint, "*") || strings.HasSuffix(s.KVEventsEndpoint, ":0")) {
		p.Addf("--kv-events-connect needs --kv-events-endpoint tcp://HOST:PORT with a host and a port to connect to")
	}
	if s.KVEventsDelay < 0 || s.KVEventsDelay > time.Minute {
		p.Addf("--kv-events-delay %s: want 0..1m", s.KVEventsDelay)
	}
	if s.KVEventsBuffer < 1 || s.KVEventsBuffer > maxKVEventsBuffer {
		p.Addf("--kv-events-buffer %d: want 1..%d", s.KVEventsBuffer, maxKVEventsBuffer)
	}
}

// simEndpoint checks a ZMQ bind endpoint tcp://HOST:PORT; HOST may be * (all
// interfaces) and PORT 0 (a free port). Empty means disabled.
func simEndpoint(p *Problems, flag, v string) {
	if v == "" {
		return
	}
	rest, ok := strings.CutPrefix(v, "tcp://")
	if !ok {
		p.Addf("%s %q: want tcp://HOST:PORT", flag, v)
		return
	}
	_, port, err := net.SplitHostPort(rest)
	if err != nil {
		p.Addf("%s %q: %v", flag, v, err)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		p.Addf("%s %q: port must be 0..65535", flag, v)
	}
}

func simFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func simNonNegative(p *Problems, flag string, v float64) {
	if !simFinite(v) || v < 0 {
		p.Addf("%s %v: want a finite number ≥ 0", flag, v)
	}
}

func simFraction(p *Problems, flag string, v float64) {
	if !simFinite(v) || v < 0 || v > 1 {
		p.Addf("%s %v: want a fraction in [0, 1]", flag, v)
	}
}

// modelTTFTLogFlag is --model-ttft-log, read from INFERA_MODEL_TTFT_LOG as
// every flag is, and from INFERA_SIM_MODEL_TTFT_LOG, the name issue 37
// gives it (the sim's output, not a setting shared with serve or worker).
func modelTTFTLogFlag(dest *string) cli.Flag {
	f := String("model-ttft-log", "write one JSON line per request at its first token to this file (created or truncated): request_id, prompt_tokens, cached_tokens, model_ttft_s (the step model's time to first token, before --time-scale, independent of the box's load), model_admit_wait_s (the part of it spent waiting for blocks or a batch slot), model_idle_ttft_s (the same request's alone on an idle engine: its floor given its cache hits) and model_clock_s", dest, "")
	f.EnvVars = append(f.EnvVars, "INFERA_SIM_MODEL_TTFT_LOG")
	return f
}

// PD roles and protocols the simulator models.
const (
	PDRolePrefill = "prefill"
	PDRoleDecode  = "decode"
)

func (s *Sim) validatePD(p *Problems) {
	switch s.PDRole {
	case "":
		return
	case PDRolePrefill, PDRoleDecode:
	default:
		p.Addf("--pd-role %q: want prefill or decode", s.PDRole)
	}
	switch s.PDProtocol {
	case "vllm-nixl", "vllm-mooncake", "vllm-mori-read", "vllm-mori-write", "sglang-bootstrap", "atom-mooncake":
	default:
		p.Addf("--pd-protocol %q: want vllm-nixl, vllm-mooncake, vllm-mori-read, vllm-mori-write, sglang-bootstrap or atom-mooncake for --pd-role %s", s.PDProtocol, s.PDRole)
	}
	if s.PDKVPort < 0 || s.PDKVPort > 65535 {
		p.Addf("--pd-kv-port %d: want 0..65535", s.PDKVPort)
	}
	if s.PDDPSize < 1 || s.PDDPSize > 64 {
		p.Addf("--pd-dp-size %d: want 1..64", s.PDDPSize)
	}
	if s.PDKVTTL <= 0 || s.PDKVTimeout <= 0 {
		p.Addf("--pd-kv-ttl and --pd-kv-timeout must be positive")
	}
}
