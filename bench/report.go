package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrInvalidReport is wrapped by errors reading a JSON report back.
var ErrInvalidReport = errors.New("invalid bench report")

// Report is the outcome of a run. Its JSON form is the documented schema:
// config, requests, errors, duration_s, throughput, ttft_ms, itl_ms, tpot_ms,
// e2e_ms, cache_hit_ratio, per_worker, plus ttft_cdf_ms (the TTFT CDF as
// [ms, fraction] pairs) so that `infera bench plot` can redraw it.
type Report struct {
	Config ConfigEcho `json:"config"`
	// Requests counts the requests sent, successful or not.
	Requests int `json:"requests"`
	// Errors counts failed requests by kind (see the Kind constants).
	Errors map[string]int `json:"errors"`
	// DurationS is the wall time from the start of the run to the last answer.
	DurationS  float64    `json:"duration_s"`
	Throughput Throughput `json:"throughput"`
	TTFT       Summary    `json:"ttft_ms"`
	ITL        Summary    `json:"itl_ms"`
	TPOT       Summary    `json:"tpot_ms"`
	E2E        Summary    `json:"e2e_ms"`
	// CacheHitRatio is cached prompt tokens / prompt tokens over successful requests.
	CacheHitRatio float64 `json:"cache_hit_ratio"`
	// PerWorker counts answers by the X-Infera-Worker header.
	PerWorker map[string]int `json:"per_worker"`
	TTFTCDF   [][2]float64   `json:"ttft_cdf_ms"`

	// Not part of the JSON schema; shown in the text table.
	Completed    int               `json:"-"`
	PromptTokens int64             `json:"-"`
	OutputTokens int64             `json:"-"`
	CachedTokens int64             `json:"-"`
	ErrorSamples map[string]string `json:"-"`
}

// Throughput is per second of DurationS, over successful requests.
type Throughput struct {
	ReqPerS       float64 `json:"req_per_s"`
	InputTokPerS  float64 `json:"input_tok_per_s"`
	OutputTokPerS float64 `json:"output_tok_per_s"`
}

// ConfigEcho records what was run (never the API key).
type ConfigEcho struct {
	Label string `json:"label"`
	// URL lists the base URLs, comma-separated when there are several.
	URL             string  `json:"url"`
	Model           string  `json:"model"`
	Endpoint        string  `json:"endpoint"`
	Stream          bool    `json:"stream"`
	Seed            int64   `json:"seed"`
	Workload        string  `json:"workload"`
	Requests        int     `json:"requests"`
	DurationS       float64 `json:"duration_s"`
	Concurrency     int     `json:"concurrency"`
	Rate            float64 `json:"rate"`
	MaxInflight     int     `json:"max_inflight"`
	TimeoutS        float64 `json:"timeout_s"`
	InputLen        int     `json:"input_len"`
	OutputLen       int     `json:"output_len"`
	LenSpread       float64 `json:"len_spread"`
	PrefixGroups    int     `json:"prefix_groups"`
	PrefixLen       int     `json:"prefix_len"`
	SuffixLen       int     `json:"suffix_len"`
	Sessions        int     `json:"sessions"`
	Turns           int     `json:"turns"`
	Trace           string  `json:"trace"`
	TraceTimeScale  float64 `json:"trace_time_scale"`
	TraceLimit      int     `json:"trace_limit"`
	TraceBlockWords int     `json:"trace_block_words"`
	IgnoreEOS       bool    `json:"ignore_eos"`
}

func echo(o *Options) ConfigEcho {
	label := o.Label
	if label == "" {
		label = o.Workload
		if len(o.URLs) > 0 {
			if u, err := url.Parse(o.URLs[0]); err == nil && u.Host != "" {
				label += "@" + u.Host
			}
		}
	}
	return ConfigEcho{
		Label: label, URL: strings.Join(o.URLs, ","), Model: o.Model, Endpoint: o.Endpoint, Stream: o.Stream, Seed: o.Seed,
		Workload: o.Workload, Requests: o.Requests, DurationS: o.Duration.Seconds(), Concurrency: o.Concurrency,
		Rate: o.Rate, MaxInflight: o.MaxInflight, TimeoutS: o.Timeout.Seconds(), InputLen: o.InputLen,
		OutputLen: o.OutputLen, LenSpread: o.LenSpread, PrefixGroups: o.PrefixGroups, PrefixLen: o.PrefixLen,
		SuffixLen: o.SuffixLen, Sessions: o.Sessions, Turns: o.Turns, Trace: o.TracePath,
		TraceTimeScale: o.TraceTimeScale, TraceLimit: o.TraceLimit, TraceBlockWords: o.TraceBlockWords, IgnoreEOS: o.IgnoreEOS,
	}
}

