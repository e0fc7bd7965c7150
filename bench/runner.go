package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// ErrInvalidOptions is wrapped by the error Run returns for unusable Options.
var ErrInvalidOptions = errors.New("invalid bench options")

// Workload names.
const (
	WorkloadRandom       = "random"
	WorkloadSharedPrefix = "shared-prefix"
	WorkloadMultiTurn    = "multi-turn"
	WorkloadTrace        = "trace"
)

// Endpoint names.
const (
	EndpointChat        = "chat"
	EndpointCompletions = "completions"
)

// Options configure one run. The zero value is not usable; the command fills
// every field from its flags.
type Options struct {
	// URLs are the servers' base URLs (http://host:port, with or without
	// /v1). Requests go to them in turn: several engines loaded directly are
	// the baseline a proxy in front of the same engines is compared with.
	URLs []string
	// Model is sent in every request; empty asks the server's /v1/models.
	Model    string
	APIKey   string
	Endpoint string // EndpointChat or EndpointCompletions
	Stream   bool
	Seed     int64

	// Requests stops the run after that many requests (0: no limit);
	// Duration stops sending new requests after that long (0: no limit).
	Requests int
	Duration time.Duration
	// Concurrency is the number of closed-loop workers.
	Concurrency int
	// Rate > 0 switches to a Poisson open loop of that many requests/s.
	Rate float64
	// MaxInflight caps requests in flight in an open loop.
	MaxInflight int
	// Timeout bounds each request, from sending it to its last byte.
	Timeout time.Duration

	Workload  string
	InputLen  int
	OutputLen int
	// LenSpread draws lengths uniformly within ±LenSpread of the nominal one.
	LenSpread    float64
	PrefixGroups int
	PrefixLen    int
	SuffixLen    int
	Sessions     int
	Turns        int
	// TracePath is read when Trace is nil.
	TracePath string
	Trace     []TraceRecord
	// TraceTimeScale multiplies the trace timestamps; 0 ignores them (closed
	// loop or --rate instead).
	TraceTimeScale float64
	TraceLimit     int
	// TraceBlockWords is the number of words a trace hash id stands for
	// (0 = 512, the trace's own block size); smaller values replay the
	// trace's sharing pattern at a smaller scale, input lengths scaled alike.
	TraceBlockWords int
	IgnoreEOS       bool

	// Label names the run in plots; empty derives one from workload and URL.
	Label string
	// Progress, when not nil, receives a progress line every ProgressInterval.
	Progress         io.Writer
	ProgressInterval time.Duration
}

