package kvcache

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/infera/infera/zmtp"
	"github.com/rs/zerolog"
)

// Source is one KV-event stream: the publisher of one worker (and DP rank).
type Source struct {
	Key Key
	// Endpoint is the engine's ZMQ PUB socket, tcp://host:port.
	Endpoint string
	// ReplayEndpoint is the engine's ZMQ ROUTER replay socket,
	// tcp://host:port; empty when the engine has none.
	ReplayEndpoint string
	// BlockSize is the engine block size from discovery; 0 = learn it from
	// the first stored event.
	BlockSize int
	// Listen: the engine's publisher connects to the Subscriber's listener
	// (Listen) and publishes under WorkerTopic(Key.Worker); Endpoint is
	// empty. Only DP rank 0 is fed this way.
	Listen bool
}

// SubscriberConfig tunes a Subscriber. Start from DefaultSubscriberConfig
// and override fields; NewSubscriber rejects a zero duration or bound.
type SubscriberConfig struct {
	DialTimeout     time.Duration // TCP connect + ZMTP handshake
	BackoffMin      time.Duration // first reconnect delay
	BackoffMax      time.Duration // reconnect delay cap
	ReplayTimeout   time.Duration // one whole replay exchange
	MaxMessageBytes int64         // largest ZMTP frame accepted
	// RebuildBlocks: after a resync (a gap that replay could not fill) or
	// on joining a running engine, the worker is approximate until an
	// AllBlocksCleared arrives or, when this is > 0, until that many blocks
	// have been stored since.
	RebuildBlocks int
	// RebuildAfter: likewise, when > 0, the worker returns to precise mode
	// once this long has passed since the resync or join and a batch has
	// been applied in sequence after it: by then the view has been rebuilt
	// from the events that followed (and from the prompts routed there,
	// learn.go), and what the engine stored before and never touched
	// since is what the index misses.
	RebuildAfter time.Duration
}

// DefaultSubscriberConfig returns the subscriber's defaults.
func DefaultSubscriberConfig() SubscriberConfig {
	return SubscriberConfig{
		DialTimeout:     5 * time.Second,
		BackoffMin:      100 * time.Millisecond,
		BackoffMax:      5 * time.Second,
		ReplayTimeout:   10 * time.Second,
		MaxMessageBytes: 64 << 20,
		RebuildAfter:    5 * time.Second,
	}
}

func (c *SubscriberConfig) validate() error {
	switch {
	case c.DialTimeout <= 0, c.BackoffMin <= 0, c.BackoffMax <= 0, c.ReplayTimeout <= 0:
		return fmt.Errorf("%w: durations must be positive", ErrInvalidConfig)
	case c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("%w: backoff max %s below min %s", ErrInvalidConfig, c.BackoffMax, c.BackoffMin)
	case c.MaxMessageBytes <= 0:
		return fmt.Errorf("%w: max message bytes %d", ErrInvalidConfig, c.MaxMessageBytes)
	case c.RebuildAfter < 0:
		return fmt.Errorf("%w: rebuild after %s", ErrInvalidConfig, c.RebuildAfter)
	case c.RebuildBlocks < 0:
		return fmt.Errorf("%w: rebuild blocks %d", ErrInvalidConfig, c.RebuildBlocks)
	}
	return nil
}

// Stats are one stream's counters since Add.
type Stats struct {
	Connected      bool
	Mode           Mode
	NextSeq        uint64 // next sequence number expected
	Blocks         int    // blocks indexed for the worker now
	Batches        uint64 // batches applied
	Events         uint64 // events in applied batches
	Stored         uint64 // blocks newly indexed
	Removed        uint64 // blocks removed
	Cleared        uint64 // AllBlocksCleared applied
	UnknownParent  uint64 // blocks dropped: parent unknown
	Skipped        uint64 // blocks ignored (non-attention, LoRA, extra keys, medium, block size)
	UnknownEvents  uint64 // events with an unknown type tag
	Duplicates     uint64 // batches at or below the applied sequence, dropped
	Gaps           uint64 // sequence gaps detected after the stream was in sequence
	Joins          uint64 // first batches of a stream that were not the start of the engine's sequence
	Rebuilds       uint64 // returns to precise mode after a resync or join
	Learned        uint64 // blocks learned from routed prompts (parent stored before the router knew it)
	Replays        uint64 // replay exchanges that completed
	ReplayFailures uint64 // replay exchanges that failed
	Resyncs        uint64 // times the worker's state was dropped for missed events
	BadMessages    uint64 // messages or batches that could not be decoded
	RankMismatch   uint64 // batches whose dp_rank differs from the source's
	Connects       uint64 // successful connections
}

