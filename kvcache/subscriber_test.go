package kvcache

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/zmtp/zmtptest"
)

// engineSim produces a consistent stream of vLLM-array batches for one
// prompt family, remembering what the engine holds.
type engineSim struct {
	t      *testing.T
	bs     int
	tokens []uint32
}

// storeBatch stores blocks [from, to) of the prompt, chained to block from-1.
func (e *engineSim) storeBatch(from, to int) []byte {
	hashes := make([]uint64, 0, to-from)
	for i := from; i < to; i++ {
		hashes = append(hashes, e.engineHash(i))
	}
	var parent any
	if from > 0 {
		parent = e.engineHash(from - 1)
	}
	return mp(e.t, []any{1.0, []any{arrStored(hashes, parent, e.tokens[from*e.bs:to*e.bs], e.bs, nil, "GPU")}, 0})
}

// engineHash is a stand-in for the engine's own hash of block i: any
// stable value distinct from the router's works.
func (e *engineSim) engineHash(i int) uint64 { return 0xE000_0000 + uint64(i) }

func (e *engineSim) removeBatch(blocks ...int) []byte {
	hashes := make([]uint64, len(blocks))
	for i, b := range blocks {
		hashes[i] = e.engineHash(b)
	}
	return mp(e.t, []any{1.0, []any{arrRemoved(hashes, "GPU")}})
}

func (e *engineSim) routerHashes() []uint64 { return AppendBlockHashes(nil, e.tokens, e.bs) }

func newEngineSim(t *testing.T, blocks int) *engineSim {
	const bs = 4
	return &engineSim{t: t, bs: bs, tokens: seqTokens(blocks*bs, func(i int) uint32 { return uint32(1000 + i) })}
}

