package router

import (
	"bufio"
	"encoding/json"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/openai"
	"github.com/infera/infera/webui"
)

// The fleet snapshot (GET /v1/admin/fleet) is the operator's view of the
// router: every worker with its live state, PD pairs and leg outcomes, the
// request and error rates of the last minutes. It is built off the request
// path, from the atomic fleet view and a Gather of the router's own
// registry (the counters the request path already keeps), at most once per
// fleetMinInterval whatever the number of readers; rates are the
// difference between two samples. The rate history grows while someone
// reads the snapshot (no goroutine samples an unwatched router).
//
// ?stream=1 (or Accept: text/event-stream) answers an SSE stream: one
// "fleet" event per FleetStreamInterval, each the whole snapshot, until the
// client goes or the router shuts down.

// FleetStreamInterval is the period of the fleet SSE stream.
const FleetStreamInterval = time.Second

const (
	fleetMinInterval = 400 * time.Millisecond // readers within it share one sample
	fleetHistory     = 10 * time.Minute       // rate history kept
	fleetHistoryMax  = 720                    // points kept at most
)

// fleetSampler caches the latest snapshot and the rate history.
type fleetSampler struct {
	mu        sync.Mutex
	at        time.Time
	body      []byte
	prevAt    time.Time
	prevPicks map[string]float64
	prevTotal [3]float64 // requests, errors, 429s
	hist      []FleetRatePoint

	doneOnce, stopOnce sync.Once
	done               chan struct{}
}

func (s *fleetSampler) doneCh() chan struct{} {
	s.doneOnce.Do(func() { s.done = make(chan struct{}) })
	return s.done
}

// stop ends every fleet stream (the router is shutting down).
func (s *fleetSampler) stop() { s.stopOnce.Do(func() { close(s.doneCh()) }) }

// FleetSnapshot is the body of GET /v1/admin/fleet.
type FleetSnapshot struct {
	Time     float64       `json:"time"` // unix seconds
	Revision int64         `json:"revision"`
	Policy   string        `json:"policy"`
	Workers  []FleetWorker `json:"workers"`
	PD       FleetPD       `json:"pd"`
	Requests FleetRequests `json:"requests"`
	KV       FleetKV       `json:"kv"`
	KVD      *FleetKVD     `json:"kvd,omitempty"`
}

// FleetWorker is one worker of the snapshot.
type FleetWorker struct {
	WorkerID   string  `json:"worker_id"`
	URL        string  `json:"url"`
	Model      string  `json:"model"`
	Engine     string  `json:"engine"`
	Role       string  `json:"role"` // mixed, prefill, decode
	DPSize     int     `json:"dp_size"`
	DPRank     *int    `json:"dp_rank"`
	Transport  string  `json:"request_transport"`
	Status     string  `json:"status"` // the record's: active, draining, ...
	State      string  `json:"state"`  // the router's verdict: ok, draining, stalled, breaker_open, breaker_half_open, unroutable
	Stalled    bool    `json:"stalled"`
	Breaker    string  `json:"breaker"` // closed, open, half_open
	Unroutable string  `json:"unroutable,omitempty"`
	InFlight   int64   `json:"in_flight"`
	Picks      uint64  `json:"picks_total"`
	PicksPerS  float64 `json:"picks_per_s"`
	// Mode is precise or approximate for a policy keeping a cache view
	// (kv-aware), "" otherwise; KVBlocks is the blocks it matches against.
	Mode     string `json:"mode,omitempty"`
	KVBlocks int    `json:"kv_blocks,omitempty"`
	// HitRatioPredicted: the share of its picks' prompt blocks the
	// kv-aware policy expected the worker to hold (null without picks or
	// another policy). HitRatioReported: the engine's cached share of
	// the prompts of those picks it reported usage for (null until then).
	// Per-worker TTFT: null until the router records it per worker (the
	// fleet's TTFT is in requests).
	TTFTP50           *float64 `json:"ttft_p50_seconds"`
	TTFTP99           *float64 `json:"ttft_p99_seconds"`
	HitRatioPredicted *float64 `json:"hit_ratio_predicted"`
	HitRatioReported  *float64 `json:"hit_ratio_reported"`
	// Divergence: the divergence alarm (kvdivergence.go), once the engine
	// reported usage for kv-aware picks of the worker; hit_ratio_reported
	// is then the engine's cached share of those prompts.
	Divergence *FleetDivergence `json:"divergence,omitempty"`
}

// FleetPD is disaggregated serving: the pools of each PD model and the
// outcome of the legs.
type FleetPD struct {
	Pairs []FleetPDPool `json:"pairs"`
	Legs  []FleetPDLeg  `json:"legs"`
}

// FleetPDPool is one disaggregated model's prefill and decode workers.
type FleetPDPool struct {
	Model   string   `json:"model"`
	Prefill []string `json:"prefill"`
	Decode  []string `json:"decode"`
}

