package peer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/infera/infera/kvd"
)

// Prefetcher runs the pulls that prefetch hints naming a source ask for
// (kvd.ServerOptions.PeerPrefetch): a bounded queue, one worker, every
// pull bounded by its hint's deadline; pulled blocks go into the store
// for that deadline, as L3 prefetches do, and the first get of each counts
// as a useful prefetch. A full queue drops the hint; a
// hint whose deadline passed before its pull began is late and skipped;
// a failed pull leaves its keys to the engine (never on its path).
type Prefetcher struct {
	st  *kvd.Store
	p   *Puller
	log zerolog.Logger
	q   chan pullJob

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	hints, dropped, late, failed, pulled, bytes atomic.Int64
}

type pullJob struct {
	source        string
	model, compat []byte
	keys          [][]byte
	deadline      time.Duration
	at            time.Time
	done          chan int // HintWait's: the blocks pulled, once finished
}

// NewPrefetcher starts a prefetcher of queue pending hints.
func NewPrefetcher(st *kvd.Store, p *Puller, queue int, log zerolog.Logger) *Prefetcher {
	if queue <= 0 {
		queue = 64
	}
	f := &Prefetcher{st: st, p: p, log: log, q: make(chan pullJob, queue)}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.wg.Add(1)
	go f.run()
	return f
}

// Hint queues a pull (it copies what it keeps; it never blocks).
func (f *Prefetcher) Hint(source string, model, compat []byte, keys [][]byte, deadline time.Duration) {
	f.queue(source, model, compat, keys, deadline, nil)
}

// HintWait queues a pull as Hint does and waits at most wait for it to
// finish: done says it did, pulled how many blocks arrived. A pull still
// running at wait goes on (its blocks are for the requests that follow).
// It is a HintFunc.
func (f *Prefetcher) HintWait(source string, model, compat []byte, keys [][]byte, deadline, wait time.Duration) (pulled int, done bool) {
	if wait <= 0 {
		f.queue(source, model, compat, keys, deadline, nil)
		return 0, false
	}
	ch := make(chan int, 1)
	if !f.queue(source, model, compat, keys, deadline, ch) {
		return 0, false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case n := <-ch:
		return n, true
	case <-t.C:
		return 0, false
	case <-f.ctx.Done():
		return 0, false
	}
}

func (f *Prefetcher) queue(source string, model, compat []byte, keys [][]byte, deadline time.Duration, done chan int) bool {
	f.hints.Add(1)
	j := pullJob{source: source, model: append([]byte(nil), model...), compat: append([]byte(nil), compat...),
		deadline: deadline, at: time.Now(), done: done}
	for _, k := range keys {
		j.keys = append(j.keys, append([]byte(nil), k...))
	}
	select {
	case f.q <- j:
		return true
	default:
		f.dropped.Add(1)
		return false
	}
}

// Close stops the worker (a pull in flight is cancelled).
func (f *Prefetcher) Close() {
	f.cancel()
	f.wg.Wait()
}

func (f *Prefetcher) run() {
	defer f.wg.Done()
	ctx := f.ctx
	for {
		var j pullJob
		select {
		case <-ctx.Done():
			return
		case j = <-f.q:
		}
		end := j.at.Add(j.deadline)
		if !time.Now().Before(end) {
			f.late.Add(1)
			if j.done != nil {
				j.done <- 0
			}
			continue
		}
		pctx, pcancel := context.WithDeadline(ctx, end)
		ttl := j.deadline.Seconds()
		st, err := f.p.Pull(pctx, j.source, j.model, j.compat, j.keys, func(key, value []byte) {
			f.st.Set(&kvd.SetArgs{Model: j.model, CompatKey: j.compat, Key: key, Value: value, TTL: ttl, HasTTL: true, Warmed: true})
		})
		pcancel()
		if j.done != nil {
			j.done <- st.Pulled
		}
		f.pulled.Add(int64(st.Pulled))
		f.bytes.Add(st.Bytes)
		if err != nil {
			f.failed.Add(1)
			f.log.Debug().Err(err).Str("source", j.source).Int("keys", len(j.keys)).Msg("peer pull failed; the engine computes or loads them itself")
		}
	}
}

var (
	mHints  = prometheus.NewDesc("infera_kvd_peer_hints_total", "prefetch hints naming a source kvd, by outcome (queued, dropped: queue full, late: deadline passed before the pull)", []string{"outcome"}, nil)
	mPulled = prometheus.NewDesc("infera_kvd_peer_pulled_blocks_total", "blocks pulled from other hosts' kvds", nil, nil)
	mBytes  = prometheus.NewDesc("infera_kvd_peer_pulled_bytes_total", "bytes pulled from other hosts' kvds", nil, nil)
	mFailed = prometheus.NewDesc("infera_kvd_peer_pulls_failed_total", "pulls that stopped on an error (source gone, denied, timeout)", nil, nil)
	mTorn   = prometheus.NewDesc("infera_kvd_peer_torn_blocks_total", "blocks rewritten on the source while pulled (dropped, never served)", nil, nil)
)

// Collector exposes the prefetcher's and its puller's counters.
func (f *Prefetcher) Collector() prometheus.Collector { return prefetchCollector{f} }

type prefetchCollector struct{ f *Prefetcher }

func (c prefetchCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mHints, mPulled, mBytes, mFailed, mTorn} {
		ch <- d
	}
}

func (c prefetchCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.f
	h, d, l := f.hints.Load(), f.dropped.Load(), f.late.Load()
	ch <- prometheus.MustNewConstMetric(mHints, prometheus.CounterValue, float64(h-d-l), "queued")
	ch <- prometheus.MustNewConstMetric(mHints, prometheus.CounterValue, float64(d), "dropped")
	ch <- prometheus.MustNewConstMetric(mHints, prometheus.CounterValue, float64(l), "late")
	ch <- prometheus.MustNewConstMetric(mPulled, prometheus.CounterValue, float64(f.pulled.Load()))
	ch <- prometheus.MustNewConstMetric(mBytes, prometheus.CounterValue, float64(f.bytes.Load()))
	ch <- prometheus.MustNewConstMetric(mFailed, prometheus.CounterValue, float64(f.failed.Load()))
	ch <- prometheus.MustNewConstMetric(mTorn, prometheus.CounterValue, float64(f.p.Stats().Torn))
}