// Subscriber runs one goroutine per Source that keeps the Index in step with
// that engine's KV events: subscribe, detect sequence gaps, recover through
// the replay socket or resync (approximate until rebuilt), reconnect with
// backoff.
//
// Concurrency: all methods are safe for concurrent use. Each stream is the
// only writer of its worker's index entry; Close (or Remove) stops and waits
// for the goroutines it started.
type Subscriber struct {
	idx *Index
	cfg SubscriberConfig
	log zerolog.Logger

	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	subs   map[Key]*stream
	lis    *listener // Listen; nil when not listening
	closed bool
}

// NewSubscriber returns a Subscriber feeding idx.
func NewSubscriber(idx *Index, cfg SubscriberConfig, log zerolog.Logger) (*Subscriber, error) {
	if idx == nil {
		return nil, fmt.Errorf("%w: nil index", ErrInvalidConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Subscriber{idx: idx, cfg: cfg, log: log, ctx: ctx, cancel: cancel, subs: make(map[Key]*stream)}, nil
}

func (src *Source) validate() error {
	switch {
	case src.Listen && (src.Endpoint != "" || src.Key.DPRank != 0):
		return fmt.Errorf("%w: listener source %s has an endpoint or a DP rank", ErrInvalidConfig, src.Key.Worker)
	case src.Listen:
	default:
		if _, err := zmtp.DialAddr(src.Endpoint); err != nil {
			return fmt.Errorf("kv events endpoint of %s: %w", src.Key.Worker, err)
		}
	}
	if src.ReplayEndpoint != "" {
		if _, err := zmtp.DialAddr(src.ReplayEndpoint); err != nil {
			return fmt.Errorf("replay endpoint of %s: %w", src.Key.Worker, err)
		}
	}
	if src.BlockSize < 0 || src.BlockSize > maxBlockSize {
		return fmt.Errorf("%w: block size %d of %s", ErrInvalidConfig, src.BlockSize, src.Key.Worker)
	}
	return nil
}

// Add starts following src and returns the worker's index handle. Adding a
// key that is already followed with the same Source is a no-op; with a
// different Source the old stream and its index state are dropped first.
func (s *Subscriber) Add(src Source) (*Worker, error) {
	if err := src.validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if old, ok := s.subs[src.Key]; ok {
		if old.src == src {
			return old.w, nil
		}
		s.stopLocked(old)
	}
	w, err := s.idx.Register(src.Key, src.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("register %s: %w", src.Key.Worker, err)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	st := &stream{
		src:    src,
		w:      w,
		idx:    s.idx,
		cfg:    &s.cfg,
		cancel: cancel,
		done:   make(chan struct{}),
		dec:    NewDecoder(),
		in:     make(chan listenMsg, listenQueue),
		log: s.log.With().Str("worker", src.Key.Worker).Int("dp_rank", src.Key.DPRank).
			Str("endpoint", src.Endpoint).Logger(),
	}
	s.subs[src.Key] = st
	go st.run(ctx)
	return w, nil
}

// Remove stops following k and drops its index state, as when the worker
// leaves the fleet.
func (s *Subscriber) Remove(k Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.subs[k]; ok {
		s.stopLocked(st)
	}
}

func (s *Subscriber) stopLocked(st *stream) {
	st.cancel()
	<-st.done
	delete(s.subs, st.src.Key)
	s.idx.Unregister(st.w)
}

// Sync makes the followed set equal srcs: new keys are added, missing keys
// removed, changed sources restarted. Invalid sources are skipped and
// reported in the joined error; the rest are still applied.
func (s *Subscriber) Sync(srcs []Source) error {
	want := make(map[Key]bool, len(srcs))
	var errs []error
	for _, src := range srcs {
		if want[src.Key] {
			errs = append(errs, fmt.Errorf("%w: duplicate source %s rank %d", ErrInvalidConfig, src.Key.Worker, src.Key.DPRank))
			continue
		}
		want[src.Key] = true
		if _, err := s.Add(src); err != nil {
			errs = append(errs, err)
		}
	}
	s.mu.Lock()
	for k, st := range s.subs {
		if !want[k] {
			s.stopLocked(st)
		}
	}
	s.mu.Unlock()
	return errors.Join(errs...)
}

// Stats returns the counters of k's stream.
func (s *Subscriber) Stats(k Key) (Stats, bool) {
	s.mu.Lock()
	st, ok := s.subs[k]
	s.mu.Unlock()
	if !ok {
		return Stats{}, false
	}
	return st.stats(), true
}

// Keys returns the keys followed now.
func (s *Subscriber) Keys() []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Key, 0, len(s.subs))
	for k := range s.subs {
		out = append(out, k)
	}
	return out
}

// Close stops every stream and waits for their goroutines. Index state is
// left in place. Close is idempotent.
func (s *Subscriber) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	s.cancel()
	if s.lis != nil {
		s.lis.close()
	}
	for _, st := range s.subs {
		<-st.done
	}
}