func newTestSubscriber(t *testing.T, cfg SubscriberConfig) (*Index, *Subscriber) {
	t.Helper()
	idx := NewIndex(IndexConfig{MaxBlocks: 10000})
	cfg.BackoffMin, cfg.BackoffMax = 10*time.Millisecond, 50*time.Millisecond
	s, err := NewSubscriber(idx, cfg, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return idx, s
}

// subConfig returns DefaultSubscriberConfig changed by set.
func subConfig(set func(*SubscriberConfig)) SubscriberConfig {
	c := DefaultSubscriberConfig()
	set(&c)
	return c
}

func stats(t *testing.T, s *Subscriber, k Key) Stats {
	t.Helper()
	st, ok := s.Stats(k)
	if !ok {
		t.Fatalf("no stream for %v", k)
	}
	return st
}

func TestSubscriberAppliesBatches(t *testing.T) {
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@w")
	idx, s := newTestSubscriber(t, DefaultSubscriberConfig())
	key := Key{Worker: "w1:8000"}
	w, err := s.Add(Source{Key: key, Endpoint: pub.Endpoint(), BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	pub.WaitSubscriber(t)
	if !w.Approximate() {
		t.Fatal("precise before any batch")
	}
	e := newEngineSim(t, 40)
	// 10 batches of 4 chained blocks, then remove the last 2 blocks.
	for i := range 10 {
		pub.Publish(uint64(i), e.storeBatch(4*i, 4*i+4))
	}
	pub.Publish(10, e.removeBatch(38, 39))
	testkit.Eventually(t, "11 batches applied", func() bool { return stats(t, s, key).NextSeq == 11 })
	st := stats(t, s, key)
	if st.Batches != 11 || st.Stored != 40 || st.Removed != 2 || st.Gaps != 0 || st.Mode != ModePrecise ||
		!st.Connected || st.Blocks != 38 {
		t.Fatalf("stats %+v", st)
	}
	if got := idx.Match(w, e.routerHashes()); got != 38 {
		t.Fatalf("match %d, want 38", got)
	}
	// Messages that are not [topic, seq, payload] are counted, not applied.
	pub.PublishFrames([]byte("only-two"), zmtptest.SeqBytes(11))
	pub.Publish(11, e.removeBatch(37))
	testkit.Eventually(t, "batch 11", func() bool { return stats(t, s, key).NextSeq == 12 })
	if st := stats(t, s, key); st.BadMessages != 1 || st.Blocks != 37 || st.Mode != ModePrecise {
		t.Fatalf("stats %+v", st)
	}
	// Remove drops the stream and the worker's index state.
	s.Remove(key)
	if _, ok := idx.Lookup(key); ok {
		t.Fatal("worker still indexed after Remove")
	}
	if idx.Match(w, e.routerHashes()) != 0 {
		t.Fatal("removed worker still matches")
	}
}

func TestSubscriberGapRecoveredByReplay(t *testing.T) {
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@w")
	rep := zmtptest.NewReplay(t)
	idx, s := newTestSubscriber(t, DefaultSubscriberConfig())
	key := Key{Worker: "w2:8000", DPRank: 1}
	w, err := s.Add(Source{Key: key, Endpoint: pub.Endpoint(), ReplayEndpoint: rep.Endpoint(), BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	pub.WaitSubscriber(t)
	// The replay on connect finds an empty buffer: a fresh engine, precise.
	testkit.Eventually(t, "replay on connect", func() bool { return stats(t, s, key).Replays == 1 })
	if w.Approximate() {
		t.Fatal("approximate after an empty replay")
	}
	e := newEngineSim(t, 12)
	b0, b1, b2 := e.storeBatch(0, 4), e.storeBatch(4, 8), e.storeBatch(8, 12)
	rep.Add(0, b0)
	pub.Publish(0, b0)
	testkit.Eventually(t, "batch 0", func() bool { return stats(t, s, key).NextSeq == 1 })
	// Batch 1 is lost on the live stream (e.g. the PUB's high-water mark).
	rep.Add(1, b1)
	rep.Add(2, b2)
	pub.Publish(2, b2)
	testkit.Eventually(t, "gap recovered", func() bool {
		st := stats(t, s, key)
		return st.NextSeq == 3 && st.Replays == 2 && st.Duplicates == 1
	})
	st := stats(t, s, key)
	if st.Gaps != 1 || st.Replays != 2 || st.ReplayFailures != 0 || st.Resyncs != 0 || st.Duplicates != 1 ||
		st.Mode != ModePrecise || st.Blocks != 12 || st.RankMismatch != 3 {
		t.Fatalf("stats %+v", st)
	}
	if got := idx.Match(w, e.routerHashes()); got != 12 {
		t.Fatalf("match %d, want 12", got)
	}
	if got := rep.Starts(); !slices.Equal(got, []uint64{0, 1}) {
		t.Fatalf("replay requests from %v, want [0 1]", got)
	}
}

func TestSubscriberLateJoinReplaysFromZero(t *testing.T) {
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@w")
	rep := zmtptest.NewReplay(t)
	e := newEngineSim(t, 8)
	// The engine published before the router came up.
	rep.Add(0, e.storeBatch(0, 4))
	rep.Add(1, e.storeBatch(4, 8))
	idx, s := newTestSubscriber(t, DefaultSubscriberConfig())
	key := Key{Worker: "late:8000"}
	w, err := s.Add(Source{Key: key, Endpoint: pub.Endpoint(), ReplayEndpoint: rep.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "replay on connect", func() bool { return stats(t, s, key).NextSeq == 2 })
	if st := stats(t, s, key); st.Mode != ModePrecise || st.Blocks != 8 || w.BlockSize() != 4 {
		t.Fatalf("stats %+v block size %d", st, w.BlockSize())
	}
	if idx.Match(w, e.routerHashes()) != 8 {
		t.Fatal("replayed blocks do not match")
	}
}

// TestSubscriberReplayBufferTooShortJoins: a router that comes up after the
// engine's buffer stopped reaching back to 0 joins at the buffer's first
// batch (not a gap, nothing to drop) and is approximate until rebuilt.
func TestSubscriberReplayBufferTooShortJoins(t *testing.T) {
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@w")
	rep := zmtptest.NewReplay(t)
	e := newEngineSim(t, 8)
	// The engine is at seq 5; its buffer only reaches back to 4.
	rep.Add(4, e.storeBatch(0, 4))
	_, s := newTestSubscriber(t, DefaultSubscriberConfig())
	key := Key{Worker: "old:8000"}
	w, err := s.Add(Source{Key: key, Endpoint: pub.Endpoint(), ReplayEndpoint: rep.Endpoint(), BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "join", func() bool { return stats(t, s, key).NextSeq == 5 })
	if st := stats(t, s, key); st.Joins != 1 || st.Resyncs != 0 || st.Gaps != 0 || st.Mode != ModeApproximate || st.Blocks != 4 {
		t.Fatalf("stats %+v", st)
	}
	if !w.Approximate() {
		t.Fatal("not approximate")
	}
}

func TestSubscriberGapWithoutReplayGoesApproximate(t *testing.T) {
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@w")
	idx, s := newTestSubscriber(t, DefaultSubscriberConfig())
	key := Key{Worker: "w3:8000"}
	w, err := s.Add(Source{Key: key, Endpoint: pub.Endpoint(), BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	pub.WaitSubscriber(t)
	e := newEngineSim(t, 12)
	pub.Publish(0, e.storeBatch(0, 4))
	testkit.Eventually(t, "batch 0", func() bool { return stats(t, s, key).NextSeq == 1 })
	if w.Approximate() {
		t.Fatal("approximate after batch 0")
	}
	pub.Publish(2, e.storeBatch(8, 12)) // seq 1 lost; its parent (block 7) is unknown
	testkit.Eventually(t, "batch 2", func() bool { return stats(t, s, key).NextSeq == 3 })
	st := stats(t, s, key)
	if st.Gaps != 1 || st.Resyncs != 1 || st.Mode != ModeApproximate || st.Blocks != 0 || st.UnknownParent != 4 {
		t.Fatalf("stats %+v", st)
	}
	if !w.Approximate() || idx.Match(w, e.routerHashes()) != 0 {
		t.Fatal("state not dropped")
	}
	// The engine's cache is reset: the worker is known again.
	pub.Publish(3, mp(t, []any{2.0, []any{[]any{"AllBlocksCleared"}}}))
	pub.Publish(4, e.storeBatch(0, 4))
	testkit.Eventually(t, "rebuilt", func() bool { return stats(t, s, key).NextSeq == 5 })
	if st := stats(t, s, key); st.Mode != ModePrecise || st.Blocks != 4 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSubscriberRebuildBlocks(t *testing.T) {
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@w")
	_, s := newTestSubscriber(t, subConfig(func(c *SubscriberConfig) { c.RebuildBlocks = 6 }))
	key := Key{Worker: "w:1"}
	w, _ := s.Add(Source{Key: key, Endpoint: pub.Endpoint(), BlockSize: 4})
	pub.WaitSubscriber(t)
	e := newEngineSim(t, 12)
	pub.Publish(3, e.storeBatch(0, 4)) // joined late, no replay: resync
	testkit.Eventually(t, "batch 3", func() bool { return stats(t, s, key).NextSeq == 4 })
	if !w.Approximate() {
		t.Fatal("precise after resync")
	}
	pub.Publish(4, e.storeBatch(4, 8))
	testkit.Eventually(t, "batch 4", func() bool { return stats(t, s, key).NextSeq == 5 })
	if w.Approximate() {
		t.Fatalf("still approximate after %d stored blocks", stats(t, s, key).Stored)
	}
}

func TestSubscriberMalformedBatchResyncs(t *testing.T) {
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@w")
	_, s := newTestSubscriber(t, DefaultSubscriberConfig())
	key := Key{Worker: "w4:8000"}
	w, _ := s.Add(Source{Key: key, Endpoint: pub.Endpoint()})
	pub.WaitSubscriber(t)
	e := newEngineSim(t, 4)
	pub.Publish(0, e.storeBatch(0, 4))
	pub.Publish(1, []byte{0xc1}) // never-used msgpack code
	testkit.Eventually(t, "bad batch", func() bool { return stats(t, s, key).NextSeq == 2 })
	if st := stats(t, s, key); st.BadMessages != 1 || st.Resyncs != 1 || st.Blocks != 0 || !w.Approximate() {
		t.Fatalf("stats %+v", st)
	}
}

func TestSubscriberReconnectsAndDetectsRestart(t *testing.T) {
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@w")
	addr := strings.TrimPrefix(pub.Endpoint(), "tcp://")
	idx, s := newTestSubscriber(t, DefaultSubscriberConfig())
	key := Key{Worker: "w5:8000"}
	w, _ := s.Add(Source{Key: key, Endpoint: pub.Endpoint(), BlockSize: 4})
	pub.WaitSubscriber(t)
	e := newEngineSim(t, 8)
	pub.Publish(0, e.storeBatch(0, 4))
	pub.Publish(1, e.storeBatch(4, 8))
	testkit.Eventually(t, "two batches", func() bool { return stats(t, s, key).NextSeq == 2 })

	// The engine dies and comes back on the same port with an empty cache.
	pub.Close()
	testkit.Eventually(t, "disconnect noticed", func() bool { return !stats(t, s, key).Connected })
	pub2 := zmtptest.NewPublisher(t, addr, "kv@w")
	pub2.WaitSubscriber(t)
	other := &engineSim{t: t, bs: 4, tokens: seqTokens(8, func(i int) uint32 { return uint32(50 + i) })}
	pub2.Publish(0, other.storeBatch(0, 2))
	testkit.Eventually(t, "restart handled", func() bool { st := stats(t, s, key); return st.Connects == 2 && st.NextSeq == 1 })
	if st := stats(t, s, key); st.Blocks != 2 || st.Mode != ModePrecise {
		t.Fatalf("stats %+v", st)
	}
	if idx.Match(w, e.routerHashes()) != 0 || idx.Match(w, other.routerHashes()) != 2 {
		t.Fatal("stale blocks survived the restart")
	}
}

func TestSubscriberDropsOversizedFrames(t *testing.T) {
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@w")
	_, s := newTestSubscriber(t, subConfig(func(c *SubscriberConfig) { c.MaxMessageBytes = 1024 }))
	key := Key{Worker: "w6:8000"}
	if _, err := s.Add(Source{Key: key, Endpoint: pub.Endpoint()}); err != nil {
		t.Fatal(err)
	}
	pub.WaitSubscriber(t)
	pub.Publish(0, make([]byte, 4096))
	// The connection is dropped before the frame is read, then redialled.
	pub.WaitSubscriber(t)
	testkit.Eventually(t, "reconnect", func() bool { return stats(t, s, key).Connects == 2 })
	if st := stats(t, s, key); st.Batches != 0 || st.NextSeq != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSubscriberWithZmq4PubSocket(t *testing.T) {
	// Interop with zmq4's own PUB socket type, which the simulator may use.
	pub := zmq4.NewPub(t.Context())
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	idx, s := newTestSubscriber(t, DefaultSubscriberConfig())
	key := Key{Worker: "zmq4:8000"}
	w, err := s.Add(Source{Key: key, Endpoint: "tcp://" + pub.Addr().String(), BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngineSim(t, 8)
	b0 := e.storeBatch(0, 4)
	// A PUB drops what it sends before the subscription arrives: repeat
	// batch 0 until it lands (repeats are counted as duplicates).
	testkit.Eventually(t, "batch 0", func() bool {
		if err := pub.Send(zmq4.NewMsgFrom([]byte{}, zmtptest.SeqBytes(0), b0)); err != nil {
			t.Fatal(err)
		}
		return stats(t, s, key).NextSeq == 1
	})
	if err := pub.Send(zmq4.NewMsgFrom([]byte{}, zmtptest.SeqBytes(1), e.storeBatch(4, 8))); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "batch 1", func() bool { return stats(t, s, key).NextSeq == 2 })
	if idx.Match(w, e.routerHashes()) != 8 || w.Approximate() {
		t.Fatalf("stats %+v", stats(t, s, key))
	}
	s.Close() // before the PUB goes away, so no reconnect loop is running
}

func TestSubscriberValidation(t *testing.T) {
	idx := NewIndex(IndexConfig{})
	if _, err := NewSubscriber(nil, DefaultSubscriberConfig(), zerolog.Nop()); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil index: %v", err)
	}
	for _, set := range []func(*SubscriberConfig){
		func(c *SubscriberConfig) { c.DialTimeout = -1 },
		func(c *SubscriberConfig) { c.ReplayTimeout = 0 },
		func(c *SubscriberConfig) { c.BackoffMin, c.BackoffMax = time.Second, time.Millisecond },
		func(c *SubscriberConfig) { c.MaxMessageBytes = 0 },
		func(c *SubscriberConfig) { c.RebuildBlocks = -1 },
		func(c *SubscriberConfig) { *c = SubscriberConfig{} },
	} {
		if cfg := subConfig(set); !errors.Is(cfg.validate(), ErrInvalidConfig) {
			t.Fatalf("%+v: want ErrInvalidConfig", cfg)
		}
		if _, err := NewSubscriber(idx, subConfig(set), zerolog.Nop()); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("%v", err)
		}
	}
	s, err := NewSubscriber(idx, DefaultSubscriberConfig(), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range []string{"", "tcp://*:5557", "ipc:///tmp/x", "tcp://host", "tcp://host:0", "tcp://host:70000", "tcp://:5557"} {
		if _, err := s.Add(Source{Key: Key{Worker: "w"}, Endpoint: ep}); !errors.Is(err, ErrBadEndpoint) {
			t.Fatalf("endpoint %q: %v", ep, err)
		}
	}
	if _, err := s.Add(Source{Key: Key{Worker: "w"}, Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://*:1"}); !errors.Is(err, ErrBadEndpoint) {
		t.Fatalf("replay endpoint: %v", err)
	}
	if _, err := s.Add(Source{Key: Key{Worker: "w"}, Endpoint: "tcp://127.0.0.1:1", BlockSize: -4}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("block size: %v", err)
	}
	// Sync: duplicates and bad sources are reported, good ones followed;
	// a later Sync removes what is gone.
	good := Source{Key: Key{Worker: "a"}, Endpoint: "tcp://127.0.0.1:1"}
	err = s.Sync([]Source{good, good, {Key: Key{Worker: "b"}, Endpoint: "tcp://*:1"}})
	if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, ErrBadEndpoint) {
		t.Fatalf("sync: %v", err)
	}
	if keys := s.Keys(); len(keys) != 1 || keys[0] != good.Key {
		t.Fatalf("keys %v", keys)
	}
	w1, _ := s.Add(good)
	if w2, _ := s.Add(good); w1 != w2 {
		t.Fatal("re-adding the same source restarted it")
	}
	if err := s.Sync(nil); err != nil || len(s.Keys()) != 0 {
		t.Fatalf("sync to empty: %v %v", err, s.Keys())
	}
	s.Close()
	s.Close()
	if _, err := s.Add(good); !errors.Is(err, ErrClosed) {
		t.Fatalf("add after close: %v", err)
	}
}

func TestRankEndpoint(t *testing.T) {
	got, err := RankEndpoint("tcp://10.0.0.5:5557", 3)
	if err != nil || got != "tcp://10.0.0.5:5560" {
		t.Fatalf("%q %v", got, err)
	}
	got, err = RankEndpoint("tcp://[::1]:5557", 0)
	if err != nil || got != "tcp://[::1]:5557" {
		t.Fatalf("%q %v", got, err)
	}
	for _, tc := range []struct {
		ep   string
		rank int
	}{{"tcp://h:65535", 1}, {"tcp://h:1", -1}, {"tcp://*:1", 0}} {
		if _, err := RankEndpoint(tc.ep, tc.rank); !errors.Is(err, ErrBadEndpoint) {
			t.Fatalf("%v: %v", tc, err)
		}
	}
}
