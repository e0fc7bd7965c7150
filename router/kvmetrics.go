package router

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infera/infera/kvcache"
)

// kvMetrics are the kv-aware policy's series. Those of the request path are
// resolved once; per-worker stream counters are read from the subscriber at
// scrape time.
type kvMetrics struct {
	hitBlocks      prometheus.Histogram
	pickSeconds    prometheus.Histogram
	promptBlocks   prometheus.Counter
	hitBlocksTotal prometheus.Counter
	picks          [3][2]prometheus.Counter // [keyKind][precise]
	picksVec       *prometheus.CounterVec
	tokenizeErrors prometheus.Counter
	approxGauge    *prometheus.GaugeVec // set at scrape time
	divWarnings    prometheus.Counter
	div            divergenceMetrics
	coalesce       coalesceMetrics

	indexBlocks, indexMax *prometheus.Desc
	workerBlocks          *prometheus.Desc
	connected             *prometheus.Desc
	batches, events       *prometheus.Desc
	blocksStored          *prometheus.Desc
	blocksRemoved         *prometheus.Desc
	blocksDropped         *prometheus.Desc
	batchesDropped        *prometheus.Desc
	gaps, replays         *prometheus.Desc
	replayFailures        *prometheus.Desc
	resyncs               *prometheus.Desc
	joins, rebuilds       *prometheus.Desc
	learned               *prometheus.Desc
}

func newKVMetrics() kvMetrics {
	picks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_router_kv_picks_total",
		Help: "kv-aware picks by how the prompt was keyed (tokens, text, images) and whether the chosen worker was matched precisely.",
	}, []string{"key", "mode"})
	m := kvMetrics{
		hitBlocks: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "infera_router_kv_hit_blocks",
			Help:    "Prompt blocks the chosen worker was expected to hold (cached or being prefilled), per kv-aware pick.",
			Buckets: append([]float64{0}, prometheus.ExponentialBuckets(1, 2, 14)...), // 0, 1 .. 8192
		}),
		pickSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "infera_router_kv_pick_seconds",
			Help: "Time of one kv-aware pick: keying the prompt (tokenizing), matching it against every target, costing and charging the choice.",
			// 10 µs .. ~20 ms; 1 ms (issue 37's bound at 512 workers) is a bucket edge.
			Buckets: []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1.5e-3, 2.5e-3, 5e-3, 1e-2, 2e-2},
		}),
		promptBlocks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infera_router_kv_prompt_blocks_total",
			Help: "Prompt blocks routed by the kv-aware policy (divide hit blocks by it for the expected hit ratio).",
		}),
		hitBlocksTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infera_router_kv_hit_blocks_total",
			Help: "Prompt blocks the chosen workers were expected to hold.",
		}),
		tokenizeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infera_router_kv_tokenize_errors_total",
			Help: "Prompts that could not be tokenized and were keyed by their text instead.",
		}),
		approxGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "infera_router_worker_approximate",
			Help: "1 while a worker (any of its DP ranks) is routed approximately: no tokenizer, no KV event stream, or a stream not yet confirmed or resyncing.",
		}, []string{"worker_id"}),
	}
	m.divWarnings = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "infera_router_kv_divergence_warnings_total",
		Help: "Warnings that a worker's engine-reported prompt cache diverges from the kv-aware prediction (one per worker per hour at most).",
	})
	m.div = newDivergenceMetrics()
	m.coalesce = newCoalesceMetrics()
	for k, key := range []string{"tokens", "text", "images"} {
		for prec, mode := range []string{"approximate", "precise"} {
			m.picks[k][prec] = picks.WithLabelValues(key, mode)
		}
	}
	m.picksVec = picks
	labels := []string{"worker_id", "dp_rank"}
	desc := func(name, help string, l ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append(labels[:len(labels):len(labels)], l...), nil)
	}
	m.indexBlocks = prometheus.NewDesc("infera_router_kv_index_blocks", "(worker, block) entries held by the KV prefix index.", nil, nil)
	m.indexMax = prometheus.NewDesc("infera_router_kv_index_max_blocks", "Bound of the KV prefix index (--kv-index-max-blocks).", nil, nil)
	m.workerBlocks = desc("infera_router_kv_worker_blocks", "Blocks indexed for a worker's DP rank from its KV events.")
	m.connected = desc("infera_router_kv_events_connected", "1 while the KV event stream of a worker's DP rank is connected.")
	m.batches = desc("infera_router_kv_event_batches_total", "KV event batches applied.")
	m.events = desc("infera_router_kv_events_applied_total", "KV events in applied batches.")
	m.blocksStored = desc("infera_router_kv_blocks_stored_total", "Blocks newly indexed from BlockStored events.")
	m.blocksRemoved = desc("infera_router_kv_blocks_removed_total", "Blocks removed by BlockRemoved events.")
	m.blocksDropped = desc("infera_router_kv_blocks_dropped_total", "Stored blocks not indexed: parent unknown, or ignored (non-attention group, LoRA, extra keys, medium, block size).", "reason")
	m.batchesDropped = desc("infera_router_kv_event_batches_dropped_total", "Batches dropped: undecodable messages, duplicates of applied sequence numbers.", "reason")
	m.gaps = desc("infera_router_kv_event_gaps_total", "Sequence gaps detected in a KV event stream.")
	m.replays = desc("infera_router_kv_event_replays_total", "Replay exchanges completed with the engine's replay socket.")
	m.replayFailures = desc("infera_router_kv_event_replay_failures_total", "Replay exchanges that failed.")
	m.resyncs = desc("infera_router_kv_event_resyncs_total", "Times a worker's index was dropped for missed events (approximate until rebuilt).")
	m.joins = desc("infera_router_kv_event_joins_total", "Streams whose first batch was not the start of the engine's sequence (the router joined a running engine); approximate until rebuilt.")
	m.rebuilds = desc("infera_router_kv_event_rebuilds_total", "Returns to precise mode after a resync or a join, the view rebuilt from the events that followed.")
	m.learned = desc("infera_router_kv_blocks_learned_total", "Blocks indexed by matching a stored block whose parent predates the router to a prompt it routed there.")
	return m
}

