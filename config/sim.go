package config

import (
	"math"
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
}

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
	return p.Err()
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
