package router

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// TestRequestDurationsMatchPrometheus observes the same requests in
// requestDurations and in the two Prometheus histograms it replaces (ours
// by route, Infera's by outcome, the same buckets) and checks that the
// exported text is the same, bound values included.
func TestRequestDurationsMatchPrometheus(t *testing.T) {
	got := prometheus.NewRegistry()
	h := newRequestDurations()
	got.MustRegister(h)
	want := prometheus.NewRegistry()
	byRoute := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "infera_router_request_duration_seconds",
		Help:    "Time from a proxied request's arrival to the end of its response.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
	}, []string{"route"})
	byOutcome := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "infera_request_duration_seconds",
		Help:    "End-to-end server-observed request latency (pick + worker round-trip), by router (mixed, disagg) and outcome (ok, 4xx, 5xx, error), as Infera exports it.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
	}, []string{"router", "outcome"})
	want.MustRegister(byRoute, byOutcome)
	for rt := range numProxyRoutes {
		byRoute.WithLabelValues(rt.String())
	}
	for io := range numInferaOutcomes {
		byOutcome.WithLabelValues(inferaRouterLabel, inferaOutcomeLabels[io])
	}

	// Every bound exactly, just above and below it, zero, and beyond the
	// last, on every route and outcome.
	var ds []time.Duration
	for _, le := range durationBounds {
		d := time.Duration(le * float64(time.Second))
		ds = append(ds, d, d-1, d+1)
	}
	ds = append(ds, 0, 1, 200*time.Second, time.Hour)
	n := 0
	for _, d := range ds {
		for rt := range numProxyRoutes {
			for io := range numInferaOutcomes {
				n++
				if n%3 == 0 {
					continue // not every cell alike
				}
				s := d.Seconds()
				h.observe(rt, io, s)
				byRoute.WithLabelValues(rt.String()).Observe(s)
				byOutcome.WithLabelValues(inferaRouterLabel, inferaOutcomeLabels[io]).Observe(s)
			}
		}
	}
	// The sums are added in another order (cells at scrape time): equal
	// to a rounding; all else byte for byte.
	g, gs := gatherText(t, got)
	w, ws := gatherText(t, want)
	if g != w {
		t.Fatalf("requestDurations exports\n%s\nPrometheus' histograms\n%s", g, w)
	}
	if len(gs) != len(ws) {
		t.Fatalf("%d sums, want %d", len(gs), len(ws))
	}
	for i := range gs {
		if math.Abs(gs[i]-ws[i]) > 1e-12*ws[i] {
			t.Errorf("sum %d: %v, want %v", i, gs[i], ws[i])
		}
	}
}

// gatherText is reg's exposition without its histograms' sums, and the sums.
func gatherText(t *testing.T, reg *prometheus.Registry) (string, []float64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sums []float64
	var b strings.Builder
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			sums = append(sums, m.GetHistogram().GetSampleSum())
			m.GetHistogram().SampleSum = nil
		}
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String(), sums
}

func TestRequestDurationsSumExact(t *testing.T) {
	h := newRequestDurations()
	h.observe(RouteCompletions, infera5xx, 0.25)
	h.observe(RouteCompletions, infera5xx, 0.5)
	if s := math.Float64frombits(h.cells[RouteCompletions][infera5xx].sumBits.Load()); s != 0.75 {
		t.Fatalf("sum %v, want 0.75", s)
	}
}

func TestMetricsObserveAllocs(t *testing.T) {
	m := newMetrics()
	if n := testing.AllocsPerRun(1000, func() {
		m.observe(RouteChatCompletions, outcomeOK, 200, 3*time.Millisecond)
	}); n != 0 {
		t.Fatalf("observe allocates %v times, want 0", n)
	}
}

// BenchmarkMetricsObserve is a request end's duration histograms, from
// every P at once (the cache lines the requests share).
func BenchmarkMetricsObserve(b *testing.B) {
	m := newMetrics()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.observe(RouteChatCompletions, outcomeOK, 200, 3*time.Millisecond)
		}
	})
}