// observe records one pick.
func (m *kvMetrics) observe(kind keyKind, precise bool, blocks, hits int) {
	prec := 0
	if precise {
		prec = 1
	}
	m.picks[kind][prec].Inc()
	m.hitBlocks.Observe(float64(hits))
	m.promptBlocks.Add(float64(blocks))
	m.hitBlocksTotal.Add(float64(hits))
}

// Describe implements prometheus.Collector.
func (p *KVAware) Describe(ch chan<- *prometheus.Desc) {
	m := &p.m
	m.hitBlocks.Describe(ch)
	m.pickSeconds.Describe(ch)
	m.promptBlocks.Describe(ch)
	m.hitBlocksTotal.Describe(ch)
	m.picksVec.Describe(ch)
	m.tokenizeErrors.Describe(ch)
	m.approxGauge.Describe(ch)
	m.divWarnings.Describe(ch)
	m.div.describe(ch)
	m.coalesce.holds.Describe(ch)
	m.coalesce.seconds.Describe(ch)
	for _, d := range []*prometheus.Desc{m.indexBlocks, m.indexMax, m.workerBlocks, m.connected, m.batches, m.events,
		m.blocksStored, m.blocksRemoved, m.blocksDropped, m.batchesDropped, m.gaps, m.replays, m.replayFailures, m.resyncs, m.joins, m.rebuilds, m.learned} {
		ch <- d
	}
	if p.peer != nil {
		p.peer.describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (p *KVAware) Collect(ch chan<- prometheus.Metric) {
	m := &p.m
	if p.peer != nil {
		p.peer.collect(ch)
	}
	p.mu.Lock()
	type target struct {
		key kvcache.Key
		sub bool
	}
	var targets []target
	for id, kw := range p.workers {
		v := 0.0
		if p.approximate(kw) {
			v = 1
		}
		m.approxGauge.WithLabelValues(id).Set(v)
		for _, t := range *kw.targets.Load() {
			targets = append(targets, target{key: t.key, sub: t.idx != nil})
		}
	}
	p.mu.Unlock()

	m.hitBlocks.Collect(ch)
	m.pickSeconds.Collect(ch)
	m.promptBlocks.Collect(ch)
	m.hitBlocksTotal.Collect(ch)
	m.picksVec.Collect(ch)
	m.tokenizeErrors.Collect(ch)
	m.approxGauge.Collect(ch)
	m.divWarnings.Collect(ch)
	m.div.collect(ch, p.div)
	m.coalesce.holds.Collect(ch)
	m.coalesce.seconds.Collect(ch)
	ch <- prometheus.MustNewConstMetric(m.indexBlocks, prometheus.GaugeValue, float64(p.idx.Len()))
	ch <- prometheus.MustNewConstMetric(m.indexMax, prometheus.GaugeValue, float64(p.idx.MaxBlocks()))
	for _, t := range targets {
		if !t.sub {
			continue
		}
		if p.feed != nil {
			p.collectFeed(ch, t.key)
			continue
		}
		st, ok := p.sub.Stats(t.key)
		if !ok {
			continue
		}
		id, rank := t.key.Worker, strconv.Itoa(t.key.DPRank)
		gauge := func(d *prometheus.Desc, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{id, rank}, extra...)...)
		}
		counter := func(d *prometheus.Desc, v uint64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{id, rank}, extra...)...)
		}
		gauge(m.workerBlocks, float64(st.Blocks))
		conn := 0.0
		if st.Connected {
			conn = 1
		}
		gauge(m.connected, conn)
		counter(m.batches, st.Batches)
		counter(m.events, st.Events)
		counter(m.blocksStored, st.Stored)
		counter(m.blocksRemoved, st.Removed)
		counter(m.blocksDropped, st.UnknownParent, "unknown_parent")
		counter(m.blocksDropped, st.Skipped, "ignored")
		counter(m.batchesDropped, st.BadMessages, "bad_message")
		counter(m.batchesDropped, st.Duplicates, "duplicate")
		counter(m.gaps, st.Gaps)
		counter(m.replays, st.Replays)
		counter(m.replayFailures, st.ReplayFailures)
		counter(m.resyncs, st.Resyncs)
		counter(m.joins, st.Joins)
		counter(m.rebuilds, st.Rebuilds)
		counter(m.learned, st.Learned)
	}
}

// collectFeed exports what a KV-event stream over NATS knows of k: its
// blocks, applied and rejected batches, and "connected" once its history
// has replayed.
func (p *KVAware) collectFeed(ch chan<- prometheus.Metric, k kvcache.Key) {
	m := &p.m
	st, ok := p.feed.Stats(k)
	if !ok {
		return
	}
	id, rank := k.Worker, strconv.Itoa(k.DPRank)
	ch <- prometheus.MustNewConstMetric(m.workerBlocks, prometheus.GaugeValue, float64(st.Blocks), id, rank)
	conn := 0.0
	if st.CaughtUp {
		conn = 1
	}
	ch <- prometheus.MustNewConstMetric(m.connected, prometheus.GaugeValue, conn, id, rank)
	ch <- prometheus.MustNewConstMetric(m.batches, prometheus.CounterValue, float64(st.Batches), id, rank)
	ch <- prometheus.MustNewConstMetric(m.batchesDropped, prometheus.CounterValue, float64(st.Bad), id, rank, "bad_message")
}
