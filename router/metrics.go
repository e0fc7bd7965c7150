package router

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/openai"
)

// metrics are the router's Prometheus series, on a private registry so that
// tests and several routers in one process never collide. Series used on the
// request path are resolved once here, so a request does no label lookups.
type metrics struct {
	reg *prometheus.Registry

	requestsVec   *prometheus.CounterVec
	requests      [numRoutes][numOutcomes]prometheus.Counter // the expected combinations
	durations     *requestDurations                          // ours by route, Infera's by outcome (below)
	ttft          [numProxyRoutes]prometheus.Observer
	inflight      atomic.Int64         // proxied requests being served: an integer add, not a float's CAS loop
	activeWorkers *prometheus.GaugeVec // by disagg_mode, as Infera
	unroutable    *prometheus.GaugeVec // by reason
	picks         *prometheus.CounterVec

	// Resilience and admission (issue 5), resolved per label value.
	retries      [numReasons]prometheus.Counter
	failures     [numReasons]prometheus.Counter
	timeouts     [numTimeoutKinds]prometheus.Counter
	rejected     [numRejects]prometheus.Counter
	disconnects  prometheus.Counter
	breakerTrips *prometheus.CounterVec
	stalls       *prometheus.CounterVec // confirmed stalls by worker
	pd           *pdMetrics             // disaggregated serving (pdmetrics.go)
	mig          *migrationMetrics      // stream continuation (migrate.go)
}

// failReason says why an attempt on a worker failed.
type failReason uint8

const (
	reasonConnect        failReason = iota // dial failed or timed out
	reasonBusy                             // no free connection to the worker in time
	reasonStatus5xx                        // the worker answered 5xx
	reasonTTFTTimeout                      // no first byte within --ttft-timeout
	reasonIdleTimeout                      // a stream went silent for --stream-idle-timeout
	reasonRequestTimeout                   // --request-timeout ran out
	reasonStreamEnded                      // a stream ended before its first event
	reasonStreamError                      // a stream broke after its first event
	reasonUpstreamError                    // any other connection or protocol error
	reasonStalled                          // a stream left its stalled worker before its first event
	numReasons
)

var reasonLabels = [numReasons]string{
	reasonConnect:        "connect",
	reasonBusy:           "busy",
	reasonStatus5xx:      "status_5xx",
	reasonTTFTTimeout:    "ttft_timeout",
	reasonIdleTimeout:    "idle_timeout",
	reasonRequestTimeout: "request_timeout",
	reasonStreamEnded:    "stream_ended",
	reasonStreamError:    "stream_error",
	reasonUpstreamError:  "upstream_error",
	reasonStalled:        "stalled",
}

func (f failReason) String() string { return reasonLabels[f] }

// timeoutKind labels infera_router_timeouts_total.
type timeoutKind uint8

const (
	timeoutConnect timeoutKind = iota
	timeoutTTFT
	timeoutIdle
	timeoutRequest
	numTimeoutKinds
)

var timeoutLabels = [numTimeoutKinds]string{"connect", "ttft", "idle", "request"}

// timeout returns the timeout kind behind a failure, if it is one.
func (f failReason) timeout(err error) (timeoutKind, bool) {
	switch f {
	case reasonConnect:
		return timeoutConnect, err != nil && isTimeout(err)
	case reasonTTFTTimeout:
		return timeoutTTFT, true
	case reasonIdleTimeout:
		return timeoutIdle, true
	case reasonRequestTimeout:
		return timeoutRequest, true
	}
	return 0, false
}

// Rejections by status code: infera_router_rejected_total{reason="429"}.
const (
	rejected400 = iota
	rejected401
	rejected408
	rejected413
	rejected429
	rejected431
	rejected503 // the front door: connection limit, body budget
	numRejects
)