// Validate reports every problem with o in one error wrapping ErrInvalidOptions.
func (o *Options) Validate() error {
	var probs []string
	add := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	if len(o.URLs) == 0 {
		add("no url")
	}
	for _, u := range o.URLs {
		if _, err := endpointURL(u, "chat"); err != nil {
			add("url: %v", err)
		}
	}
	if o.Endpoint != EndpointChat && o.Endpoint != EndpointCompletions {
		add("endpoint %q: want chat or completions", o.Endpoint)
	}
	if o.Requests < 0 {
		add("requests %d is negative", o.Requests)
	}
	if o.Duration < 0 {
		add("duration %s is negative", o.Duration)
	}
	if o.Requests == 0 && o.Duration == 0 && o.Workload != WorkloadTrace {
		add("requests and duration are both 0: the run would never end")
	}
	if o.Concurrency < 1 || o.Concurrency > 100000 {
		add("concurrency %d out of range 1..100000", o.Concurrency)
	}
	if o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0) {
		add("rate %v: want a finite number >= 0", o.Rate)
	}
	if o.MaxInflight < 1 || o.MaxInflight > 100000 {
		add("max-inflight %d out of range 1..100000", o.MaxInflight)
	}
	if o.Timeout <= 0 {
		add("timeout must be positive")
	}
	if o.InputLen < 1 || o.InputLen > maxTraceInputLength {
		add("input-len %d out of range 1..%d", o.InputLen, maxTraceInputLength)
	}
	if o.OutputLen < 1 || o.OutputLen > 1<<20 {
		add("output-len %d out of range 1..%d", o.OutputLen, 1<<20)
	}
	if o.LenSpread < 0 || o.LenSpread >= 1 || math.IsNaN(o.LenSpread) {
		add("len-spread %v out of range [0, 1)", o.LenSpread)
	}
	switch o.Workload {
	case WorkloadRandom:
	case WorkloadSharedPrefix:
		if o.PrefixGroups < 1 || o.PrefixGroups > 1<<20 {
			add("prefix-groups %d out of range 1..%d", o.PrefixGroups, 1<<20)
		}
		if o.PrefixLen < 1 || o.PrefixLen > maxTraceInputLength {
			add("prefix-len %d out of range 1..%d", o.PrefixLen, maxTraceInputLength)
		}
		if o.SuffixLen < 0 || o.SuffixLen > maxTraceInputLength {
			add("suffix-len %d out of range 0..%d", o.SuffixLen, maxTraceInputLength)
		}
	case WorkloadMultiTurn:
		if o.Sessions < 1 || o.Sessions > 100000 {
			add("sessions %d out of range 1..100000", o.Sessions)
		}
		if o.Turns < 1 || o.Turns > 1000 {
			add("turns %d out of range 1..1000", o.Turns)
		}
	case WorkloadConversation:
		if o.Turns < 1 || o.Turns > convMaxTurns {
			add("turns %d out of range 1..%d", o.Turns, convMaxTurns)
		}
		if o.PrefixGroups < 1 || o.PrefixGroups > 1<<16 {
			add("prefix-groups %d out of range 1..%d", o.PrefixGroups, 1<<16)
		}
		if o.PrefixLen < 1 || o.PrefixLen > maxTraceInputLength {
			add("prefix-len %d out of range 1..%d", o.PrefixLen, maxTraceInputLength)
		}
		if o.Requests > convMaxRequests {
			add("requests %d: the conversation workload schedules at most %d", o.Requests, convMaxRequests)
		}
		if o.TraceTimeScale < 0 || math.IsNaN(o.TraceTimeScale) || math.IsInf(o.TraceTimeScale, 0) {
			add("trace-time-scale %v: want a finite number >= 0", o.TraceTimeScale)
		}
	case WorkloadTrace:
		if o.TracePath == "" && o.Trace == nil {
			add("the trace workload needs a trace file")
		}
		if o.TraceTimeScale < 0 || math.IsNaN(o.TraceTimeScale) || math.IsInf(o.TraceTimeScale, 0) {
			add("trace-time-scale %v: want a finite number >= 0", o.TraceTimeScale)
		}
		if o.TraceTimeScale > 0 && o.Rate > 0 {
			add("rate conflicts with the trace's timestamps: set trace-time-scale 0 to use rate")
		}
		if o.TraceLimit < 0 {
			add("trace-limit %d is negative", o.TraceLimit)
		}
		if o.TraceBlockWords < 0 || o.TraceBlockWords > traceBlockTokens {
			add("trace-block-words %d: want 0..%d", o.TraceBlockWords, traceBlockTokens)
		}
	default:
		add("workload %q: want random, shared-prefix, multi-turn, conversation or trace", o.Workload)
	}
	if o.Progress != nil && o.ProgressInterval <= 0 {
		add("progress interval must be positive")
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidOptions, strings.Join(probs, "; "))
}

// endpointURL joins the base URL and the API path of endpoint; a base that
// already ends in /v1 is accepted as well.
func endpointURL(base, endpoint string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("parse %q: %w", base, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q: want http(s)://host[:port][/path]", base)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("%q: no query or fragment allowed", base)
	}
	p := strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
	switch endpoint {
	case EndpointChat:
		p += "/v1/chat/completions"
	case EndpointCompletions:
		p += "/v1/completions"
	default:
		p += "/v1/models"
	}
	u.Path = p
	return u.String(), nil
}