// FleetPDLeg counts ended legs by leg, protocol and result.
type FleetPDLeg struct {
	Leg      string `json:"leg"`
	Protocol string `json:"protocol"`
	Result   string `json:"result"`
	Count    uint64 `json:"count"`
}

// FleetRequests are the proxied requests: totals, the current rates and
// the recent history, and the fleet's TTFT quantiles since start.
type FleetRequests struct {
	Total       uint64           `json:"total"`
	Errors      uint64           `json:"errors"`
	TooMany     uint64           `json:"too_many_requests"`
	InFlight    int64            `json:"in_flight"`
	PerS        float64          `json:"per_s"`
	ErrorsPerS  float64          `json:"errors_per_s"`
	TooManyPerS float64          `json:"too_many_per_s"`
	TTFTP50     *float64         `json:"ttft_p50_seconds"`
	TTFTP99     *float64         `json:"ttft_p99_seconds"`
	History     []FleetRatePoint `json:"history"`
}

// FleetRatePoint is one sample of the rate history.
type FleetRatePoint struct {
	Time       float64 `json:"t"`
	PerS       float64 `json:"rps"`
	ErrorsPerS float64 `json:"eps"`
}

// FleetKV is the kv-aware policy's prediction over the fleet.
type FleetKV struct {
	HitBlocks         uint64   `json:"hit_blocks"`
	PromptBlocks      uint64   `json:"prompt_blocks"`
	HitRatioPredicted *float64 `json:"hit_ratio_predicted"`
	PrecisePicks      uint64   `json:"precise_picks"`
	ApproximatePicks  uint64   `json:"approximate_picks"`
}

// FleetKVD says which kvd the router forwards prewarm hints to.
type FleetKVD struct {
	Socket string `json:"socket"`
}

// serveFleet answers GET /v1/admin/fleet: the snapshot, or its SSE stream.
func (r *Router) serveFleet(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "use GET for "+RouteFleet.Path(), openai.TypeInvalidRequest, "method_not_allowed")
		r.metrics.request(RouteFleet, outcomeMethodNotAllowed).Inc()
		return
	}
	r.metrics.request(RouteFleet, outcomeOK).Inc()
	stream := fleetStreamQuery(string(ctx.QueryArgs().Peek("stream"))) ||
		string(ctx.Request.Header.Peek("Accept")) == "text/event-stream"
	if !stream {
		ctx.SetContentType("application/json")
		ctx.Response.Header.Set("Cache-Control", "no-store")
		ctx.SetBody(r.fleetBody(time.Now()))
		return
	}
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	done := r.fleet.doneCh()
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		t := time.NewTicker(FleetStreamInterval)
		defer t.Stop()
		for {
			_, _ = w.WriteString("event: fleet\ndata: ")
			_, _ = w.Write(r.fleetBody(time.Now()))
			_, _ = w.WriteString("\n\n")
			if w.Flush() != nil {
				return
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
}

// serveDashboard answers GET /dashboard: the embedded fleet page.
func (r *Router) serveDashboard(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "use GET for "+RouteDashboard.Path(), openai.TypeInvalidRequest, "method_not_allowed")
		r.metrics.request(RouteDashboard, outcomeMethodNotAllowed).Inc()
		return
	}
	ctx.SetContentType("text/html; charset=utf-8")
	ctx.Response.Header.Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:")
	ctx.SetBody(webui.Dashboard)
	r.metrics.request(RouteDashboard, outcomeOK).Inc()
}

// fleetBody returns the current snapshot's JSON, sampling anew when the
// cached one is older than fleetMinInterval. The returned slice is shared:
// callers must not modify it.
func (r *Router) fleetBody(now time.Time) []byte {
	s := &r.fleet
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.body != nil && now.Sub(s.at) < fleetMinInterval {
		return s.body
	}
	snap := r.sampleFleet(now)
	b, err := json.Marshal(snap)
	if err != nil { // plain values: cannot happen
		b = []byte(`{}`)
	}
	s.body, s.at = b, now
	return b
}

