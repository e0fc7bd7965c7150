package router

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/kvd/peer"
)

// Directed kvd-to-kvd pulls (--kvd-peer-hints). The kvd of a worker's
// host is the one the kvd registry names for the host of its worker_id
// (kvds register themselves: kvd --etcd-endpoints; the router watches
// --etcd-kvd-prefix and hands each snapshot to UpdateKVDs); for a host
// without a registered kvd, the worker's record may still name its kvd's
// peer listener (kvd_peer, worker --kvd-peer), and the registry wins when
// both do. When the kv-aware pick sends a request to worker H
// while another worker G, on a host with another kvd, holds more of the
// prompt's leading blocks, the router first sends H's kvd a prefetch hint
// naming G's kvd as the source (kvd/peer's hint exchange) and waits at
// most --kvd-peer-wait for the pull, so that H's engine finds the blocks
// in its kvd's RAM instead of computing them. The keys are G's engine
// block hashes of the blocks H lacks, as G's KV events named them, 8
// bytes big-endian: the kvd keys the simulator stores blocks under, in the
// namespace (served model, DefaultPrewarmCompatKey). Hints go only between
// workers whose real engine is the simulator (simKeyed); for any other
// pair the skip is counted (outcome "unsupported") and nothing is sent.
// vLLM's kvd connector stores chunks under sha256 over the chunk's full
// block digests, in a namespace of the model
// path and the TP/PP rank; vLLM's KV events carry only the low 8 bytes of
// each digest, so the router cannot name those keys (docs/operations.md).
//
// The hint is off the engine's path when it fails: a kvd that is down,
// refuses, or does not finish in time costs at most the wait, and the
// engine computes what did not arrive. It runs on the picking request's
// goroutine, only when both workers have a kvd, they differ, and G holds
// more.

// peerHintDeadline is how long pulled blocks stay pinned in H's RAM.
const peerHintDeadline = 30 * time.Second

type peerHints struct {
	h    *peer.Hinter
	wait time.Duration
	log  zerolog.Logger
	kvds atomic.Pointer[discovery.KVDSnapshot] // the kvd registry; nil: none seen

	hints  *prometheus.CounterVec
	pulled prometheus.Counter
}

func newPeerHints(secret string, wait time.Duration, log zerolog.Logger) *peerHints {
	return &peerHints{
		h: peer.NewHinter([]byte(secret)), wait: wait, log: log,
		hints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infera_router_kvd_peer_hints_total",
			Help: "Prefetch hints the router sent a worker's kvd naming another host's kvd as the source, by outcome (pulled: finished within --kvd-peer-wait; pending: not finished when the request went on, still pulling or dropped by the kvd's full queue, which its own infera_kvd_peer_hints_total tells apart; failed: not delivered or refused; unsupported: not sent, another host's kvd held more of the prompt but the workers' engine keys its kvd blocks in a way the router cannot name, e.g. vLLM's chunk keys).",
		}, []string{"outcome"}),
		pulled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infera_router_kvd_peer_pulled_blocks_total",
			Help: "Blocks the hinted kvds reported pulled before the request went on.",
		}),
	}
}

// kvdOf names the peer listener of the kvd on rec's host: the kvd
// registry's for the host of its worker_id, else the record's kvd_peer
// ("" when neither names one).
func kvdOf(kvds *discovery.KVDSnapshot, rec *discovery.Record) string {
	if rec == nil {
		return ""
	}
	if k, ok := kvds.ByHost(discovery.HostOf(rec.WorkerID)); ok {
		return k.Peer
	}
	return rec.KVDPeer
}

// direct sends the pick's target the hint, if another target on another
// kvd holds more of the prompt (precise matches only).
func (ph *peerHints) direct(p *KVAware, sc *kvScratch, best int) {
	kvds := ph.kvds.Load()
	dstRec := sc.targets[best].worker.Record()
	dstKVD := kvdOf(kvds, dstRec)
	if dstKVD == "" {
		return
	}
	src, most, source := -1, sc.hits[best], ""
	for i, t := range sc.targets {
		if sc.hits[i] <= most || sc.setOf[i] != sc.setOf[best] || !t.precise() {
			continue
		}
		if k := kvdOf(kvds, t.worker.Record()); k != "" && k != dstKVD {
			src, most, source = i, sc.hits[i], k
		}
	}
	if src < 0 {
		return
	}
	if !simKeyed(dstRec) || !simKeyed(sc.targets[src].worker.Record()) {
		ph.hints.WithLabelValues("unsupported").Inc()
		return
	}
	hs := sc.sets[sc.setOf[best]].hashes
	eng := p.idx.AppendEngineHashes(nil, sc.targets[src].idx, hs[sc.hits[best]:most])
	if len(eng) == 0 {
		return
	}
	keys := make([][]byte, len(eng))
	buf := make([]byte, 8*len(eng))
	for i, e := range eng {
		keys[i] = binary.BigEndian.AppendUint64(buf[8*i:8*i], e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ph.wait+kvdDialTimeout)
	defer cancel()
	r, err := ph.h.Send(ctx, dstKVD, peer.Hint{Model: []byte(dstRec.ModelName), Compat: []byte(DefaultPrewarmCompatKey),
		Source: source, Keys: keys, Deadline: peerHintDeadline, Wait: ph.wait})
	switch {
	case err != nil:
		ph.hints.WithLabelValues("failed").Inc()
		ph.log.Warn().Err(err).Str("kvd", dstKVD).Str("source", source).Int("blocks", len(keys)).
			Msg("kvd peer hint not delivered; the engine computes the blocks")
	case r.Done:
		ph.hints.WithLabelValues("pulled").Inc()
		ph.pulled.Add(float64(r.Pulled))
		ph.log.Debug().Str("kvd", dstKVD).Str("source", source).Int("blocks", len(keys)).Uint32("pulled", r.Pulled).
			Msg("kvd peer pull directed")
	default:
		ph.hints.WithLabelValues("pending").Inc()
	}
}

// simKeyed reports whether rec's engine keeps its blocks in kvd under the
// keys a hint can name: the simulator's (its engine block hashes, 8 bytes
// big-endian), whatever engine it imitates (real_engine "sim"). vLLM's
// connector keys chunks by sha256 over the full block digests,
// of which KV events carry only the low 8 bytes; SGLang's and ATOM's
// connectors are not served either.
func simKeyed(rec *discovery.Record) bool {
	if rec == nil {
		return false
	}
	e := rec.RealEngine
	if e == "" {
		e = rec.Engine
	}
	return e == discovery.EngineSim
}

// updateKVDs takes a new snapshot of the kvd registry.
func (p *KVAware) updateKVDs(s *discovery.KVDSnapshot) {
	if p.peer != nil {
		p.peer.kvds.Store(s)
	}
}

// UpdateKVDs hands the router a snapshot of the kvd registry (discovery's
// KVDWatcher), from which directed kvd-to-kvd pulls name each worker's
// kvd; without --kvd-peer-hints it is ignored. Safe from any goroutine.
func (r *Router) UpdateKVDs(s *discovery.KVDSnapshot) {
	if k, ok := r.policy.(interface{ updateKVDs(*discovery.KVDSnapshot) }); ok {
		k.updateKVDs(s)
	}
}

func (ph *peerHints) describe(ch chan<- *prometheus.Desc) {
	ph.hints.Describe(ch)
	ph.pulled.Describe(ch)
}

func (ph *peerHints) collect(ch chan<- prometheus.Metric) {
	ph.hints.Collect(ch)
	ph.pulled.Collect(ch)
}
