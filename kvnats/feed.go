package kvnats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/infera/infera/kvcache"
)

// ErrClosed reports a Feed used after Close.
var ErrClosed = errors.New("kvnats: feed closed")

// FeedStats are one followed rank's counters.
type FeedStats struct {
	Batches   uint64 // batches applied
	Bad       uint64 // payloads that could not be decoded
	Foreign   uint64 // messages whose subject named another worker or rank
	Seeded    int    // hashes seeded from the view bucket at Add
	CaughtUp  bool   // the retained history has been replayed
	Mode      kvcache.Mode
	Blocks    int
	StreamSeq uint64 // stream sequence of the last message applied
}

// Feed is the router's KV-event source over NATS: it feeds the same
// kvcache.Index the ZMQ Subscriber feeds, one followed rank (Key) at a
// time. Each rank gets an ephemeral ordered JetStream consumer on its own
// subject with deliver policy all, so its whole retained history replays
// in order (parents before children) whenever the router starts following
// it — also when the router learns the worker after the stream was
// replayed, which one wildcard subscription would have dropped — and
// resumes where it left off after a NATS outage. The worker id and rank
// are parsed from each message's subject and checked against the rank
// followed. Before its history replays, a rank is seeded from its
// infera_kv_view bucket entry when there is one.
//
// A rank is approximate until its history has replayed (the consumer had
// nothing pending), precise after.
//
// Concurrency: all methods are safe for concurrent use. Each rank's
// consumer delivers on one goroutine, the only writer of that rank's
// index entry; Remove and Close stop it and wait.
type Feed struct {
	idx *kvcache.Index
	js  jetstream.JetStream
	kv  jetstream.KeyValue // nil: no bucket
	log zerolog.Logger

	mu     sync.Mutex
	ranks  map[kvcache.Key]*rank
	closed bool
}

type rank struct {
	key     kvcache.Key
	srank   int // the rank in the subject and bucket key
	subject string
	w       *kvcache.Worker
	cc      jetstream.ConsumeContext
	dec     *kvcache.Decoder
	batch   kvcache.Batch

	batches, bad, foreign, seq atomic.Uint64
	seeded                     int
	caughtUp                   atomic.Bool
	logged                     bool
}

// NewFeed returns a Feed over js feeding idx. It creates the event stream
// and the view bucket if they do not exist.
func NewFeed(ctx context.Context, idx *kvcache.Index, js jetstream.JetStream, log zerolog.Logger) (*Feed, error) {
	if idx == nil || js == nil {
		return nil, fmt.Errorf("kvnats: nil index or jetstream")
	}
	if _, err := EnsureStream(ctx, js); err != nil {
		return nil, err
	}
	kv, err := EnsureBucket(ctx, js)
	if err != nil {
		return nil, err
	}
	return &Feed{idx: idx, js: js, kv: kv, log: log.With().Str("component", "kv-events-nats").Logger(),
		ranks: make(map[kvcache.Key]*rank)}, nil
}

// addTimeout bounds the JetStream calls of one Add.
const addTimeout = 10 * time.Second

// Add follows k, published on subject rank subjectRank (k's DP rank for an
// engine that multiplexes ranks, 0 for a single-rank worker), and returns
// its index handle; blockSize is the engine's block size from discovery
// (0 = learn it). Adding a key already followed returns its handle.
func (f *Feed) Add(k kvcache.Key, subjectRank, blockSize int) (*kvcache.Worker, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, ErrClosed
	}
	if r, ok := f.ranks[k]; ok {
		return r.w, nil
	}
	w, err := f.idx.Register(k, blockSize)
	if err != nil {
		return nil, fmt.Errorf("kvnats: register %s: %w", k.Worker, err)
	}
	r := &rank{key: k, srank: subjectRank, subject: Subject(k.Worker, subjectRank), w: w, dec: kvcache.NewDecoder()}
	w.SetMode(kvcache.ModeApproximate)
	ctx, cancel := context.WithTimeout(context.Background(), addTimeout)
	defer cancel()
	f.seed(ctx, r)
	cons, err := f.js.OrderedConsumer(ctx, StreamName, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{r.subject},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err == nil {
		if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
			r.setCaughtUp(f.log)
		}
		r.cc, err = cons.Consume(func(m jetstream.Msg) { r.handle(f.idx, m, f.log) })
	}
	if err != nil {
		f.idx.Unregister(w)
		return nil, fmt.Errorf("kvnats: follow %s: %w", r.subject, err)
	}
	f.ranks[k] = r
	return w, nil
}

