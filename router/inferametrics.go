package router

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/infera/infera/discovery"
)

// The metrics a dashboard or alert written for Infera's Python server relies
// on: its metric names, labels and values (docs/operations.md, "Moving from
// Python Infera").

// Infera's infera_request_duration_seconds outcome label.
const (
	inferaOK = iota
	infera4xx
	infera5xx
	inferaError
	numInferaOutcomes
)

var inferaOutcomeLabels = [numInferaOutcomes]string{"ok", "4xx", "5xx", "error"}

// inferaOutcome maps a finished request onto Infera's outcome label.
func inferaOutcome(o outcome, status int) int {
	switch {
	case o == outcomeOK:
		return inferaOK
	case status >= 500:
		return infera5xx
	case status >= 400:
		return infera4xx
	}
	return inferaError
}

// observe records a finished proxied request's duration in our per-route
// histogram and in Infera's {router, outcome} one.
func (m *metrics) observe(rt Route, o outcome, status int, d time.Duration) {
	m.durations.observe(rt, inferaOutcome(o, status), d.Seconds())
}

// Breaker state values as Infera exports them: 0 closed, 1 half-open, 2 open.
func inferaBreakerValue(state uint32) float64 {
	switch state {
	case breakerOpen:
		return 2
	case breakerHalfOpen:
		return 1
	}
	return 0
}

// inferaRouterLabel is Infera's "router" label: the mixed path (the PD path
// will report "disagg").
const inferaRouterLabel = "mixed"

// newInferaMetrics adds Infera's series that have no counterpart of ours
// under the same name: active workers by disagg_mode and the
// unroutable-workers gauge (ours). The request-duration histogram by router
// and outcome is requestDurations' (metrics.go).
func (m *metrics) newInferaMetrics() []prometheus.Collector {
	m.activeWorkers = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "infera_active_workers",
		Help: "Workers in active status that the router can reach, by disagg_mode.",
	}, []string{"disagg_mode"})
	m.unroutable = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "infera_router_unroutable_workers",
		Help: "Valid workers listed in /v1/workers that the router cannot send requests to, by reason (unroutable: nats transport, unroutable: status dead).",
	}, []string{"reason"})
	return []prometheus.Collector{m.activeWorkers, m.unroutable}
}

// setFleet updates the per-view gauges.
func (m *metrics) setFleet(byMode map[discovery.DisaggMode]int, unroutable map[string]int) {
	m.activeWorkers.Reset()
	for mode, n := range byMode {
		m.activeWorkers.WithLabelValues(string(mode)).Set(float64(n))
	}
	m.unroutable.Reset()
	for reason, n := range unroutable {
		m.unroutable.WithLabelValues(reason).Set(float64(n))
	}
}

// metricValue reads a counter for a derived series at scrape time.
func metricValue(c prometheus.Counter) float64 {
	var d dto.Metric
	if c.Write(&d) != nil {
		return 0
	}
	return d.Counter.GetValue()
}

// inferaCollector exports, at scrape time, Infera's names for series we
// already count under ours: infera_router_picks_total{role, worker_id}
// (= infera_worker_picks_total) and infera_request_inflight{router}
// (= infera_requests_in_flight).
type inferaCollector struct {
	r        *Router
	picks    *prometheus.Desc
	inflight *prometheus.Desc
}

func newInferaCollector(r *Router) inferaCollector {
	return inferaCollector{
		r: r,
		picks: prometheus.NewDesc("infera_router_picks_total",
			"Total number of pick() decisions made by the router, per role (mixed, prefill, decode) and worker.",
			[]string{"role", "worker_id"}, nil),
		inflight: prometheus.NewDesc("infera_request_inflight",
			"Currently in-flight requests at the server, by router (mixed, disagg).", []string{"router"}, nil),
	}
}

func (c inferaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.picks
	ch <- c.inflight
}

func (c inferaCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(c.r.metrics.inflight.Load()), inferaRouterLabel)
	v := c.r.view.Load()
	if v == nil {
		return
	}
	for _, w := range v.workers {
		role := string(w.Record().DisaggMode)
		if role == "" {
			role = string(discovery.DisaggMixed)
		}
		ch <- prometheus.MustNewConstMetric(c.picks, prometheus.CounterValue, metricValue(w.picks), role, w.id)
	}
}
