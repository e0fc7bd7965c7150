package config

import (
	"math"
	"net/url"
	"time"

	"github.com/urfave/cli/v2"
)

// Bench configures `infera bench`, the load generator.
type Bench struct {
	Log Log

	URLs     []string
	Model    string
	APIKey   string
	Endpoint string
	Stream   bool
	Seed     int64

	Requests    int
	Duration    time.Duration
	Concurrency int
	Rate        float64
	MaxInflight int
	Timeout     time.Duration

	Workload        string
	InputLen        int
	OutputLen       int
	LenSpread       float64
	PrefixGroups    int
	PrefixLen       int
	SuffixLen       int
	Sessions        int
	Turns           int
	Trace           string
	TraceTimeScale  float64
	TraceLimit      int
	TraceBlockWords int
	IgnoreEOS       bool

	JSON     string
	Plot     string
	Label    string
	Progress bool
}

// Flags returns the bench flags.
func (b *Bench) Flags() []cli.Flag {
	return append(b.Log.Flags(),
		StringSlice("url", "base URL of an OpenAI-compatible server (with or without /v1); several (comma-separated or repeated) are loaded in turn", []string{"http://127.0.0.1:8000"}),
		String("model", "model name to request; empty uses the first model of GET /v1/models", &b.Model, ""),
		String("api-key", "bearer token sent as Authorization", &b.APIKey, ""),
		String("endpoint", "API to load: chat (/v1/chat/completions) or completions (/v1/completions)", &b.Endpoint, "chat"),
		Bool("stream", "stream responses (SSE) and measure TTFT and inter-token latency", &b.Stream, true),
		Int64("seed", "seed of the prompts, lengths and arrival times", &b.Seed, 0),
		Int("requests", "stop after this many requests (0: no limit; a trace stops at its end; --workload trace without --requests replays the whole trace, or --trace-limit records)", &b.Requests, 200),
		Duration("duration", "stop sending new requests after this long (0: no limit)", &b.Duration, 0),
		Int("concurrency", "closed-loop workers, each sending its next request when the last one ends", &b.Concurrency, 16),
		Float("rate", "Poisson open loop at this many requests/s instead of the closed loop (0: closed loop)", &b.Rate, 0),
		Int("max-inflight", "cap on requests in flight in an open loop (--rate or trace timestamps)", &b.MaxInflight, 1024),
		Duration("timeout", "per-request limit, from sending to the last byte", &b.Timeout, 60*time.Second),
		String("workload", "random, shared-prefix, multi-turn, conversation (sessions shaped by published chat-trace statistics: bench/conversation.go) or trace", &b.Workload, "random"),
		Int("input-len", "prompt length in words (≈ tokens) for random and multi-turn user turns", &b.InputLen, 256),
		Int("output-len", "max_tokens of each request (multi-turn: also the synthetic assistant reply length)", &b.OutputLen, 64),
		Float("len-spread", "draw input/output lengths uniformly within ±this fraction of the nominal length", &b.LenSpread, 0),
		Int("prefix-groups", "shared-prefix: number of groups, each with its own shared prefix", &b.PrefixGroups, 4),
		Int("prefix-len", "shared-prefix: words in each group's shared prefix", &b.PrefixLen, 512),
		Int("suffix-len", "shared-prefix: words after the prefix, unique per request", &b.SuffixLen, 64),
		Int("sessions", "multi-turn: concurrent conversations", &b.Sessions, 8),
		Int("turns", "multi-turn: turns per conversation, each resending the conversation so far", &b.Turns, 4),
		String("trace", "trace: Mooncake jsonl file (timestamp ms, input_length, output_length, hash_ids)", &b.Trace, ""),
		Float("trace-time-scale", "trace: multiply timestamps by this (0.5 = twice as fast; 0 = ignore them and use --concurrency or --rate)", &b.TraceTimeScale, 1),
		Int("trace-limit", "trace: use only the first N records (0: all)", &b.TraceLimit, 0),
		Int("trace-block-words", "trace: words per hash id block (0: 512, the trace's own size); smaller replays the sharing pattern at a smaller scale", &b.TraceBlockWords, 0),
		Bool("ignore-eos", "send ignore_eos so vLLM-like engines generate exactly max_tokens", &b.IgnoreEOS, false),
		String("json", "write the report as JSON to this file", &b.JSON, ""),
		String("plot", "write the TTFT CDF as SVG to this file", &b.Plot, ""),
		String("label", "name of this run in plots; empty means workload@host", &b.Label, ""),
		Bool("progress", "print a progress line to stderr every second", &b.Progress, true),
	)
}

// Finish copies slice flags out of the parsed command line.
func (b *Bench) Finish(c *cli.Context) {
	b.URLs = SplitList(c.StringSlice("url"))
	// A trace replay ends with the trace (or --trace-limit): the default of
	// 200 requests would silently cut it short.
	if b.Workload == "trace" && !c.IsSet("requests") {
		b.Requests = 0
	}
}