// seed indexes the rank's bucket view, if any, before its history replays.
func (f *Feed) seed(ctx context.Context, r *rank) {
	if f.kv == nil {
		return
	}
	e, err := f.kv.Get(ctx, ViewKey(r.key.Worker, r.srank))
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			f.log.Warn().Err(err).Str("worker_id", r.key.Worker).Int("dp_rank", r.key.DPRank).Msg("kv view bucket unreadable")
		}
		return
	}
	hashes, err := ParseView(nil, e.Value())
	if err != nil {
		f.log.Warn().Err(err).Str("worker_id", r.key.Worker).Int("dp_rank", r.key.DPRank).Msg("kv view bucket entry rejected")
		return
	}
	if len(hashes) > 0 {
		r.seeded = f.idx.Seed(r.w, hashes)
	}
}

func (r *rank) setCaughtUp(log zerolog.Logger) {
	if r.caughtUp.Swap(true) {
		return
	}
	r.w.SetMode(kvcache.ModePrecise)
	log.Info().Str("worker_id", r.key.Worker).Int("dp_rank", r.key.DPRank).Uint64("batches", r.batches.Load()).
		Int("seeded", r.seeded).Msg("kv events over nats caught up: precise")
}

// handle applies one message: the consumer's only goroutine calls it.
func (r *rank) handle(idx *kvcache.Index, m jetstream.Msg, log zerolog.Logger) {
	worker, rk, err := ParseSubject(m.Subject())
	if err != nil || worker != r.key.Worker || rk != r.srank {
		r.foreign.Add(1)
		return
	}
	md, _ := m.Metadata()
	if err := r.dec.Decode(m.Data(), &r.batch); err != nil {
		r.bad.Add(1)
		if !r.logged {
			r.logged = true
			log.Warn().Err(err).Str("worker_id", r.key.Worker).Int("dp_rank", r.key.DPRank).Msg("kv events message rejected")
		}
	} else {
		idx.Apply(r.w, &r.batch)
		r.batches.Add(1)
	}
	if md != nil {
		r.seq.Store(md.Sequence.Stream)
		if md.NumPending == 0 {
			r.setCaughtUp(log)
		}
	}
}

// Remove stops following k and drops its index state.
func (f *Feed) Remove(k kvcache.Key) {
	f.mu.Lock()
	r, ok := f.ranks[k]
	delete(f.ranks, k)
	f.mu.Unlock()
	if ok {
		r.stop()
		f.idx.Unregister(r.w)
	}
}

func (r *rank) stop() {
	r.cc.Stop()
	<-r.cc.Closed()
}

// Stats returns k's counters.
func (f *Feed) Stats(k kvcache.Key) (FeedStats, bool) {
	f.mu.Lock()
	r, ok := f.ranks[k]
	f.mu.Unlock()
	if !ok {
		return FeedStats{}, false
	}
	return FeedStats{Batches: r.batches.Load(), Bad: r.bad.Load(), Foreign: r.foreign.Load(), Seeded: r.seeded,
		CaughtUp: r.caughtUp.Load(), Mode: r.w.Mode(), Blocks: r.w.Blocks(), StreamSeq: r.seq.Load()}, true
}

// Close stops every consumer and waits for them. Index state is left in
// place. Close is idempotent.
func (f *Feed) Close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	rs := f.ranks
	f.ranks = nil
	f.mu.Unlock()
	for _, r := range rs {
		r.stop()
	}
}
