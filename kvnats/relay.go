package kvnats

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/zmtp"
)

// BucketInterval is the reference's coalescing of view writes: at most one
// per rank every 2 s, plus a final flush on Close.
const BucketInterval = 2 * time.Second

// RelayConfig configures a worker's relay.
type RelayConfig struct {
	WorkerID string
	// Ranks are the engine's ZMQ PUB sockets (tcp://127.0.0.1:PORT; the
	// relay runs beside the engine) and the rank each publishes on: the
	// DP rank of an engine that multiplexes ranks, else 0 (as the
	// reference: a rank of an externally balanced deployment is a worker
	// of its own).
	Ranks []RelayRank
	// BlockSize is the engine's block size (0 = learn it from the events).
	BlockSize int
	// BucketInterval overrides BucketInterval when > 0 (tests).
	BucketInterval time.Duration
}

// RelayRank is one engine publisher a relay follows.
type RelayRank struct {
	Rank     int
	Endpoint string
}

// RelayStats are a relay's counters over all ranks.
type RelayStats struct {
	Received, Published, PublishFailures, BucketWrites uint64 // Published: handed to the client in order
}

// Relay forwards one worker's engine KV events from its ZMQ sockets to
// NATS: each payload verbatim, JetStream-published on
// infera.kv.events.<token>.<rank> (the INFERA_KV_EVENTS stream), and keeps
// each rank's router-style view (the router's own index code, so SGLang
// views are right too) in the infera_kv_view bucket, written at most every
// BucketInterval and once more on Close.
//
// Concurrency: Start runs one goroutine per rank; Close stops and waits
// for them. Stats is safe at any time.
type Relay struct {
	cfg RelayConfig
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	log zerolog.Logger

	idx *kvcache.Index

	cancel context.CancelFunc
	wg     sync.WaitGroup

	received, published, failures, writes atomic.Uint64
	loggedAt                              atomic.Uint64 // published count at the last failure logged
}

// relayMaxPending bounds the relay's unacknowledged publishes: the engine's
// reader does not wait for each acknowledgement, so a slow or briefly
// unreachable server holds batches here (in order) instead of the engine's
// PUB socket dropping them; beyond it a publish fails after a short stall.
const relayMaxPending = 4096

// NewRelay creates the stream and bucket if needed and returns a relay
// that Start starts.
func NewRelay(ctx context.Context, cfg RelayConfig, nc *nats.Conn, log zerolog.Logger) (*Relay, error) {
	if cfg.WorkerID == "" || len(cfg.Ranks) == 0 {
		return nil, fmt.Errorf("kvnats: relay needs a worker id and an endpoint")
	}
	for _, rr := range cfg.Ranks {
		if rr.Rank < 0 || rr.Rank >= maxRank {
			return nil, fmt.Errorf("kvnats: relay rank %d", rr.Rank)
		}
		if _, err := zmtp.DialAddr(rr.Endpoint); err != nil {
			return nil, fmt.Errorf("kvnats: relay endpoint: %w", err)
		}
	}
	if cfg.BucketInterval <= 0 {
		cfg.BucketInterval = BucketInterval
	}
	r := &Relay{cfg: cfg, idx: kvcache.NewIndex(kvcache.IndexConfig{}),
		log: log.With().Str("component", "kv-events-relay").Str("worker_id", cfg.WorkerID).Logger()}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(relayMaxPending),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) { r.publishFailed(m.Subject, err) }))
	if err != nil {
		return nil, fmt.Errorf("kvnats: %w", err)
	}
	if _, err := EnsureStream(ctx, js); err != nil {
		return nil, err
	}
	r.kv, err = EnsureBucket(ctx, js)
	if err != nil {
		return nil, err
	}
	r.js = js
	return r, nil
}

// publishFailed counts a batch the server did not take; the first failure
// of a run of them is logged.
func (r *Relay) publishFailed(subject string, err error) {
	if r.failures.Add(1) == 1 || r.published.Load() > r.loggedAt.Load() {
		r.loggedAt.Store(r.published.Load())
		r.log.Warn().Err(err).Str("subject", subject).Uint64("failures_total", r.failures.Load()).
			Msg("kv events relay: publish failed; routers miss this batch")
	}
}

