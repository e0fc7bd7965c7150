package router

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

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
	// served holds, by protocol (pdProtocol.index), the two series every
	// disaggregated request counts, each resolved on its first count (a
	// series appears in /metrics when first counted, as before):
	// WithLabelValues hashes its labels on every call, ~1,200 instructions.
	served [numPDProtocols]struct {
		disaggregated, prefillOK atomic.Pointer[prometheus.Counter]
	}
}

// counter returns the series of vec for labels, resolved into *c on the
// first call (two calls at once resolve the same series).
func counter(c *atomic.Pointer[prometheus.Counter], vec *prometheus.CounterVec, labels ...string) prometheus.Counter {
	if p := c.Load(); p != nil {
		return *p
	}
	s := vec.WithLabelValues(labels...)
	c.Store(&s)
	return s
}

// disaggregated counts a request of protocol p served by a pair.
func (m *pdMetrics) disaggregated(p *pdProtocol) {
	if c := m.served[p.index].disaggregated.Load(); c != nil {
		(*c).Inc()
		return
	}
	counter(&m.served[p.index].disaggregated, m.requests, p.name, "disaggregated").Inc()
}

// prefillOK counts a prefill leg of protocol p that ended well.
func (m *pdMetrics) prefillOK(p *pdProtocol) {
	if c := m.served[p.index].prefillOK.Load(); c != nil {
		(*c).Inc()
		return
	}
	counter(&m.served[p.index].prefillOK, m.legs, "prefill", p.name, "ok").Inc()
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