var rejectLabels = [numRejects]string{"400", "401", "408", "413", "429", "431", "503"}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_requests_total",
		Help: "Requests by route and outcome.",
	}, []string{"route", "outcome"})
	m.durations = newRequestDurations()
	ttft := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "infera_ttft_seconds",
		Help:    "Time from a streaming request's arrival to its first event relayed to the client.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16), // 1ms .. ~33s
	}, []string{"route"})
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "infera_requests_in_flight",
		Help: "Proxied requests being served.",
	}, func() float64 { return float64(m.inflight.Load()) })
	m.picks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_worker_picks_total",
		Help: "Requests routed to each worker.",
	}, []string{"worker_id"})
	retries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_router_retries_total",
		Help: "Requests retried on another worker before their first byte reached the client, by the failure that caused the retry.",
	}, []string{"reason"})
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_router_upstream_failures_total",
		Help: "Failed attempts on workers, by reason.",
	}, []string{"reason"})
	timeouts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_router_timeouts_total",
		Help: "Upstream timeouts by kind (connect, ttft, idle, request).",
	}, []string{"kind"})
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_router_rejected_total",
		Help: "Requests refused by the router itself, by HTTP status.",
	}, []string{"reason"})
	m.disconnects = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "infera_router_client_disconnects_total",
		Help: "Requests whose client went away before the response was complete.",
	})
	m.breakerTrips = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_router_worker_breaker_trips_total",
		Help: "Times each worker's circuit breaker opened.",
	}, []string{"worker_id"})
	m.stalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_router_worker_stalls_total",
		Help: "Times each worker was found stalled: requests in flight, no progress for --stall-window, no answer to its probe.",
	}, []string{"worker_id"})
	m.reg.MustRegister(requests, m.durations, ttft, inflight, m.picks,
		retries, failures, timeouts, rejected, m.disconnects, m.breakerTrips, m.stalls)
	m.reg.MustRegister(m.newInferaMetrics()...)
	m.pd = newPDMetrics(m.reg)
	m.mig = newMigrationMetrics(m.reg)
	for i := range numReasons {
		m.retries[i] = retries.WithLabelValues(reasonLabels[i])
		m.failures[i] = failures.WithLabelValues(reasonLabels[i])
	}
	for i := range numTimeoutKinds {
		m.timeouts[i] = timeouts.WithLabelValues(timeoutLabels[i])
	}
	for i := range numRejects {
		m.rejected[i] = rejected.WithLabelValues(rejectLabels[i])
	}

	// Resolve (and so export at 0) the combinations that can happen;
	// request() creates any other on first use.
	m.requestsVec = requests
	for rt := range numRoutes {
		for o := range numOutcomes {
			var expected bool
			switch {
			case rt < numProxyRoutes:
				expected = true
			case rt == RouteOther:
				expected = o == outcomeNotFound
			case rt == RouteCacheView:
				expected = o == outcomeOK || o == outcomeMethodNotAllowed || o == outcomeNotFound || o == outcomeBadRequest
			case rt == RouteModel:
				expected = o == outcomeOK || o == outcomeMethodNotAllowed || o == outcomeModelNotFound
			case rt == RouteTokenize || rt == RouteDetokenize:
				expected = o == outcomeOK || o == outcomeMethodNotAllowed || o == outcomeModelNotFound || o == outcomeBadRequest || o == outcomeNotFound
			default:
				expected = o == outcomeOK || o == outcomeMethodNotAllowed
			}
			if o == outcomeUnauthorized && rt != RouteHealth && rt != RouteReady && rt != RouteOther {
				expected = true
			}
			if expected {
				m.requests[rt][o] = requests.WithLabelValues(rt.String(), o.String())
			}
		}
	}
	for rt := range numProxyRoutes {
		m.ttft[rt] = ttft.WithLabelValues(rt.String())
	}
	return m
}

// request returns the request counter of a route and outcome.
func (m *metrics) request(rt Route, o outcome) prometheus.Counter {
	if c := m.requests[rt][o]; c != nil {
		return c
	}
	return m.requestsVec.WithLabelValues(rt.String(), o.String())
}

// register adds the collectors that read the router's live state.
// A policy that is a prometheus.Collector (kv-aware) has its series
// exported with the router's.
func (m *metrics) register(r *Router) {
	m.reg.MustRegister(workerCollector{r: r, desc: prometheus.NewDesc(
		"infera_worker_in_flight", "Requests in flight on each worker of the current fleet view.",
		[]string{"worker_id"}, nil), breakerDesc: prometheus.NewDesc(
		"infera_router_worker_breaker_state", "Circuit breaker of each worker, as Infera: 0 closed, 1 half-open, 2 open.",
		[]string{"worker_id"}, nil), stalledDesc: prometheus.NewDesc(
		"infera_router_worker_stalled", "1 while a worker is stalled (no progress with requests in flight, probe unanswered): it gets no new request.",
		[]string{"worker_id"}, nil)})
	m.reg.MustRegister(newInferaCollector(r))
	if c, ok := r.policy.(prometheus.Collector); ok {
		m.reg.MustRegister(c)
	}
}

// workerCollector reports per-worker in-flight counts from the current view.
type workerCollector struct {
	r           *Router
	desc        *prometheus.Desc
	breakerDesc *prometheus.Desc
	stalledDesc *prometheus.Desc
}

func (c workerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.breakerDesc
	ch <- c.stalledDesc
}

func (c workerCollector) Collect(ch chan<- prometheus.Metric) {
	v := c.r.view.Load()
	if v == nil {
		return
	}
	now := time.Now().UnixNano()
	for _, w := range v.workers {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(w.InFlight()), w.id)
		ch <- prometheus.MustNewConstMetric(c.breakerDesc, prometheus.GaugeValue, inferaBreakerValue(w.breaker.State()), w.id)
		c.r.skipStalled(w, now) // a stall ends, or a probe starts, without traffic too
		stalled := 0.0
		if w.Stalled() {
			stalled = 1
		}
		ch <- prometheus.MustNewConstMetric(c.stalledDesc, prometheus.GaugeValue, stalled, w.id)
	}
}