// stream follows one Source. Everything below the counters is owned by its
// goroutine.
type stream struct {
	src    Source
	w      *Worker
	idx    *Index
	cfg    *SubscriberConfig
	log    zerolog.Logger
	cancel context.CancelFunc
	done   chan struct{}
	in     chan listenMsg // Source.Listen: live messages from the listener

	connected                                             atomic.Bool
	nextSeq                                               atomic.Uint64
	batches, events, stored, removed, cleared             atomic.Uint64
	unknownParent, skipped, unknownEvents, dups, gaps     atomic.Uint64
	replays, replayFailures, resyncs, bad, rankMismatches atomic.Uint64
	connects, joins, rebuilds, learned                    atomic.Uint64

	dec   *Decoder
	batch Batch
	next  uint64 // next sequence number expected

	// mu guards the mode state below: the stream goroutine and the
	// rebuild timer (RebuildAfter) change it.
	mu sync.Mutex
	// complete: the index holds every event since the engine's cache was
	// last known empty (engine start, AllBlocksCleared), or has been
	// rebuilt since a resync or join. synced: the sequence has been
	// confirmed against the engine since Add. Precise needs both.
	complete    bool
	synced      bool
	sinceResync int
	resyncAt    time.Time
	rebuildGen  uint64      // bumped by every resync or join; a stale timer does nothing
	rebuild     *time.Timer // RebuildAfter of the current resync or join

	badLogged bool
	// dropLogged: drop reasons already logged for this worker; each reason
	// is logged once, the counters carry the rest.
	dropLogged DropReasons
}

func (st *stream) stats() Stats {
	return Stats{
		Connected:      st.connected.Load(),
		Mode:           st.w.Mode(),
		NextSeq:        st.nextSeq.Load(),
		Blocks:         st.w.Blocks(),
		Batches:        st.batches.Load(),
		Events:         st.events.Load(),
		Stored:         st.stored.Load(),
		Removed:        st.removed.Load(),
		Cleared:        st.cleared.Load(),
		UnknownParent:  st.unknownParent.Load(),
		Skipped:        st.skipped.Load(),
		UnknownEvents:  st.unknownEvents.Load(),
		Duplicates:     st.dups.Load(),
		Gaps:           st.gaps.Load(),
		Replays:        st.replays.Load(),
		ReplayFailures: st.replayFailures.Load(),
		Resyncs:        st.resyncs.Load(),
		BadMessages:    st.bad.Load(),
		RankMismatch:   st.rankMismatches.Load(),
		Connects:       st.connects.Load(),
		Joins:          st.joins.Load(),
		Rebuilds:       st.rebuilds.Load(),
		Learned:        st.learned.Load(),
	}
}

