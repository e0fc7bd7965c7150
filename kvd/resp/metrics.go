package resp

import "github.com/prometheus/client_golang/prometheus"

var (
	mConns      = prometheus.NewDesc("infera_kvd_resp_connections", "Open RESP client connections.", nil, nil)
	mConnsTotal = prometheus.NewDesc("infera_kvd_resp_connections_total", "Accepted RESP client connections.", nil, nil)
	mRefused    = prometheus.NewDesc("infera_kvd_resp_connections_refused_total", "RESP connections closed over --resp-max-clients.", nil, nil)
	mCommands   = prometheus.NewDesc("infera_kvd_resp_commands_total", "RESP commands processed.", nil, nil)
	mProtoErrs  = prometheus.NewDesc("infera_kvd_resp_protocol_errors_total", "RESP connections closed on a malformed request.", nil, nil)
	mOutput     = prometheus.NewDesc("infera_kvd_resp_output_disconnects_total",
		"RESP clients disconnected over their output buffer: limit (--resp-max-output-bytes) or stalled (--resp-output-timeout).", []string{"reason"}, nil)
)

type collector struct{ s *Server }

// Collector exports the listener's Counters (register it with the kvd
// admin handler's metrics).
func (s *Server) Collector() prometheus.Collector { return collector{s} }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mConns, mConnsTotal, mRefused, mCommands, mProtoErrs, mOutput} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	k := &c.s.C
	ch <- prometheus.MustNewConstMetric(mConns, prometheus.GaugeValue, float64(k.ConnsActive.Load()))
	ch <- prometheus.MustNewConstMetric(mConnsTotal, prometheus.CounterValue, float64(k.ConnsTotal.Load()))
	ch <- prometheus.MustNewConstMetric(mRefused, prometheus.CounterValue, float64(k.Refused.Load()))
	ch <- prometheus.MustNewConstMetric(mCommands, prometheus.CounterValue, float64(k.Commands.Load()))
	ch <- prometheus.MustNewConstMetric(mProtoErrs, prometheus.CounterValue, float64(k.ProtocolErrors.Load()))
	ch <- prometheus.MustNewConstMetric(mOutput, prometheus.CounterValue, float64(k.OutputLimit.Load()), "limit")
	ch <- prometheus.MustNewConstMetric(mOutput, prometheus.CounterValue, float64(k.OutputStalled.Load()), "stalled")
}