// Validate reports every bench flag problem at once.
func (b *Bench) Validate() error {
	var p Problems
	b.Log.Validate(&p)
	if len(b.URLs) == 0 {
		p.Addf("--url: at least one base URL is needed")
	}
	for _, raw := range b.URLs {
		if u, err := url.Parse(raw); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			p.Addf("--url %q: want http(s)://host[:port][/path]", raw)
		}
	}
	if b.Endpoint != "chat" && b.Endpoint != "completions" {
		p.Addf("--endpoint %q: want chat or completions", b.Endpoint)
	}
	if b.Requests < 0 {
		p.Addf("--requests must be >= 0")
	}
	if b.Duration < 0 {
		p.Addf("--duration must be >= 0")
	}
	if b.Requests == 0 && b.Duration == 0 && b.Workload != "trace" {
		p.Addf("--requests 0 needs --duration (or the trace workload)")
	}
	if b.Concurrency < 1 || b.Concurrency > 100000 {
		p.Addf("--concurrency %d: want 1..100000", b.Concurrency)
	}
	if !finiteAtLeast(b.Rate, 0) {
		p.Addf("--rate %v: want a finite number >= 0", b.Rate)
	}
	if b.MaxInflight < 1 || b.MaxInflight > 100000 {
		p.Addf("--max-inflight %d: want 1..100000", b.MaxInflight)
	}
	if b.Timeout <= 0 {
		p.Addf("--timeout must be positive")
	}
	if b.InputLen < 1 || b.InputLen > 4<<20 {
		p.Addf("--input-len %d: want 1..%d", b.InputLen, 4<<20)
	}
	if b.OutputLen < 1 || b.OutputLen > 1<<20 {
		p.Addf("--output-len %d: want 1..%d", b.OutputLen, 1<<20)
	}
	if !finiteAtLeast(b.LenSpread, 0) || b.LenSpread >= 1 {
		p.Addf("--len-spread %v: want 0 <= x < 1", b.LenSpread)
	}
	switch b.Workload {
	case "random":
	case "shared-prefix":
		if b.PrefixGroups < 1 || b.PrefixGroups > 1<<20 {
			p.Addf("--prefix-groups %d: want 1..%d", b.PrefixGroups, 1<<20)
		}
		if b.PrefixLen < 1 || b.PrefixLen > 4<<20 {
			p.Addf("--prefix-len %d: want 1..%d", b.PrefixLen, 4<<20)
		}
		if b.SuffixLen < 0 || b.SuffixLen > 4<<20 {
			p.Addf("--suffix-len %d: want 0..%d", b.SuffixLen, 4<<20)
		}
	case "multi-turn":
		if b.Sessions < 1 || b.Sessions > 100000 {
			p.Addf("--sessions %d: want 1..100000", b.Sessions)
		}
		if b.Turns < 1 || b.Turns > 1000 {
			p.Addf("--turns %d: want 1..1000", b.Turns)
		}
	case "trace":
		if b.Trace == "" {
			p.Addf("--workload trace needs --trace FILE")
		}
		if b.TraceTimeScale > 0 && b.Rate > 0 {
			p.Addf("--rate conflicts with the trace's timestamps: add --trace-time-scale 0 to use --rate")
		}
	case "conversation":
	default:
		p.Addf("--workload %q: want random, shared-prefix, multi-turn, conversation or trace", b.Workload)
	}
	if !finiteAtLeast(b.TraceTimeScale, 0) {
		p.Addf("--trace-time-scale %v: want a finite number >= 0", b.TraceTimeScale)
	}
	if b.TraceBlockWords < 0 || b.TraceBlockWords > 512 {
		p.Addf("--trace-block-words %d: want 0..512", b.TraceBlockWords)
	}
	if b.TraceLimit < 0 {
		p.Addf("--trace-limit must be >= 0")
	}
	return p.Err()
}

func finiteAtLeast(v, lo float64) bool {
	return !math.IsNaN(v) && !math.IsInf(v, 0) && v >= lo
}

// BenchPlot configures `infera bench plot`, which draws the TTFT CDFs of
// several JSON reports on one chart.
type BenchPlot struct {
	Output string
	Title  string
}

// Flags returns the bench plot flags.
func (b *BenchPlot) Flags() []cli.Flag {
	out := String("output", "SVG file to write", &b.Output, "ttft-cdf.svg")
	out.Aliases = []string{"o"}
	return []cli.Flag{
		out,
		String("title", "chart title", &b.Title, "TTFT CDF"),
	}
}

// Validate reports bench plot flag problems.
func (b *BenchPlot) Validate() error {
	var p Problems
	if b.Output == "" {
		p.Addf("--output must not be empty")
	}
	return p.Err()
}
