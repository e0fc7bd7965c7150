package router

import (
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
	duration      [numRoutes]prometheus.Observer
	ttft          [numProxyRoutes]prometheus.Observer
	inflight      prometheus.Gauge
	activeWorkers prometheus.Gauge
	picks         *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_requests_total",
		Help: "Requests by route and outcome.",
	}, []string{"route", "outcome"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "infera_request_duration_seconds",
		Help:    "Time from a proxied request's arrival to the end of its response.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 16), // 5ms .. ~164s
	}, []string{"route"})
	ttft := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "infera_ttft_seconds",
		Help:    "Time from a streaming request's arrival to its first event relayed to the client.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16), // 1ms .. ~33s
	}, []string{"route"})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "infera_requests_in_flight",
		Help: "Proxied requests being served.",
	})
	m.activeWorkers = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "infera_active_workers",
		Help: "Workers taking new requests in the current fleet view.",
	})
	m.picks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_worker_picks_total",
		Help: "Requests routed to each worker.",
	}, []string{"worker_id"})
	m.reg.MustRegister(requests, duration, ttft, m.inflight, m.activeWorkers, m.picks)

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
			default:
				expected = o == outcomeOK || o == outcomeMethodNotAllowed
			}
			if expected {
				m.requests[rt][o] = requests.WithLabelValues(rt.String(), o.String())
			}
		}
	}
	for rt := range numProxyRoutes {
		m.duration[rt] = duration.WithLabelValues(rt.String())
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
		[]string{"worker_id"}, nil)})
	if c, ok := r.policy.(prometheus.Collector); ok {
		m.reg.MustRegister(c)
	}
}

// workerCollector reports per-worker in-flight counts from the current view.
type workerCollector struct {
	r    *Router
	desc *prometheus.Desc
}

func (c workerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c workerCollector) Collect(ch chan<- prometheus.Metric) {
	v := c.r.view.Load()
	if v == nil {
		return
	}
	for _, w := range v.workers {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(w.InFlight()), w.id)
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