// Start starts one goroutine per rank.
func (r *Relay) Start() error {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	eps := make([]string, 0, len(r.cfg.Ranks))
	for _, rr := range r.cfg.Ranks {
		rk, ep := rr.Rank, rr.Endpoint
		eps = append(eps, ep)
		w, err := r.idx.Register(kvcache.Key{Worker: r.cfg.WorkerID, DPRank: rk}, r.cfg.BlockSize)
		if err != nil {
			cancel()
			r.wg.Wait()
			return fmt.Errorf("kvnats: relay view: %w", err)
		}
		r.wg.Add(1)
		go r.run(ctx, rk, ep, w)
	}
	r.log.Info().Strs("endpoints", eps).Msg("kv events relay to nats up")
	return nil
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	return RelayStats{Received: r.received.Load(), Published: r.published.Load(),
		PublishFailures: r.failures.Load(), BucketWrites: r.writes.Load()}
}

// Close stops the ranks' goroutines, each writing its view a last time,
// and waits (up to 5 s) for the server to acknowledge what was published.
func (r *Relay) Close() {
	if r.cancel != nil {
		r.cancel()
	}
	r.wg.Wait()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-r.js.PublishAsyncComplete():
	case <-t.C:
		r.log.Warn().Int("pending", r.js.PublishAsyncPending()).Msg("kv events relay: closed with batches unacknowledged")
	}
}

// rankRelay is one rank's state, owned by its goroutine.
type rankRelay struct {
	*Relay
	rank      int
	subject   string
	key       string
	w         *kvcache.Worker
	dec       *kvcache.Decoder
	batch     kvcache.Batch
	dirty     bool
	lastWrite time.Time
	hashes    []uint64
	buf       []byte
}

func (r *Relay) run(ctx context.Context, rk int, ep string, w *kvcache.Worker) {
	defer r.wg.Done()
	rr := &rankRelay{Relay: r, rank: rk, subject: Subject(r.cfg.WorkerID, rk), key: ViewKey(r.cfg.WorkerID, rk),
		w: w, dec: kvcache.NewDecoder()}
	defer rr.flush(true)
	log := r.log.With().Int("dp_rank", rk).Str("endpoint", ep).Logger()
	delay := time.Duration(0)
	for {
		err := rr.session(ctx, ep)
		if ctx.Err() != nil {
			return
		}
		delay = min(max(2*delay, 100*time.Millisecond), 5*time.Second)
		log.Warn().Err(err).Dur("retry_in", delay).Msg("kv events relay: engine stream down")
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// session follows the engine socket until it fails or ctx ends.
func (rr *rankRelay) session(ctx context.Context, ep string) error {
	zc, nc, err := zmtp.Dial(ctx, ep, zmq4.Sub, 5*time.Second, 64<<20)
	if err != nil {
		return err
	}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	if err := zc.SendMsg(zmq4.NewMsg([]byte{1})); err != nil { // subscribe to every topic
		return fmt.Errorf("subscribe: %w", err)
	}
	tick := time.NewTicker(rr.cfg.BucketInterval)
	defer tick.Stop()
	msgs := make(chan zmq4.Msg)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := zc.RecvMsg()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
		}
	}()
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("recv: %w", err)
		case <-tick.C:
			rr.flush(false)
		case m := <-msgs:
			if m.Type != zmq4.UsrMsg || len(m.Frames) == 0 {
				continue
			}
			rr.forward(ctx, m.Frames[len(m.Frames)-1])
		}
	}
}

// forward publishes payload verbatim and applies it to the rank's view.
func (rr *rankRelay) forward(ctx context.Context, payload []byte) {
	rr.received.Add(1)
	// In order, acknowledged asynchronously (failures: publishFailed).
	if _, err := rr.js.PublishAsync(rr.subject, payload); err != nil {
		rr.publishFailed(rr.subject, err)
	} else {
		rr.published.Add(1)
	}
	if err := rr.dec.Decode(payload, &rr.batch); err != nil {
		return
	}
	rr.idx.Apply(rr.w, &rr.batch)
	rr.dirty = true
	if time.Since(rr.lastWrite) >= rr.cfg.BucketInterval {
		rr.flush(false)
	}
}

// flush writes the rank's view when it changed (always when final).
func (rr *rankRelay) flush(final bool) {
	if !rr.dirty && !final {
		return
	}
	rr.hashes = rr.idx.AppendHashes(rr.hashes[:0], rr.w)
	rr.buf = AppendView(rr.buf[:0], rr.hashes)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := rr.kv.Put(ctx, rr.key, rr.buf); err != nil {
		rr.log.Warn().Err(err).Int("dp_rank", rr.rank).Msg("kv events relay: view bucket write failed")
		return
	}
	rr.writes.Add(1)
	rr.dirty, rr.lastWrite = false, time.Now()
}
