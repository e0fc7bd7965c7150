package kvd

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// collector exports the store's and server's counters at scrape time.
type collector struct {
	st  *Store
	srv *Server
}

type metric struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
}

func newMetric(name, help string, typ prometheus.ValueType, labels ...string) metric {
	return metric{prometheus.NewDesc(name, help, labels, nil), typ}
}

var (
	mEntries     = newMetric("infera_kvd_entries", "Entries in host RAM (L2), by tier placement.", prometheus.GaugeValue, "placement")
	mHostBytes   = newMetric("infera_kvd_host_bytes", "Value bytes held in host RAM (arena plus inline).", prometheus.GaugeValue)
	mArenaBytes  = newMetric("infera_kvd_arena_capacity_bytes", "Size of the shared arena.", prometheus.GaugeValue)
	mSlots       = newMetric("infera_kvd_arena_slots", "Arena slots, by state.", prometheus.GaugeValue, "state")
	mPages       = newMetric("infera_kvd_arena_pages", "Arena pages, by state (free or held by a size class).", prometheus.GaugeValue, "state")
	mClassSlots  = newMetric("infera_kvd_arena_class_slots", "Arena slots of each size class holding pages, by state.", prometheus.GaugeValue, "slot_bytes", "state")
	mClassBytes  = newMetric("infera_kvd_arena_class_value_bytes", "Value bytes stored in each size class.", prometheus.GaugeValue, "slot_bytes")
	mLongBytes   = newMetric("infera_kvd_long_bytes", "Bytes in the L3 tablespace.", prometheus.GaugeValue)
	mLongEntries = newMetric("infera_kvd_long_entries", "Entries in the L3 tablespace.", prometheus.GaugeValue)
	mOps         = newMetric("infera_kvd_requests_total", "Requests by op.", prometheus.CounterValue, "op")
	mGets        = newMetric("infera_kvd_gets_total", "Key lookups (a batch counts each key).", prometheus.CounterValue)
	mHits        = newMetric("infera_kvd_hits_total", "Key lookups answered from RAM or L3.", prometheus.CounterValue)
	mMisses      = newMetric("infera_kvd_misses_total", "Key lookups that found nothing.", prometheus.CounterValue)
	mSets        = newMetric("infera_kvd_sets_total", "Sets and commits.", prometheus.CounterValue)
	mRejected    = newMetric("infera_kvd_sets_rejected_total", "Sets refused (retention, capacity).", prometheus.CounterValue)
	mEvictions   = newMetric("infera_kvd_evictions_total", "RAM evictions, by the evicted entry's retention.", prometheus.CounterValue, "retention")
	mExpired     = newMetric("infera_kvd_expired_total", "Entries dropped when their TTL passed.", prometheus.CounterValue)
	mLeases      = newMetric("infera_kvd_leases_total", "Arena leases ended, by outcome.", prometheus.CounterValue, "outcome")
	mLeasesAct   = newMetric("infera_kvd_leases_active", "Arena leases reserved and not yet committed.", prometheus.GaugeValue)
	mLongWrites  = newMetric("infera_kvd_long_writes_total", "Write-throughs of long entries to L3, by outcome.", prometheus.CounterValue, "outcome")
	mLongHits    = newMetric("infera_kvd_long_hits_total", "Gets answered from L3 and promoted into RAM.", prometheus.CounterValue)
	mPrefetch    = newMetric("infera_kvd_prefetch_total", "Prefetch hints and their keys, by stage.", prometheus.CounterValue, "stage")
	mTorn        = newMetric("infera_kvd_torn_reads_total", "Server-side copies that saw their slot rewritten.", prometheus.CounterValue)
	mConns       = newMetric("infera_kvd_connections", "Open client connections.", prometheus.GaugeValue)
	mConnsTotal  = newMetric("infera_kvd_connections_total", "Accepted client connections.", prometheus.CounterValue)
	mRefused     = newMetric("infera_kvd_connections_refused_total", "Connections refused by the peer-credential check.", prometheus.CounterValue)
	mBadFrames   = newMetric("infera_kvd_bad_frames_total", "Connections closed on an undecodable or oversized frame.", prometheus.CounterValue)
)

var allMetrics = []metric{mEntries, mHostBytes, mArenaBytes, mSlots, mPages, mClassSlots, mClassBytes, mLongBytes, mLongEntries, mOps, mGets, mHits, mMisses, mSets,
	mRejected, mEvictions, mExpired, mLeases, mLeasesAct, mLongWrites, mLongHits, mPrefetch, mTorn, mConns, mConnsTotal, mRefused, mBadFrames}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range allMetrics {
		ch <- m.desc
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.st.Counters()
	emit := func(m metric, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(m.desc, m.typ, float64(v), labels...)
	}
	emit(mEntries, s.ArenaEntries, "arena")
	emit(mEntries, s.InlineEntries, "inline")
	emit(mHostBytes, s.HostBytes)
	if a := c.st.Arena(); a != nil {
		emit(mArenaBytes, a.Size())
	} else {
		emit(mArenaBytes, 0)
	}
	emit(mSlots, s.NumSlots-s.FreeSlots-s.LeasesActive, "used")
	emit(mSlots, s.LeasesActive, "leased")
	emit(mSlots, s.FreeSlots, "free")
	emit(mPages, s.FreePages, "free")
	emit(mPages, s.Pages-s.FreePages, "held")
	for _, cs := range s.Classes {
		size := strconv.FormatInt(cs.SlotSize, 10)
		emit(mClassSlots, cs.UsedSlots, size, "used")
		emit(mClassSlots, cs.Slots-cs.UsedSlots, size, "free")
		emit(mClassBytes, cs.ValueBytes, size)
	}
	emit(mLongBytes, s.LongBytes)
	emit(mLongEntries, s.LongEntries)
	for op := OpHello; op <= OpStats; op++ {
		emit(mOps, c.srv.RequestsByOp[op].Load(), op.String())
	}
	emit(mGets, s.Gets)
	emit(mHits, s.Hits)
	emit(mMisses, s.Misses)
	emit(mSets, s.Sets)
	emit(mRejected, s.Rejected)
	for r := range numRetentions {
		emit(mEvictions, s.EvictionsByRetention[r], r.String())
	}
	emit(mExpired, s.Expired)
	emit(mLeases, s.LeasesCommitted, "committed")
	emit(mLeases, s.LeasesCancelled, "cancelled")
	emit(mLeasesAct, s.LeasesActive)
	emit(mLongWrites, s.LongWrites, "written")
	emit(mLongWrites, s.LongWriteErrors, "error")
	emit(mLongWrites, s.LongWritesDropped, "dropped")
	emit(mLongHits, s.LongHits)
	emit(mPrefetch, s.PrefetchHints, "hints")
	emit(mPrefetch, s.PrefetchFetched, "fetched")
	emit(mPrefetch, s.PrefetchDropped, "dropped")
	emit(mPrefetch, s.PrefetchUseful, "useful")
	emit(mTorn, s.TornReads)
	emit(mConns, c.srv.ConnsActive.Load())
	emit(mConnsTotal, c.srv.ConnsTotal.Load())
	emit(mRefused, c.srv.Rejected.Load())
	emit(mBadFrames, c.srv.BadFrames.Load())
}

// AdminHandler serves /metrics (Prometheus text) and /health.
func (s *Server) AdminHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{st: s.store, srv: s})
	reg.MustRegister(s.opt.Collectors...)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
