package l4

import "github.com/prometheus/client_golang/prometheus"

var (
	mUp     = prometheus.NewDesc("infera_kvd_l4_up", "1 while the L4 Redis answers, 0 during an outage (kvd then serves from L2/L3)", nil, nil)
	mWrites = prometheus.NewDesc("infera_kvd_l4_writes_total", "L4 write-behinds by outcome (written, dropped: queue full or Redis down, error)", []string{"outcome"}, nil)
	mReads  = prometheus.NewDesc("infera_kvd_l4_reads_total", "L4 reads on an L2/L3 miss by outcome (hit, miss, checksum_mismatch: counted as a miss)", []string{"outcome"}, nil)
	mProm   = prometheus.NewDesc("infera_kvd_l4_promotions_total", "L4 hits copied into L3", nil, nil)
	mOut    = prometheus.NewDesc("infera_kvd_l4_outages_total", "times the L4 Redis became unreachable", nil, nil)
)

// Collector exposes the tier's gauge and counters to Prometheus.
func (t *Tier) Collector() prometheus.Collector { return collector{t} }

type collector struct{ t *Tier }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mUp, mWrites, mReads, mProm, mOut} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.t.Stats()
	up := 0.0
	if s.Up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(mUp, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(mWrites, prometheus.CounterValue, float64(s.Writes), "written")
	ch <- prometheus.MustNewConstMetric(mWrites, prometheus.CounterValue, float64(s.WritesDropped), "dropped")
	ch <- prometheus.MustNewConstMetric(mWrites, prometheus.CounterValue, float64(s.WriteErrors), "error")
	ch <- prometheus.MustNewConstMetric(mReads, prometheus.CounterValue, float64(s.Hits), "hit")
	ch <- prometheus.MustNewConstMetric(mReads, prometheus.CounterValue, float64(s.Misses-s.ChecksumFailures), "miss")
	ch <- prometheus.MustNewConstMetric(mReads, prometheus.CounterValue, float64(s.ChecksumFailures), "checksum_mismatch")
	ch <- prometheus.MustNewConstMetric(mProm, prometheus.CounterValue, float64(s.Promotions))
	ch <- prometheus.MustNewConstMetric(mOut, prometheus.CounterValue, float64(s.Outages))
}