func (o *Options) newWorkload() (workload, error) {
	switch o.Workload {
	case WorkloadRandom:
		return &randomWorkload{seed: o.Seed, inputLen: o.InputLen, outputLen: o.OutputLen, spread: o.LenSpread}, nil
	case WorkloadSharedPrefix:
		return newSharedPrefixWorkload(o.Seed, o.PrefixGroups, o.PrefixLen, o.SuffixLen, o.OutputLen, o.LenSpread), nil
	case WorkloadMultiTurn:
		return &multiTurnWorkload{seed: o.Seed, sessions: o.Sessions, turns: o.Turns, inputLen: o.InputLen,
			outputLen: o.OutputLen, spread: o.LenSpread, last: make([]chan struct{}, o.Sessions)}, nil
	case WorkloadConversation:
		return newConversationWorkload(o.Seed, o.Requests, o.Turns, o.InputLen, o.OutputLen, o.PrefixGroups, o.PrefixLen,
			o.Rate, o.TraceTimeScale), nil
	case WorkloadTrace:
		recs := o.Trace
		if recs == nil {
			var err error
			if recs, err = LoadTrace(o.TracePath, o.TraceLimit); err != nil {
				return nil, err
			}
		} else if o.TraceLimit > 0 && len(recs) > o.TraceLimit {
			recs = recs[:o.TraceLimit]
		}
		return &traceWorkload{seed: o.Seed, records: recs, timeScale: o.TraceTimeScale, blockWords: o.TraceBlockWords}, nil
	}
	return nil, fmt.Errorf("%w: workload %q", ErrInvalidOptions, o.Workload)
}

// openLoop reports whether requests are sent at set times rather than by
// closed-loop workers.
func (o *Options) openLoop() bool {
	return o.Rate > 0 || (o.Workload == WorkloadTrace && o.TraceTimeScale > 0) || o.Workload == WorkloadConversation
}

// Run sends the workload described by opts and returns its report. It returns
// early, with what was measured so far, when ctx is cancelled; requests cut
// short count as "canceled" errors. An error is returned only for unusable
// options or an unreadable trace: failed requests are part of the report.
func Run(ctx context.Context, opts Options, log zerolog.Logger) (*Report, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	wl, err := opts.newWorkload()
	if err != nil {
		return nil, err
	}
	conns := opts.Concurrency
	if opts.openLoop() {
		conns = opts.MaxInflight
	}
	chat := opts.Endpoint == EndpointChat
	targets := make([]string, len(opts.URLs))
	for i, u := range opts.URLs {
		targets[i], _ = endpointURL(u, opts.Endpoint)
	}
	model := opts.Model
	c := newClient(targets, opts.APIKey, model, chat, opts.Stream, opts.IgnoreEOS, conns, opts.Timeout)
	defer c.close()
	if model == "" {
		model, err = discoverModel(ctx, c, opts.URLs[0], min(opts.Timeout, 10*time.Second))
		if err != nil {
			// Going on lets a dead or misconfigured server be reported
			// request by request, as any other failure is.
			log.Warn().Err(err).Msg("cannot discover the model; set --model")
			model = "unknown"
		}
		c.model = model
		opts.Model = model
	}
	log.Info().Strs("urls", targets).Str("model", model).Str("workload", opts.Workload).
		Bool("stream", opts.Stream).Bool("open_loop", opts.openLoop()).Msg("bench starting")

	r := &runner{opts: &opts, wl: wl, client: c, col: newCollector()}
	r.start = time.Now()
	stopProgress := r.startProgress()
	if opts.openLoop() {
		r.runOpen(ctx)
	} else {
		r.runClosed(ctx)
	}
	stopProgress()
	return r.col.report(&opts, r.start), nil
}

// discoverModel asks the server for its first model.
func discoverModel(ctx context.Context, c *client, base string, timeout time.Duration) (string, error) {
	u, err := endpointURL(base, "models")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", fmt.Errorf("build models request: %w", err)
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("get models: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("get models: HTTP %d", resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return "", fmt.Errorf("decode models: %w", err)
	}
	if len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", errors.New("get models: the server lists none")
	}
	return list.Data[0].ID, nil
}