// sampleFleet builds a snapshot (s.mu held).
func (r *Router) sampleFleet(now time.Time) *FleetSnapshot {
	s := &r.fleet
	v := r.view.Load()
	if v == nil {
		v = &emptyView
	}
	snap := &FleetSnapshot{Time: float64(now.UnixMilli()) / 1e3, Revision: v.revision, Policy: r.policy.Name(), Workers: make([]FleetWorker, 0, len(v.workers))}
	if r.cfg.KVDSocket != "" {
		snap.KVD = &FleetKVD{Socket: r.cfg.KVDSocket}
	}
	c := r.gatherFleet() // also runs the stall checks (workerCollector)
	dt := now.Sub(s.prevAt).Seconds()
	rated := !s.prevAt.IsZero() && dt > 0
	cv, _ := r.policy.(CacheViewer)
	dv, _ := r.policy.(divergenceViewer)
	for _, w := range v.workers {
		rec := w.Record()
		fw := FleetWorker{
			WorkerID: w.id, URL: w.url, Model: rec.ModelName, Engine: rec.Engine, Role: string(rec.DisaggMode),
			DPSize: rec.EffectiveDPSize(), DPRank: rec.DPRank, Transport: rec.RequestTransport, Status: string(rec.Status),
			Stalled: w.Stalled(), Unroutable: r.unroutable(rec), InFlight: w.InFlight(),
		}
		if fw.Role == "" {
			fw.Role = "mixed"
		}
		switch w.breaker.State() {
		case breakerOpen:
			fw.Breaker = "open"
		case breakerHalfOpen:
			fw.Breaker = "half_open"
		default:
			fw.Breaker = "closed"
		}
		switch {
		case fw.Unroutable != "":
			fw.State = "unroutable"
		case !r.active(rec):
			fw.State = fw.Status
		case fw.Stalled:
			fw.State = "stalled"
		case fw.Breaker != "closed":
			fw.State = "breaker_" + fw.Breaker
		default:
			fw.State = "ok"
		}
		p := c.picks[w.id]
		fw.Picks = uint64(p)
		if prev, ok := s.prevPicks[w.id]; ok && rated && p >= prev {
			fw.PicksPerS = round3((p - prev) / dt)
		}
		if cv != nil {
			if view, err := cv.CacheView(w.id, 0, false); err == nil {
				fw.Mode = "approximate"
				if view.Precise {
					fw.Mode = "precise"
				}
				fw.KVBlocks = view.BlockCount
				if view.PromptBlocks > 0 {
					h := round3(float64(view.HitBlocks) / float64(view.PromptBlocks))
					fw.HitRatioPredicted = &h
				}
			}
		}
		if dv != nil {
			fleetDivergence(dv, &fw)
		}
		snap.Workers = append(snap.Workers, fw)
	}
	for name, m := range v.models {
		if len(m.Prefill) == 0 && len(m.Decode) == 0 {
			continue
		}
		pool := FleetPDPool{Model: name, Prefill: []string{}, Decode: []string{}}
		for _, w := range m.Prefill {
			pool.Prefill = append(pool.Prefill, w.id)
		}
		for _, w := range m.Decode {
			pool.Decode = append(pool.Decode, w.id)
		}
		snap.PD.Pairs = append(snap.PD.Pairs, pool)
	}
	sort.Slice(snap.PD.Pairs, func(i, j int) bool { return snap.PD.Pairs[i].Model < snap.PD.Pairs[j].Model })
	if snap.PD.Pairs == nil {
		snap.PD.Pairs = []FleetPDPool{}
	}
	snap.PD.Legs = c.legs

	rq := &snap.Requests
	rq.Total, rq.Errors, rq.TooMany = uint64(c.total[0]), uint64(c.total[1]), uint64(c.total[2])
	rq.InFlight = int64(c.inflight)
	if rated {
		rq.PerS = round3(max(0, c.total[0]-s.prevTotal[0]) / dt)
		rq.ErrorsPerS = round3(max(0, c.total[1]-s.prevTotal[1]) / dt)
		rq.TooManyPerS = round3(max(0, c.total[2]-s.prevTotal[2]) / dt)
		s.hist = append(s.hist, FleetRatePoint{Time: snap.Time, PerS: rq.PerS, ErrorsPerS: rq.ErrorsPerS})
	}
	cut := snap.Time - fleetHistory.Seconds()
	i := 0
	for i < len(s.hist) && (s.hist[i].Time < cut || len(s.hist)-i > fleetHistoryMax) {
		i++
	}
	s.hist = slices.Delete(s.hist, 0, i)
	rq.History = slices.Clone(s.hist)
	rq.TTFTP50, rq.TTFTP99 = c.ttft.quantile(0.5), c.ttft.quantile(0.99)

	snap.KV = FleetKV{HitBlocks: uint64(c.kvHit), PromptBlocks: uint64(c.kvPrompt), PrecisePicks: uint64(c.kvPrecise), ApproximatePicks: uint64(c.kvApprox)}
	if c.kvPrompt > 0 {
		h := round3(c.kvHit / c.kvPrompt)
		snap.KV.HitRatioPredicted = &h
	}

	s.prevAt, s.prevPicks, s.prevTotal = now, c.picks, c.total
	return snap
}

// fleetCounters are the values a snapshot reads from the registry.
type fleetCounters struct {
	picks               map[string]float64
	total               [3]float64 // proxied requests, errors, 429s
	inflight            float64
	ttft                histSum
	legs                []FleetPDLeg
	kvHit, kvPrompt     float64
	kvPrecise, kvApprox float64
}