// collector merges results under a mutex, once per request.
type collector struct {
	mu        sync.Mutex
	ttft      []float64
	itl       []float64
	tpot      []float64
	e2e       []float64
	completed int
	failed    int
	errors    map[string]int
	samples   map[string]string
	perWorker map[string]int
	prompt    int64
	output    int64
	cached    int64
	last      time.Time
}

func newCollector() *collector {
	return &collector{errors: map[string]int{}, samples: map[string]string{}, perWorker: map[string]int{}}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (c *collector) add(res *result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if res.end.After(c.last) {
		c.last = res.end
	}
	if res.worker != "" {
		c.perWorker[res.worker]++
	}
	if res.kind != "" {
		c.failLocked(res.kind, res.message)
		return
	}
	c.completed++
	c.e2e = append(c.e2e, ms(res.end.Sub(res.start)))
	out := int64(res.chunks)
	prompt := int64(res.words)
	if res.haveUsage {
		out, prompt = res.outputTokens, res.promptTokens
		c.cached += res.cached
	}
	c.prompt += prompt
	c.output += out
	if !res.firstToken.IsZero() {
		ttft := res.firstToken.Sub(res.start)
		c.ttft = append(c.ttft, ms(ttft))
		c.itl = append(c.itl, res.itl...)
		// TPOT as vLLM defines it: the decode time spread over the tokens
		// after the first. A unary answer has no decode time to measure.
		if res.chunks > 0 && res.lastToken.After(res.firstToken) && out > 1 {
			c.tpot = append(c.tpot, ms(res.end.Sub(res.firstToken))/float64(out-1))
		}
	}
}

func (c *collector) failLocked(kind, message string) {
	c.failed++
	c.errors[kind]++
	if _, ok := c.samples[kind]; !ok {
		c.samples[kind] = message
	}
}

// cancelled records a request that was due but never sent because the run was interrupted.
func (c *collector) cancelled(*item) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failLocked(KindCanceled, "run interrupted before the request was sent")
}

func (c *collector) counts() (done, errs int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(c.completed + c.failed), int64(c.failed)
}

func (c *collector) report(o *Options, start time.Time) *Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := &Report{
		Config:       echo(o),
		Requests:     c.completed + c.failed,
		Errors:       maps.Clone(c.errors),
		PerWorker:    maps.Clone(c.perWorker),
		Completed:    c.completed,
		PromptTokens: c.prompt,
		OutputTokens: c.output,
		CachedTokens: c.cached,
		ErrorSamples: maps.Clone(c.samples),
	}
	if !c.last.IsZero() {
		r.DurationS = c.last.Sub(start).Seconds()
	}
	if r.DurationS > 0 {
		r.Throughput = Throughput{
			ReqPerS:       float64(c.completed) / r.DurationS,
			InputTokPerS:  float64(c.prompt) / r.DurationS,
			OutputTokPerS: float64(c.output) / r.DurationS,
		}
	}
	if c.prompt > 0 {
		r.CacheHitRatio = float64(c.cached) / float64(c.prompt)
	}
	r.TTFT = Summarize(c.ttft)
	r.TTFTCDF = CDF(c.ttft)
	r.ITL = Summarize(c.itl)
	r.TPOT = Summarize(c.tpot)
	r.E2E = Summarize(c.e2e)
	return r
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	return nil
}

// WriteJSONFile writes the report to path.
func (r *Report) WriteJSONFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create report: %w", err)
	}
	if err := r.WriteJSON(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close report: %w", err)
	}
	return nil
}