func (st *stream) run(ctx context.Context) {
	defer close(st.done)
	defer func() {
		st.mu.Lock()
		if st.rebuild != nil {
			st.rebuild.Stop()
		}
		st.rebuildGen++
		st.mu.Unlock()
	}()
	// An engine's sequence starts at 0 with an empty cache.
	st.mu.Lock()
	st.complete = true
	st.mu.Unlock()
	st.w.SetMode(ModeApproximate)
	if st.src.Listen {
		st.listenSession(ctx)
		return
	}
	delay := time.Duration(0)
	for {
		connected, err := st.session(ctx)
		st.connected.Store(false)
		if ctx.Err() != nil {
			return
		}
		if connected {
			delay = 0
		}
		delay = nextBackoff(delay, st.cfg.BackoffMin, st.cfg.BackoffMax)
		st.log.Warn().Err(err).Dur("retry_in", delay).Msg("kv events stream down")
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// nextBackoff doubles the previous delay within [min, max] with ±10% jitter
// so that routers reconnecting to a restarted engine do not arrive together.
func nextBackoff(prev, lo, hi time.Duration) time.Duration {
	d := prev * 2
	if d < lo {
		d = lo
	}
	if d > hi {
		d = hi
	}
	return d - d/10 + time.Duration(rand.Int64N(int64(d)/5+1))
}

// session runs one connection until it fails or ctx ends; connected reports
// whether the handshake succeeded (to reset the backoff).
func (st *stream) session(ctx context.Context) (connected bool, err error) {
	zc, nc, err := zmtp.Dial(ctx, st.src.Endpoint, zmq4.Sub, st.cfg.DialTimeout, uint64(st.cfg.MaxMessageBytes))
	if err != nil {
		return false, err
	}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	// ZMTP 3.0 subscription message: 0x01 + topic prefix; empty = all topics.
	if err := zc.SendMsg(zmq4.NewMsg([]byte{1})); err != nil {
		return true, fmt.Errorf("subscribe: %w", err)
	}
	st.connected.Store(true)
	st.connects.Add(1)
	st.log.Info().Msg("kv events connected")

	// Live batches of this connection were all published after we
	// subscribed, so none can be older than what we had applied by now
	// unless the engine restarted.
	connectNext := st.next
	// With a replay socket, ask for everything since the last applied batch
	// right away: it confirms the sequence (and the mode) even while the
	// engine is idle. Live batches queue on the connection meanwhile.
	if st.src.ReplayEndpoint != "" {
		if err := st.replay(ctx); err != nil {
			st.replayFailed(err)
		}
	}
	fresh := true
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return true, fmt.Errorf("recv: %w", err)
		}
		if msg.Type != zmq4.UsrMsg {
			continue // PING and other commands: zmq4 answers them itself
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			st.badMessage(fmt.Errorf("%w: message has %d frames, want [topic, seq, payload]", ErrBadEvent, len(msg.Frames)))
			continue
		}
		seq := zmtp.Seq(msg.Frames[1])
		if fresh && seq < connectNext {
			st.restarted(seq)
		}
		fresh = false
		st.handle(ctx, seq, msg.Frames[2], true)
	}
}

// restarted clears the worker when a new connection's first batch is below
// what was applied: the engine restarted with an empty cache.
func (st *stream) restarted(seq uint64) {
	st.log.Info().Uint64("seq", seq).Uint64("expected", st.next).Msg("kv events sequence restarted; clearing worker")
	st.idx.Clear(st.w)
	st.next = 0
	st.setNext()
	st.mu.Lock()
	st.complete, st.synced = true, false
	st.rebuildGen++ // a rebuild pending from before is moot
	st.updateModeLocked()
	st.mu.Unlock()
}

