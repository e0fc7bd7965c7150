package kvnats_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/infera/infera/internal/natstest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/kvnats"
	"github.com/infera/infera/zmtp/zmtptest"
)

const bs = 4

// engine is a stand-in engine's prompt: blocks of distinct tokens.
type engine struct {
	t      *testing.T
	tokens []uint32
}

func newEngine(t *testing.T, blocks int, base uint32) *engine {
	e := &engine{t: t}
	for i := range blocks * bs {
		e.tokens = append(e.tokens, base+uint32(i))
	}
	return e
}

func (e *engine) engineHash(i int) uint64 { return 0xE000_0000 + uint64(e.tokens[0])<<8 + uint64(i) }

// stored is a vLLM array batch storing blocks [from, to).
func (e *engine) stored(from, to int) []byte {
	var hashes []uint64
	for i := from; i < to; i++ {
		hashes = append(hashes, e.engineHash(i))
	}
	var parent any
	if from > 0 {
		parent = e.engineHash(from - 1)
	}
	b, err := msgpack.Marshal([]any{1.0, []any{[]any{"BlockStored", hashes, parent, e.tokens[from*bs : to*bs], bs, nil, "GPU"}}, 0})
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *engine) routerHashes() []uint64 { return kvcache.AppendBlockHashes(nil, e.tokens, bs) }

func connect(t *testing.T, s *natstest.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func newFeed(t *testing.T, js jetstream.JetStream) (*kvcache.Index, *kvnats.Feed) {
	t.Helper()
	idx := kvcache.NewIndex(kvcache.IndexConfig{MaxBlocks: 10000})
	f, err := kvnats.NewFeed(t.Context(), idx, js, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return idx, f
}

// TestRelayToFeed: an engine's ZMQ events reach a router's index through
// the relay and NATS, verbatim; the view bucket holds the rank's router
// hashes; a router started later replays the history and converges; one
// that finds the stream purged is seeded from the bucket.
func TestRelayToFeed(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := connect(t, srv)
	const worker = "127.0.0.1:18080"
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv-events")
	relay, err := kvnats.NewRelay(t.Context(), kvnats.RelayConfig{WorkerID: worker, Ranks: []kvnats.RelayRank{{Rank: 0, Endpoint: pub.Endpoint()}},
		BlockSize: bs, BucketInterval: 50 * time.Millisecond}, nc, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	pub.WaitSubscriber(t)

	key := kvcache.Key{Worker: worker}
	idx, feed := newFeed(t, js)
	w, err := feed.Add(key, 0, bs)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "empty rank precise", func() bool { return !w.Approximate() })

	e := newEngine(t, 8, 1000)
	p1, p2 := e.stored(0, 4), e.stored(4, 8)
	pub.Publish(0, p1)
	pub.Publish(1, p2)
	rh := e.routerHashes()
	testkit.Eventually(t, "8 blocks indexed", func() bool { return idx.Match(w, rh) == 8 })

	// Verbatim: the stream holds the engine's payloads byte for byte.
	st, err := js.Stream(t.Context(), kvnats.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range [][]byte{p1, p2} {
		m, err := st.GetMsg(t.Context(), uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != "infera.kv.events.MTI3LjAuMC4xOjE4MDgw.0" || !slices.Equal(m.Data, want) {
			t.Fatalf("stream message %d: %s %x", i+1, m.Subject, m.Data)
		}
	}
	// The bucket holds the sorted router hashes.
	kv, err := js.KeyValue(t.Context(), kvnats.ViewBucket)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(slices.Values(rh))
	testkit.Eventually(t, "view bucket", func() bool {
		en, err := kv.Get(t.Context(), kvnats.ViewKey(worker, 0))
		if err != nil {
			return false
		}
		got, err := kvnats.ParseView(nil, en.Value())
		return err == nil && slices.Equal(got, want)
	})

	// A router that starts now replays the history.
	idx2, feed2 := newFeed(t, js)
	w2, err := feed2.Add(key, 0, bs)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "restarted router converged", func() bool { return idx2.Match(w2, rh) == 8 && !w2.Approximate() })
	if s, _ := feed2.Stats(key); s.Batches != 2 || s.Bad != 0 || s.Foreign != 0 {
		t.Fatalf("restarted feed stats %+v", s)
	}

	// A router that finds the stream's history gone is seeded from the bucket.
	relay.Close()
	if err := st.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	idx3, feed3 := newFeed(t, js)
	w3, err := feed3.Add(key, 0, bs)
	if err != nil {
		t.Fatal(err)
	}
	if idx3.Match(w3, rh) != 8 {
		t.Fatalf("seeded router matches %d blocks", idx3.Match(w3, rh))
	}
	if s, _ := feed3.Stats(key); s.Seeded != 8 || !s.CaughtUp {
		t.Fatalf("seeded feed stats %+v", s)
	}
	feed3.Remove(key)
	if idx3.Match(w3, rh) != 0 {
		t.Fatal("removed rank still matches")
	}
}

// TestFeedOutage: while the server is stopped (SIGSTOP) nothing arrives;
// once it continues, the consumer resumes and the index catches up
// without a restart.
func TestFeedOutage(t *testing.T) {
	srv := natstest.Start(t)
	_, js := connect(t, srv)
	const worker = "w-outage:1"
	key := kvcache.Key{Worker: worker}
	idx, feed := newFeed(t, js)
	w, err := feed.Add(key, 0, bs)
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, 6, 5000)
	rh := e.routerHashes()
	pubJS := func(b []byte) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		for {
			if _, err := js.Publish(ctx, kvnats.Subject(worker, 0), b); err == nil {
				return
			} else if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	pubJS(e.stored(0, 3))
	testkit.Eventually(t, "3 blocks", func() bool { return idx.Match(w, rh) == 3 })
	srv.Pause()
	time.Sleep(300 * time.Millisecond)
	srv.Resume()
	pubJS(e.stored(3, 6))
	testkit.Eventually(t, "6 blocks after the outage", func() bool { return idx.Match(w, rh) == 6 })
}

// TestRelayOutage: batches the engine publishes while the NATS server is
// stopped (SIGSTOP) are held by the relay, in order, and reach the router
// once the server continues; nothing restarts.
func TestRelayOutage(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := connect(t, srv)
	const worker = "127.0.0.1:18081"
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv-events")
	relay, err := kvnats.NewRelay(t.Context(), kvnats.RelayConfig{WorkerID: worker, Ranks: []kvnats.RelayRank{{Rank: 0, Endpoint: pub.Endpoint()}},
		BlockSize: bs}, nc, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	pub.WaitSubscriber(t)
	idx, feed := newFeed(t, js)
	w, err := feed.Add(kvcache.Key{Worker: worker}, 0, bs)
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, 9, 7000)
	rh := e.routerHashes()
	pub.Publish(0, e.stored(0, 3))
	testkit.Eventually(t, "3 blocks", func() bool { return idx.Match(w, rh) == 3 })
	srv.Pause()
	pub.Publish(1, e.stored(3, 6))
	pub.Publish(2, e.stored(6, 9))
	testkit.Eventually(t, "the relay took both batches", func() bool { return relay.Stats().Received == 3 })
	time.Sleep(300 * time.Millisecond)
	srv.Resume()
	testkit.Eventually(t, "9 blocks after the outage", func() bool { return idx.Match(w, rh) == 9 })
	if s := relay.Stats(); s.PublishFailures != 0 {
		t.Fatalf("relay stats %+v", s)
	}
}