// errorOutcomes are the outcomes counted as errors on the page.
var errorOutcomes = map[string]bool{
	outcomeLabels[outcomeUpstreamStatus]:  true,
	outcomeLabels[outcomeUpstreamError]:   true,
	outcomeLabels[outcomeStreamError]:     true,
	outcomeLabels[outcomeNoWorker]:        true,
	outcomeLabels[outcomeNotReady]:        true,
	outcomeLabels[outcomeTooManyRequests]: true,
}

// gatherFleet reads the router's registry.
func (r *Router) gatherFleet() fleetCounters {
	c := fleetCounters{picks: make(map[string]float64), legs: []FleetPDLeg{}}
	families, err := r.metrics.reg.Gather()
	if err != nil && len(families) == 0 {
		return c
	}
	proxied := make(map[string]bool, numProxyRoutes)
	for rt := range numProxyRoutes {
		proxied[rt.String()] = true
	}
	for _, mf := range families {
		switch mf.GetName() {
		case "infera_worker_picks_total":
			for _, m := range mf.Metric {
				c.picks[label(m, "worker_id")] = m.GetCounter().GetValue()
			}
		case "infera_requests_total":
			for _, m := range mf.Metric {
				if !proxied[label(m, "route")] {
					continue
				}
				n := m.GetCounter().GetValue()
				c.total[0] += n
				o := label(m, "outcome")
				if errorOutcomes[o] {
					c.total[1] += n
				}
				if o == outcomeLabels[outcomeTooManyRequests] {
					c.total[2] += n
				}
			}
		case "infera_requests_in_flight":
			for _, m := range mf.Metric {
				c.inflight += m.GetGauge().GetValue()
			}
		case "infera_ttft_seconds":
			for _, m := range mf.Metric {
				c.ttft.add(m.GetHistogram())
			}
		case "infera_pd_legs_total":
			for _, m := range mf.Metric {
				c.legs = append(c.legs, FleetPDLeg{Leg: label(m, "leg"), Protocol: label(m, "protocol"), Result: label(m, "result"), Count: uint64(m.GetCounter().GetValue())})
			}
		case "infera_router_kv_hit_blocks_total":
			for _, m := range mf.Metric {
				c.kvHit += m.GetCounter().GetValue()
			}
		case "infera_router_kv_prompt_blocks_total":
			for _, m := range mf.Metric {
				c.kvPrompt += m.GetCounter().GetValue()
			}
		case "infera_router_kv_picks_total":
			for _, m := range mf.Metric {
				if label(m, "mode") == "precise" {
					c.kvPrecise += m.GetCounter().GetValue()
				} else {
					c.kvApprox += m.GetCounter().GetValue()
				}
			}
		}
	}
	return c
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// histSum is the sum of several histograms with the same buckets.
type histSum struct {
	count  uint64
	bounds []float64
	cum    []uint64
}

func (h *histSum) add(hg *dto.Histogram) {
	if hg == nil {
		return
	}
	h.count += hg.GetSampleCount()
	for i, b := range hg.Bucket {
		if i >= len(h.bounds) {
			h.bounds = append(h.bounds, b.GetUpperBound())
			h.cum = append(h.cum, 0)
		}
		h.cum[i] += b.GetCumulativeCount()
	}
}

// quantile estimates the q-quantile by linear interpolation inside its
// bucket (as Prometheus' histogram_quantile); nil without observations.
func (h *histSum) quantile(q float64) *float64 {
	if h.count == 0 || len(h.bounds) == 0 {
		return nil
	}
	rank := q * float64(h.count)
	lower, below := 0.0, uint64(0)
	for i, ub := range h.bounds {
		if float64(h.cum[i]) >= rank {
			in := h.cum[i] - below
			v := ub
			if in > 0 {
				v = lower + (ub-lower)*(rank-float64(below))/float64(in)
			}
			v = round6(v)
			return &v
		}
		lower, below = ub, h.cum[i]
	}
	v := round6(h.bounds[len(h.bounds)-1]) // above the last bucket: its bound
	return &v
}

func round3(x float64) float64 { return math.Round(x*1e3) / 1e3 }
func round6(x float64) float64 { return math.Round(x*1e6) / 1e6 }

// fleetStreamQuery reports whether ?stream= asks for the SSE stream.
func fleetStreamQuery(v string) bool {
	b, err := strconv.ParseBool(v)
	return err == nil && b
}

// MustRegister adds collectors of the serving process (the discovery
// filters' counters) to the router's registry, so that /metrics exports
// them. It panics on a duplicate, as prometheus.Registry.MustRegister.
func (r *Router) MustRegister(cs ...prometheus.Collector) {
	r.metrics.reg.MustRegister(cs...)
}