type runner struct {
	opts   *Options
	wl     workload
	client *client
	col    *collector
	start  time.Time

	mu     sync.Mutex
	issued int // guarded by mu
	ended  bool

	inflight atomic.Int64
}

// take returns the next request, or false when the run must stop sending.
func (r *runner) take(ctx context.Context) (item, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended || ctx.Err() != nil ||
		(r.opts.Requests > 0 && r.issued >= r.opts.Requests) ||
		(r.opts.Duration > 0 && time.Since(r.start) >= r.opts.Duration) {
		r.ended = true
		return item{}, false
	}
	it, ok := r.wl.next(r.issued)
	if !ok {
		r.ended = true
		return item{}, false
	}
	r.issued++
	return it, true
}

func (r *runner) runClosed(ctx context.Context) {
	var wg sync.WaitGroup
	for range r.opts.Concurrency {
		wg.Go(func() {
			res := &result{}
			for {
				it, ok := r.take(ctx)
				if !ok {
					return
				}
				r.one(ctx, &it, res)
			}
		})
	}
	wg.Wait()
}

func (r *runner) runOpen(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, r.opts.MaxInflight)
	var gaps *poissonGaps
	if r.opts.Rate > 0 {
		gaps = &poissonGaps{rate: r.opts.Rate, r: rand.New(rand.NewPCG(uint64(r.opts.Seed), 0x9e3779b97f4a7c15))}
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var offset time.Duration
	results := sync.Pool{New: func() any { return &result{} }}
	for {
		it, ok := r.take(ctx)
		if !ok {
			return
		}
		at := time.Duration(0)
		switch {
		case it.at >= 0:
			at = it.at
		case gaps != nil:
			offset += time.Duration(gaps.next() * float64(time.Second))
			at = offset
		}
		if r.opts.Duration > 0 && at >= r.opts.Duration {
			return
		}
		if wait := time.Until(r.start.Add(at)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				r.col.cancelled(&it)
				return
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			r.col.cancelled(&it)
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			res := results.Get().(*result)
			r.one(ctx, &it, res)
			results.Put(res)
		})
	}
}

// one sends it (after the request it depends on) and records the result.
func (r *runner) one(ctx context.Context, it *item, res *result) {
	if it.done != nil {
		defer close(it.done)
	}
	if it.after != nil {
		select {
		case <-it.after:
		case <-ctx.Done():
			r.col.cancelled(it)
			return
		}
	}
	r.wl.build(it)
	res.reset()
	r.inflight.Add(1)
	reqCtx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	r.client.do(reqCtx, ctx, it, res)
	cancel()
	r.inflight.Add(-1)
	r.col.add(res)
}

// startProgress prints a progress line every interval until the returned
// function is called.
func (r *runner) startProgress() func() {
	if r.opts.Progress == nil {
		return func() {}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.opts.ProgressInterval)
		defer t.Stop()
		lastDone, lastAt := int64(0), r.start
		var line []byte
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				done, errs := r.col.counts()
				rate := float64(done-lastDone) / now.Sub(lastAt).Seconds()
				lastDone, lastAt = done, now
				line = append(line[:0], "bench: "...)
				line = strconv.AppendInt(line, done, 10)
				if r.opts.Requests > 0 {
					line = append(line, '/')
					line = strconv.AppendInt(line, int64(r.opts.Requests), 10)
				}
				line = append(line, " done, "...)
				line = strconv.AppendInt(line, errs, 10)
				line = append(line, " errors, "...)
				line = strconv.AppendFloat(line, rate, 'f', 1, 64)
				line = append(line, " req/s, "...)
				line = strconv.AppendInt(line, r.inflight.Load(), 10)
				line = append(line, " in flight, "...)
				line = strconv.AppendFloat(line, now.Sub(r.start).Seconds(), 'f', 0, 64)
				line = append(line, "s\n"...)
				_, _ = r.opts.Progress.Write(line)
			}
		}
	})
	return func() {
		close(stop)
		wg.Wait()
	}
}