// handle processes one batch from the live stream or (allowReplay false) a
// replay.
func (st *stream) handle(ctx context.Context, seq uint64, payload []byte, allowReplay bool) {
	if seq < st.next {
		st.dups.Add(1)
		return
	}
	if seq > st.next && st.next == 0 && !st.isSynced() && (!allowReplay || st.src.ReplayEndpoint == "") {
		// The first batch this stream ever sees is not the start of the
		// engine's sequence: the router joined a running engine whose
		// buffer (if any) no longer reaches back. Not a gap: start from
		// here and rebuild.
		st.join(seq)
	}
	if seq > st.next {
		st.gaps.Add(1)
		st.log.Warn().Uint64("seq", seq).Uint64("expected", st.next).Bool("replay", allowReplay && st.src.ReplayEndpoint != "").
			Msg("kv events sequence gap")
		if allowReplay && st.src.ReplayEndpoint != "" {
			if err := st.replay(ctx); err != nil {
				st.replayFailed(err)
			}
		}
		if seq > st.next {
			st.resync(seq)
		}
		if seq < st.next {
			st.dups.Add(1) // the replay already delivered it
			return
		}
	}
	st.apply(seq, payload)
}

// resync drops the worker's state after missed events: the index cannot know
// what the lost batches stored, so the worker is approximate until rebuilt.
func (st *stream) resync(seq uint64) {
	st.resyncs.Add(1)
	st.idx.Clear(st.w)
	st.next = seq
	st.setNext()
	st.startRebuild()
	st.log.Warn().Uint64("seq", seq).Msg("kv events resync: worker approximate until rebuilt")
}

// join starts a stream that first sees the engine at seq > 0 with nothing
// to replay from: what the engine stored before is unknown, so the worker is
// approximate until rebuilt from the events that follow.
func (st *stream) join(seq uint64) {
	st.joins.Add(1)
	st.next = seq
	st.setNext()
	st.startRebuild()
	st.log.Info().Uint64("seq", seq).Msg("kv events: joined a running engine; worker approximate until rebuilt")
}

func (st *stream) setNext() { st.nextSeq.Store(st.next) }

func (st *stream) isSynced() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.synced
}

// startRebuild makes the worker approximate until rebuilt: by an
// AllBlocksCleared, RebuildBlocks stored blocks, or RebuildAfter (a timer,
// so that an idle engine's worker is declared rebuilt too).
func (st *stream) startRebuild() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.complete, st.sinceResync, st.resyncAt = false, 0, time.Now()
	st.rebuildGen++
	if st.rebuild != nil {
		st.rebuild.Stop()
	}
	if st.cfg.RebuildAfter > 0 {
		gen := st.rebuildGen
		st.rebuild = time.AfterFunc(st.cfg.RebuildAfter, func() {
			st.mu.Lock()
			defer st.mu.Unlock()
			if st.rebuildGen == gen && !st.complete {
				st.rebuiltLocked()
			}
		})
	}
	st.updateModeLocked()
}

// rebuiltLocked returns a resynced or joined worker to complete, says so and
// counts it.
func (st *stream) rebuiltLocked() {
	st.complete = true
	st.rebuilds.Add(1)
	st.log.Info().Int("blocks", st.w.Blocks()).Int("stored_since", st.sinceResync).
		Float64("rebuild_seconds", time.Since(st.resyncAt).Seconds()).Msg("kv events worker rebuilt: precise")
	st.updateModeLocked()
}

func (st *stream) apply(seq uint64, payload []byte) {
	if err := st.dec.Decode(payload, &st.batch); err != nil {
		// A batch we cannot read is as lost as a skipped one.
		st.badMessage(err)
		st.resync(seq + 1)
		return
	}
	res := st.idx.Apply(st.w, &st.batch)
	st.next = seq + 1
	st.setNext()
	st.mu.Lock()
	defer st.mu.Unlock()
	st.synced = true
	st.batches.Add(1)
	st.events.Add(uint64(len(st.batch.Events)))
	st.stored.Add(uint64(res.Stored))
	st.removed.Add(uint64(res.Removed))
	st.cleared.Add(uint64(res.Cleared))
	st.unknownParent.Add(uint64(res.UnknownParent))
	st.skipped.Add(uint64(res.Skipped))
	st.unknownEvents.Add(uint64(st.batch.Unknown))
	st.learned.Add(uint64(res.Learned))
	if d := res.Dropped &^ st.dropLogged; d != 0 {
		st.logDrops(d)
	}
	if st.batch.HasDPRank && st.batch.DPRank != st.src.Key.DPRank {
		st.rankMismatches.Add(1)
	}
	if !st.complete {
		st.sinceResync += res.Stored
		blocks := st.cfg.RebuildBlocks > 0 && st.sinceResync >= st.cfg.RebuildBlocks
		aged := st.cfg.RebuildAfter > 0 && time.Since(st.resyncAt) >= st.cfg.RebuildAfter
		if res.Cleared > 0 || blocks || aged {
			st.rebuildGen++
			st.rebuiltLocked()
		}
	}
	st.updateModeLocked()
}