// ReadReport decodes a JSON report; it needs ttft_cdf_ms to be plotted.
func ReadReport(rd io.Reader) (*Report, error) {
	data, err := io.ReadAll(io.LimitReader(rd, 256<<20))
	if err != nil {
		return nil, fmt.Errorf("read report: %w", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidReport, err)
	}
	for _, k := range []string{"config", "requests", "ttft_ms", "ttft_cdf_ms"} {
		if _, ok := raw[k]; !ok {
			return nil, fmt.Errorf("%w: no %q field", ErrInvalidReport, k)
		}
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidReport, err)
	}
	for i, p := range r.TTFTCDF {
		if p[1] < 0 || p[1] > 1 || p[0] < 0 || (i > 0 && (p[0] < r.TTFTCDF[i-1][0] || p[1] < r.TTFTCDF[i-1][1])) {
			return nil, fmt.Errorf("%w: ttft_cdf_ms[%d] is not a CDF point", ErrInvalidReport, i)
		}
	}
	return &r, nil
}

// ReadReportFile reads the JSON report at path.
func ReadReportFile(path string) (*Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open report: %w", err)
	}
	defer f.Close()
	r, err := ReadReport(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// WriteText prints the report as a table for people.
func (r *Report) WriteText(w io.Writer) error {
	f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	c := r.Config
	mode := "unary"
	if c.Stream {
		mode = "stream"
	}
	loop := "closed loop, concurrency " + strconv.Itoa(c.Concurrency)
	switch {
	case c.Workload == WorkloadConversation:
		rate := c.Rate
		if rate <= 0 {
			rate = convDefaultRate
		}
		loop = "Gamma-bursty sessions, " + f(rate, 2) + " sessions/s, think time ×" + f(c.TraceTimeScale, 3)
	case c.Rate > 0:
		loop = "Poisson open loop, " + f(c.Rate, 2) + " req/s"
	case c.Workload == WorkloadTrace && c.TraceTimeScale > 0:
		loop = "trace timestamps ×" + f(c.TraceTimeScale, 3)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "infera bench: %s %s %s, workload %s, %s\n", c.URL, c.Endpoint, mode, c.Workload, loop)
	fmt.Fprintf(&b, "model %s, seed %d\n\n", c.Model, c.Seed)
	fmt.Fprintf(&b, "requests      %d (ok %d, failed %d)\n", r.Requests, r.Completed, r.Requests-r.Completed)
	for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
		fmt.Fprintf(&b, "  %-12s %d  e.g. %s\n", k, r.Errors[k], oneLine(r.ErrorSamples[k]))
	}
	fmt.Fprintf(&b, "duration      %s s\n", f(r.DurationS, 3))
	fmt.Fprintf(&b, "throughput    %s req/s, %s input tok/s, %s output tok/s\n",
		f(r.Throughput.ReqPerS, 2), f(r.Throughput.InputTokPerS, 1), f(r.Throughput.OutputTokPerS, 1))
	fmt.Fprintf(&b, "tokens        %d prompt, %d cached, %d output\n", r.PromptTokens, r.CachedTokens, r.OutputTokens)
	fmt.Fprintf(&b, "cache hits    %s %%\n", f(100*r.CacheHitRatio, 2))
	if len(r.PerWorker) > 0 {
		b.WriteString("per worker   ")
		for _, k := range slices.Sorted(maps.Keys(r.PerWorker)) {
			fmt.Fprintf(&b, " %s=%d", k, r.PerWorker[k])
		}
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	fmt.Fprintf(&b, "%-14s%10s%10s%10s%10s\n", "latency (ms)", "mean", "p50", "p90", "p99")
	for _, row := range []struct {
		name string
		s    Summary
	}{{"ttft", r.TTFT}, {"itl", r.ITL}, {"tpot", r.TPOT}, {"e2e", r.E2E}} {
		fmt.Fprintf(&b, "%-14s%10s%10s%10s%10s\n", row.name, f(row.s.Mean, 2), f(row.s.P50, 2), f(row.s.P90, 2), f(row.s.P99, 2))
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}