// write answers GET /metrics in the Prometheus text format.
func (m *metrics) write(ctx *fasthttp.RequestCtx) {
	families, err := m.reg.Gather()
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, "gather metrics: "+err.Error(), openai.TypeServer, "metrics_error")
		return
	}
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	ctx.SetContentType(string(format))
	enc := expfmt.NewEncoder(ctx, format)
	for _, mf := range families {
		if err := enc.Encode(mf); err != nil {
			return // the client is gone or the body is broken anyway
		}
	}
}

// requestDurations holds the two histograms of a finished proxied request's
// duration, ours by route (infera_router_request_duration_seconds) and
// Infera's by outcome (infera_request_duration_seconds{router="mixed"}),
// as one set of counts by route and Infera outcome: a request's end finds
// its bucket once and makes two atomic updates (its bucket, its cell's
// sum), where two Prometheus histograms searched their buckets twice and
// made four each (hot index, bucket, sum, count). Each series is summed
// from the cells at scrape time.
//
// Concurrency: observe may run on any goroutine; a scrape (Collect) reads
// the counts without stopping observers, so a scrape during a request's
// end may count its bucket before its sum (the next scrape has both); a
// series' count is its buckets' total, never out of step with them.
type requestDurations struct {
	cells [numProxyRoutes][numInferaOutcomes]durationCell

	byRoute   *prometheus.Desc
	byOutcome *prometheus.Desc
}

// durationBounds are both histograms' bucket upper bounds: 5 ms to ~164 s.
var durationBounds = prometheus.ExponentialBuckets(0.005, 2, 16)

const numDurationBuckets = 16 // len(durationBounds)

// durationCell counts the requests of one route and Infera outcome.
type durationCell struct {
	buckets [numDurationBuckets + 1]atomic.Uint64 // the last: above every bound (+Inf)
	sumBits atomic.Uint64                         // the durations' sum in seconds, float64 bits
}

func newRequestDurations() *requestDurations {
	return &requestDurations{
		byRoute: prometheus.NewDesc("infera_router_request_duration_seconds",
			"Time from a proxied request's arrival to the end of its response.",
			[]string{"route"}, nil),
		byOutcome: prometheus.NewDesc("infera_request_duration_seconds",
			"End-to-end server-observed request latency (pick + worker round-trip), by router (mixed, disagg) and outcome (ok, 4xx, 5xx, error), as Infera exports it.",
			[]string{"router", "outcome"}, nil),
	}
}

// observe counts a request of route rt and Infera outcome io that took s
// seconds.
func (h *requestDurations) observe(rt Route, io int, s float64) {
	c := &h.cells[rt][io]
	i := 0
	for i < numDurationBuckets && s > durationBounds[i] {
		i++
	}
	c.buckets[i].Add(1)
	for {
		old := c.sumBits.Load()
		if c.sumBits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+s)) {
			return
		}
	}
}

func (h *requestDurations) Describe(ch chan<- *prometheus.Desc) {
	ch <- h.byRoute
	ch <- h.byOutcome
}

func (h *requestDurations) Collect(ch chan<- prometheus.Metric) {
	var sums durationSums
	for rt := range numProxyRoutes {
		sums.reset()
		for io := range numInferaOutcomes {
			sums.add(&h.cells[rt][io])
		}
		ch <- sums.histogram(h.byRoute, rt.String())
	}
	for io := range numInferaOutcomes {
		sums.reset()
		for rt := range numProxyRoutes {
			sums.add(&h.cells[rt][io])
		}
		ch <- sums.histogram(h.byOutcome, inferaRouterLabel, inferaOutcomeLabels[io])
	}
}

// durationSums adds cells up into one series.
type durationSums struct {
	buckets [numDurationBuckets + 1]uint64
	sum     float64
}

func (s *durationSums) reset() { *s = durationSums{} }

func (s *durationSums) add(c *durationCell) {
	for i := range s.buckets {
		s.buckets[i] += c.buckets[i].Load()
	}
	s.sum += math.Float64frombits(c.sumBits.Load())
}

// histogram is the series with Prometheus' cumulative buckets.
func (s *durationSums) histogram(d *prometheus.Desc, labels ...string) prometheus.Metric {
	cumulative := make(map[float64]uint64, numDurationBuckets)
	var n uint64
	for i, le := range durationBounds {
		n += s.buckets[i]
		cumulative[le] = n
	}
	n += s.buckets[numDurationBuckets]
	return prometheus.MustNewConstHistogram(d, n, s.sum, cumulative, labels...)
}
