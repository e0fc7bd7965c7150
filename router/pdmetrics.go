package router

import "github.com/prometheus/client_golang/prometheus"

// pdMetrics are the series of disaggregated serving (pd.go).
type pdMetrics struct {
	// requests counts PD requests by protocol and mode (disaggregated,
	// decode_only under --pd-min-uncached-tokens).
	requests *prometheus.CounterVec
	// legs counts ended legs by leg (prefill, decode), protocol and
	// result (ok or the failure reason).
	legs *prometheus.CounterVec
	// errors counts PD requests refused before any leg was sent, by
	// reason (no_prefill_worker, no_decode_worker, protocol, meta).
	errors *prometheus.CounterVec
}

func newPDMetrics(reg *prometheus.Registry) *pdMetrics {
	m := &pdMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infera_pd_requests_total",
			Help: "Requests of disaggregated models by PD protocol and mode (disaggregated, decode_only).",
		}, []string{"protocol", "mode"}),
		legs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infera_pd_legs_total",
			Help: "Prefill and decode legs by leg, PD protocol and result (ok or the failure reason).",
		}, []string{"leg", "protocol", "result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infera_pd_refused_total",
			Help: "Requests of disaggregated models refused before any leg was sent, by reason.",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.requests, m.legs, m.errors)
	return m
}