func (st *stream) updateModeLocked() {
	if st.complete && st.synced {
		st.w.SetMode(ModePrecise)
	} else {
		st.w.SetMode(ModeApproximate)
	}
}

// logDrops logs each reason in d once per stream (worker and rank): a
// publisher that keeps sending blocks the router cannot index shows up in
// the log, and the counters carry the repeats.
func (st *stream) logDrops(d DropReasons) {
	st.dropLogged |= d
	for i := range numDropReasons {
		r := DropReasons(1) << i
		if d&r == 0 {
			continue
		}
		st.log.Warn().Str("reason", r.String()).Uint64("unknown_parent_total", st.unknownParent.Load()).
			Uint64("ignored_total", st.skipped.Load()).
			Msg("kv events: stored blocks not indexed (logged once per worker and reason)")
	}
}

func (st *stream) badMessage(err error) {
	st.bad.Add(1)
	// One log line per stream for the first failure; the counter carries
	// the rest, so a publisher speaking a format we cannot read does not
	// flood the log.
	if !st.badLogged {
		st.badLogged = true
		st.log.Warn().Err(err).Msg("kv events message rejected")
	}
}

func (st *stream) replayFailed(err error) {
	st.replayFailures.Add(1)
	st.log.Warn().Err(err).Str("replay_endpoint", st.src.ReplayEndpoint).Msg("kv events replay failed")
}

// replay asks the replay socket for every batch from st.next and applies the
// answers through handle (without nested replays). A replay that starts
// after st.next, i.e. the engine's buffer no longer reaches back, resyncs at
// its first batch.
func (st *stream) replay(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, st.cfg.ReplayTimeout)
	defer cancel()
	zc, nc, err := zmtp.Dial(rctx, st.src.ReplayEndpoint, zmq4.Dealer, st.cfg.DialTimeout, uint64(st.cfg.MaxMessageBytes))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrReplay, err)
	}
	defer nc.Close()
	stop := context.AfterFunc(rctx, func() { nc.Close() })
	defer stop()
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], st.next)
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return fmt.Errorf("%w: send request: %w", ErrReplay, err)
	}
	from := st.next
	n := 0
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			if rctx.Err() != nil {
				err = rctx.Err()
			}
			return fmt.Errorf("%w: after %d batches from seq %d: %w", ErrReplay, n, from, err)
		}
		if msg.Type != zmq4.UsrMsg {
			continue
		}
		frames := replayFrames(msg.Frames)
		if frames == nil {
			return fmt.Errorf("%w: reply has %d frames, want [\"\", seq, payload]", ErrReplay, len(msg.Frames))
		}
		seq := zmtp.Seq(frames[0])
		if seq == zmtp.ReplayEnd || len(frames[1]) == 0 {
			st.replays.Add(1)
			st.mu.Lock()
			st.synced = true
			st.updateModeLocked()
			st.mu.Unlock()
			st.log.Debug().Uint64("from", from).Int("batches", n).Msg("kv events replay done")
			return nil
		}
		n++
		st.handle(ctx, seq, frames[1], false)
	}
}

// replayFrames returns [seq, payload] of a replay reply: [b"", seq, payload]
// (a DEALER sees the ROUTER's empty delimiter), [seq, payload], or either
// with a topic frame before the sequence, as publishers that reuse their
// live framing send; nil when it is none of those.
func replayFrames(f [][]byte) [][]byte {
	if len(f) >= 3 && len(f[0]) == 0 && len(f[len(f)-2]) == 8 {
		f = f[1:]
	}
	if len(f) == 3 && len(f[1]) == 8 {
		f = f[1:] // topic
	}
	if len(f) != 2 || len(f[0]) != 8 {
		return nil
	}
	return f
}
