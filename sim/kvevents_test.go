package sim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/zmtp/zmtptest"
)

var kvFormats = []string{config.KVFormatVLLM, config.KVFormatVLLMArray, config.KVFormatSGLang}

// eventRig is a sim publishing KV events and a router-side kvcache index
// fed by a real kvcache.Subscriber over TCP.
type eventRig struct {
	ts  *testSim
	idx *kvcache.Index
	sub *kvcache.Subscriber
	key kvcache.Key
	w   *kvcache.Worker
	bs  int
	// requests counts completions sent, to know when the sim has
	// published the batch of the last one.
	requests uint64
}

func startEventRig(t *testing.T, format string, edit func(*config.Sim), opts ...Option) *eventRig {
	t.Helper()
	const bs = 4
	ts := startSim(t, func(c *config.Sim) {
		c.BlockSize = bs
		c.MaxModelLen = 1024
		c.KVBlocks = 1024
		c.KVEventsEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsReplayEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsFormat = format
		if edit != nil {
			edit(c)
		}
	}, opts...)
	if !strings.HasPrefix(ts.srv.KVEventsEndpoint(), "tcp://127.0.0.1:") {
		t.Fatalf("endpoint %q", ts.srv.KVEventsEndpoint())
	}
	idx := kvcache.NewIndex(kvcache.IndexConfig{MaxBlocks: 100000})
	subCfg := kvcache.DefaultSubscriberConfig()
	subCfg.BackoffMin, subCfg.BackoffMax = 10*time.Millisecond, 50*time.Millisecond
	sub, err := kvcache.NewSubscriber(idx, subCfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	if err != nil {
		t.Fatal(err)
	}
	// Registered after startSim, so the subscriber stops before the sim.
	t.Cleanup(sub.Close)
	key := kvcache.Key{Worker: "sim-0", DPRank: ts.srv.cfg.DPRank}
	w, err := sub.Add(kvcache.Source{
		Key: key, Endpoint: ts.srv.KVEventsEndpoint(),
		ReplayEndpoint: ts.srv.KVEventsReplayEndpoint(), BlockSize: ts.srv.cfg.BlockSize,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &eventRig{ts: ts, idx: idx, sub: sub, key: key, w: w, bs: ts.srv.cfg.BlockSize}
	testkit.Eventually(t, "subscriber connected and confirmed", func() bool {
		st := r.stats(t)
		return st.Connected && st.Replays >= 1 && ts.srv.sockets.Load().subscribers() == 1
	})
	return r
}

func (r *eventRig) stats(t *testing.T) kvcache.Stats {
	t.Helper()
	st, ok := r.sub.Stats(r.key)
	if !ok {
		t.Fatal("no subscriber stats")
	}
	return st
}

func (r *eventRig) ringHead() uint64 {
	ring := r.ts.srv.events.ring
	ring.mu.Lock()
	defer ring.mu.Unlock()
	return ring.head
}

// complete sends a unary completion with a token-id prompt.
func (r *eventRig) complete(t *testing.T, prompt []uint32, maxTokens int) map[string]any {
	t.Helper()
	r.requests++
	return r.ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": maxTokens}, prompt))
}

func (r *eventRig) chat(t *testing.T, user string, maxTokens int) map[string]any {
	t.Helper()
	r.requests++
	return r.ts.postJSON(t, "/v1/chat/completions", chatBody(t, map[string]any{"max_tokens": maxTokens}, user))
}

// waitSynced waits until the sim has published the batch of every request
// sent (the success counter is stored after the batch is flushed), the
// subscriber has applied everything published, and then checks that the
// index holds exactly as many blocks as the sim caches.
func (r *eventRig) waitSynced(t *testing.T) kvcache.Stats {
	t.Helper()
	p := &r.ts.srv.sched.pub
	var st kvcache.Stats
	deadline := time.Now().Add(10 * time.Second)
	for {
		st = r.stats(t)
		if p.success.Load() == r.requests && st.NextSeq == r.ringHead() && st.Blocks == int(p.cached.Load()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("index not in step with the sim cache: %d/%d requests done, ring head %d, sim caches %d blocks; subscriber %+v",
				p.success.Load(), r.requests, r.ringHead(), p.cached.Load(), st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st.Mode != kvcache.ModePrecise {
		t.Errorf("mode %v, want precise", st.Mode)
	}
	if st.UnknownParent != 0 || st.Skipped != 0 || st.BadMessages != 0 || st.Resyncs != 0 || st.RankMismatch != 0 {
		t.Errorf("stats %+v", st)
	}
	return st
}

// waitPublished waits until the sim has flushed the batch of every request
// sent: the success counter is stored after the round's batch is pushed,
// while the response may reach the client before.
func (r *eventRig) waitPublished(t *testing.T) {
	t.Helper()
	p := &r.ts.srv.sched.pub
	testkit.Eventually(t, "sim published every request's batch", func() bool { return p.success.Load() == r.requests })
}

func promptTokens(seed, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32((seed*131 + i*7 + i*i) % vocabSize)
	}
	return out
}

func TestKVEventsIndexMatchesCache(t *testing.T) {
	for _, format := range kvFormats {
		t.Run(format, func(t *testing.T) {
			r := startEventRig(t, format, nil)
			shared := promptTokens(1, 40)
			for i := range 3 {
				p := append(append([]uint32(nil), shared...), promptTokens(10+i, 9)...)
				r.complete(t, p, 6)
			}
			r.chat(t, "hello there, simulator", 5)
			r.chat(t, "hello there, simulator", 5) // all hits: nothing new stored
			st := r.waitSynced(t)
			if st.Blocks == 0 || st.Stored == 0 || st.Batches == 0 {
				t.Fatalf("nothing indexed: %+v", st)
			}
			// The router's own hashes of a cached prompt match in full.
			p := append(append([]uint32(nil), shared...), promptTokens(11, 9)...)
			hashes := kvcache.AppendBlockHashes(nil, p, r.bs)
			if got := r.idx.Match(r.w, hashes); got != len(hashes) {
				t.Errorf("match %d of %d prompt blocks", got, len(hashes))
			}
			// A second hit on the same prompt reports its cached tokens.
			m := r.complete(t, p, 6)
			cached := m["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64)
			if int(cached) != len(hashes)*r.bs {
				t.Errorf("cached_tokens %v, want %d", cached, len(hashes)*r.bs)
			}

			code, _ := r.ts.post(t, "/reset_prefix_cache", "")
			if code != 200 {
				t.Fatalf("reset: %d", code)
			}
			testkit.Eventually(t, "reset published", func() bool { return r.ts.srv.sched.pub.cached.Load() == 0 })
			st = r.waitSynced(t)
			if st.Blocks != 0 || st.Cleared != 1 {
				t.Errorf("after reset: %+v", st)
			}
			// Caching resumes after the reset.
			r.complete(t, p, 6)
			if st = r.waitSynced(t); st.Blocks == 0 {
				t.Errorf("nothing cached after reset: %+v", st)
			}
		})
	}
}

func TestKVEventsEviction(t *testing.T) {
	for _, format := range kvFormats {
		t.Run(format, func(t *testing.T) {
			r := startEventRig(t, format, func(c *config.Sim) {
				c.MaxModelLen = 128
				c.KVBlocks = 40 // 160 tokens: two 80-token requests do not fit
			})
			for i := range 3 {
				r.complete(t, promptTokens(i, 60), 8)
			}
			before := r.waitSynced(t)
			if before.Removed == 0 {
				t.Fatalf("no eviction: %+v", before)
			}
			if before.Blocks > 40 {
				t.Fatalf("index holds %d blocks of a 40-block cache", before.Blocks)
			}
			// A shorter prompt evicts more of the last long one than it
			// stores, and the index follows block by block.
			r.complete(t, promptTokens(99, 6), 1)
			after := r.waitSynced(t)
			if after.Removed <= before.Removed {
				t.Errorf("removed %d then %d", before.Removed, after.Removed)
			}
		})
	}
}

func TestKVEventsDroppedBatchIsReplayed(t *testing.T) {
	for _, format := range kvFormats {
		t.Run(format, func(t *testing.T) {
			r := startEventRig(t, format, nil)
			r.complete(t, promptTokens(1, 30), 4)
			st0 := r.waitSynced(t)
			r.ts.srv.events.dropNext.Store(true)
			r.complete(t, promptTokens(2, 30), 4) // buffered, never published
			// The response can come back before the scheduler's round
			// ends and flushes its batch; a request sent meanwhile joins
			// that batch and is dropped with it, leaving nothing behind
			// the gap to reveal it. Wait for the dropped batch first.
			r.waitPublished(t)
			r.complete(t, promptTokens(3, 30), 4) // reveals the gap
			st := r.waitSynced(t)
			// The replayed batch is applied before the replay's end marker
			// comes in and counts the replay: the index can be in step
			// while the count is not yet.
			testkit.Eventually(t, "the replay counted", func() bool {
				st = r.stats(t)
				return st.Replays >= st0.Replays+1
			})
			if st.Gaps != st0.Gaps+1 || st.Replays < st0.Replays+1 || st.ReplayFailures != 0 {
				t.Errorf("before %+v\nafter %+v", st0, st)
			}
			hashes := kvcache.AppendBlockHashes(nil, promptTokens(2, 30), r.bs)
			if got := r.idx.Match(r.w, hashes); got != len(hashes) {
				t.Errorf("dropped batch's blocks: match %d of %d", got, len(hashes))
			}
		})
	}
}

// chainChecker is a cacheObserver that fails on a stored block whose parent
// is not cached at that moment: a router drops such a block, so the sim
// must never publish one.
type chainChecker struct {
	t      *testing.T
	cached map[uint64]bool
	stores map[uint64]int
}

func (c *chainChecker) blockStored(h, parent uint64, _ []uint32) {
	if parent != rootHash && !c.cached[parent] {
		c.t.Errorf("block %x stored without its parent %x", h, parent)
	}
	c.cached[h] = true
	c.stores[h]++
}
func (c *chainChecker) blockRemoved(h uint64) { delete(c.cached, h) }
func (c *chainChecker) allCleared()           { clear(c.cached) }

// TestSchedulerAdoptsOrphanedChain: A and B prefill the same prompt in one
// step, so B's copies stay anonymous; A finishes and its registered copies
// are evicted while B still decodes. When B fills its next block, its own
// copies of the prefix are registered first.
func TestSchedulerAdoptsOrphanedChain(t *testing.T) {
	chk := &chainChecker{t: t, cached: map[uint64]bool{}, stores: map[uint64]int{}}
	sc := newScheduler(newPrefixCache(12, 4, chk), 8, 64, timing{}, false, nil)
	a, b := testSeq("abcdefgh", 1, 4), testSeq("abcdefgh", 9, 4)
	head := a.hashes[0]
	step := func(qs ...*seq) {
		for _, q := range qs {
			sc.handle(msg{q: q})
		}
		sc.admit()
		sc.plan()
		sc.apply()
	}
	step(a, b)                                          // A registers the prompt blocks and finishes
	step(testSeq("0123456789ABCDEFGHIJKLMNOPQR", 1, 4)) // takes the unused blocks
	step(testSeq("zyxwvutsrqpo", 1, 4))                 // evicts A's blocks
	if chk.cached[head] {
		t.Fatal("scenario did not evict A's blocks")
	}
	drainAll(sc)
	if chk.stores[head] != 2 {
		t.Errorf("B's copy of the first block stored %d times, want 2", chk.stores[head])
	}
	if len(chk.cached) != len(sc.cache.index) {
		t.Errorf("observer sees %d blocks, cache holds %d", len(chk.cached), len(sc.cache.index))
	}
}

// decodeAny decodes a payload generically, keeping msgpack's integer kinds.
func decodeAny(t *testing.T, payload []byte) []any {
	t.Helper()
	var v any
	if err := msgpack.Unmarshal(payload, &v); err != nil {
		t.Fatal(err)
	}
	b, ok := v.([]any)
	if !ok {
		t.Fatalf("batch is %T", v)
	}
	return b
}

// batchTypes lists each batch's event types, for a failure's log.
func batchTypes(payloads [][]byte) string {
	dec := kvcache.NewDecoder()
	var b kvcache.Batch
	var out []string
	for _, p := range payloads {
		if err := dec.Decode(p, &b); err != nil {
			out = append(out, err.Error())
			continue
		}
		types := make([]string, len(b.Events))
		for i, ev := range b.Events {
			types[i] = ev.Type.String()
		}
		out = append(out, "["+strings.Join(types, " ")+"]")
	}
	return strings.Join(out, " ")
}

// batchHas reports whether a batch decodes and holds an event of type typ.
func batchHas(payload []byte, typ kvcache.EventType) bool {
	var b kvcache.Batch
	if kvcache.NewDecoder().Decode(payload, &b) != nil {
		return false
	}
	for _, ev := range b.Events {
		if ev.Type == typ {
			return true
		}
	}
	return false
}

// TestKVEventsWireFormat pins the per-format encoding of each event type.
func TestKVEventsWireFormat(t *testing.T) {
	for _, format := range kvFormats {
		t.Run(format, func(t *testing.T) {
			ts := startSim(t, func(c *config.Sim) {
				c.BlockSize = 4
				c.MaxModelLen = 64
				c.KVBlocks = 16
				c.KVEventsEndpoint = "tcp://127.0.0.1:0"
				c.KVEventsFormat = format
			})
			ring := ts.srv.events.ring
			ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 4}, promptTokens(1, 12)))
			ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 20}, promptTokens(2, 40)))
			ts.post(t, "/reset_prefix_cache", "")
			// Wait for the reset's own event, not for a number of batches:
			// a request's response can reach the client before the
			// scheduler publishes its round, so the second completion may
			// join the first one's round and batch (two batches in all).
			var payloads [][]byte
			var cached int64
			defer func() {
				if t.Failed() {
					t.Logf("sim caches %d blocks; ring holds %d batches: %s", cached, len(payloads), batchTypes(payloads))
				}
			}()
			testkit.Eventually(t, "the reset's batch", func() bool {
				ring.mu.Lock()
				payloads = payloads[:0]
				for s := uint64(0); s < ring.head; s++ {
					payloads = append(payloads, bytes.Clone(ring.slotLocked(s).payload))
				}
				ring.mu.Unlock()
				cached = ts.srv.sched.pub.cached.Load()
				return cached == 0 && len(payloads) > 0 && batchHas(payloads[len(payloads)-1], kvcache.EventAllBlocksCleared)
			})
			dec := kvcache.NewDecoder()
			var b kvcache.Batch
			seen := map[string]bool{}
			for _, p := range payloads {
				if err := dec.Decode(p, &b); err != nil {
					t.Fatal(err)
				}
				if !b.HasDPRank || b.DPRank != 0 || b.TS < 1e9 {
					t.Errorf("batch header %+v", b)
				}
				batch := decodeAny(t, p)
				if len(batch) != 3 {
					t.Fatalf("batch has %d fields", len(batch))
				}
				for i, raw := range batch[1].([]any) {
					ev := b.Events[i]
					checkWireEvent(t, format, raw, ev)
					seen[ev.Type.String()] = true
					// Engine hashes are not the router's: the router must
					// map them through the token ids.
					if ev.Type == kvcache.EventBlockStored && !ev.HasParent &&
						ev.Hashes[0] == kvcache.AppendBlockHashes(nil, ev.Tokens[:ev.BlockSize], ev.BlockSize)[0] {
						t.Error("engine hash equals the router hash")
					}
				}
			}
			for _, typ := range []string{"BlockStored", "BlockRemoved", "AllBlocksCleared"} {
				if !seen[typ] {
					t.Errorf("no %s event", typ)
				}
			}
		})
	}
}

func checkWireEvent(t *testing.T, format string, raw any, ev kvcache.Event) {
	t.Helper()
	var hashes []any
	switch format {
	case config.KVFormatVLLM:
		m, ok := raw.(map[string]any)
		if !ok {
			t.Fatalf("event is %T", raw)
		}
		if m["type"] != ev.Type.String() {
			t.Errorf("type %v", m["type"])
		}
		want := map[kvcache.EventType]int{kvcache.EventBlockStored: 9, kvcache.EventBlockRemoved: 3, kvcache.EventAllBlocksCleared: 1}[ev.Type]
		if len(m) != want {
			t.Errorf("%s has %d fields: %v", ev.Type, len(m), m)
		}
		if ev.Type != kvcache.EventAllBlocksCleared && m["medium"] != "GPU" {
			t.Errorf("medium %v", m["medium"])
		}
		if ev.Type == kvcache.EventBlockStored && m["block_size"] != int8(4) && m["block_size"] != uint8(4) {
			t.Errorf("block_size %T %v", m["block_size"], m["block_size"])
		}
		hashes, _ = m["block_hashes"].([]any)
	default:
		a, ok := raw.([]any)
		if !ok {
			t.Fatalf("event is %T", raw)
		}
		if a[0] != ev.Type.String() {
			t.Errorf("tag %v", a[0])
		}
		want := map[kvcache.EventType]int{kvcache.EventBlockStored: 7, kvcache.EventBlockRemoved: 3, kvcache.EventAllBlocksCleared: 1}[ev.Type]
		if format == config.KVFormatSGLang && ev.Type != kvcache.EventAllBlocksCleared {
			want--
		}
		if len(a) != want {
			t.Errorf("%s has %d fields: %v", ev.Type, len(a), a)
		}
		if len(a) > 1 {
			hashes, _ = a[1].([]any)
		}
	}
	if ev.Type == kvcache.EventAllBlocksCleared {
		return
	}
	if len(hashes) != len(ev.Hashes) || len(hashes) == 0 {
		t.Fatalf("%d hashes, decoder saw %d", len(hashes), len(ev.Hashes))
	}
	if format == config.KVFormatSGLang && len(hashes) != 1 {
		t.Errorf("sglang event with %d blocks", len(hashes))
	}
	for i, h := range hashes {
		// msgpack (and msgspec) write a non-negative int in the uint
		// formats, so SGLang's int64 hashes show as uint64 below 2^63 and
		// int64 when negative; vLLM's uint64 hashes are always unsigned.
		switch v := h.(type) {
		case uint64:
			if v != ev.Hashes[i] || format == config.KVFormatSGLang && v > math.MaxInt64 {
				t.Errorf("hash %T %v (decoder %x)", h, h, ev.Hashes[i])
			}
		case int64:
			if format != config.KVFormatSGLang || v >= 0 || uint64(v) != ev.Hashes[i] {
				t.Errorf("hash %T %v (decoder %x)", h, h, ev.Hashes[i])
			}
		default:
			// Small values take the compact encodings; a 64-bit hash
			// essentially never does.
			t.Errorf("hash of type %T", h)
		}
	}
}

// TestKVEventsRawSubscriber talks ZMTP by hand: a SUB with a topic prefix
// receives [topic, seq, payload] frames, and a PING is answered.
func TestKVEventsRawSubscriber(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) {
		c.KVEventsEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsTopic = "kv@sim"
	})
	addr := strings.TrimPrefix(ts.srv.KVEventsEndpoint(), "tcp://")
	// A peer announcing a huge handshake frame is dropped, not served.
	bad, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xFF, 0x7F, 3
	copy(greeting[12:], "NULL")
	hostile := append(greeting, 0x06, 0, 0, 1, 0, 0, 0, 0, 0) // command frame of 2^40 bytes
	if _, err := bad.Write(hostile); err != nil {
		t.Fatal(err)
	}
	if err := bad.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, bad); err != nil {
		t.Fatalf("hostile peer not disconnected: %v", err)
	}
	bad.Close()

	zc := zmtptest.Dial(t, ts.srv.KVEventsEndpoint(), zmq4.Sub)
	if err := zc.SendMsg(zmq4.NewMsg(append([]byte{1}, "kv@"...))); err != nil {
		t.Fatal(err)
	}
	if err := zc.SendCmd(zmq4.CmdPing, []byte{0, 10, 'x'}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "subscribed", func() bool { return ts.srv.sockets.Load().subscribers() == 1 })
	ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 2}, "a prompt long enough for two blocks of sixteen"))
	gotPong, gotBatch := false, false
	for !gotPong || !gotBatch {
		msg, err := zc.RecvMsg()
		if err != nil {
			t.Fatal(err)
		}
		if msg.Type == zmq4.CmdMsg {
			gotPong = true
			continue
		}
		if len(msg.Frames) != 3 || string(msg.Frames[0]) != "kv@sim" || binary.BigEndian.Uint64(msg.Frames[1]) != 0 {
			t.Fatalf("message %q", msg.Frames)
		}
		gotBatch = true
	}
}

func TestKVEventsConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*config.Sim)
		want string
	}{
		{"bad scheme", func(c *config.Sim) { c.KVEventsEndpoint = "ipc:///tmp/x" }, "--kv-events-endpoint"},
		{"bad port", func(c *config.Sim) { c.KVEventsEndpoint = "tcp://*:70000" }, "port"},
		{"replay alone", func(c *config.Sim) { c.KVEventsReplayEndpoint = "tcp://*:5558" }, "needs --kv-events-endpoint"},
		{"format", func(c *config.Sim) { c.KVEventsEndpoint = "tcp://*:0"; c.KVEventsFormat = "atom" }, "--kv-events-format"},
		{"buffer", func(c *config.Sim) { c.KVEventsEndpoint = "tcp://*:0"; c.KVEventsBuffer = 0 }, "--kv-events-buffer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.DefaultSim()
			tc.edit(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	cfg := config.DefaultSim()
	cfg.KVEventsEndpoint = "tcp://*:5557"
	cfg.KVEventsReplayEndpoint = "tcp://[::1]:0"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestEventRingBounds(t *testing.T) {
	r := newEventRing(4)
	r.max = 100
	for i := range 3 {
		r.push(make([]byte, 30), false)
		if r.tail != 0 || r.head != uint64(i+1) {
			t.Fatalf("push %d: tail %d head %d", i, r.tail, r.head)
		}
	}
	r.push(make([]byte, 30), false) // 120 bytes: the oldest goes
	if r.tail != 1 || r.head != 4 || r.bytes > 100 {
		t.Fatalf("byte budget: tail %d head %d bytes %d", r.tail, r.head, r.bytes)
	}
	for range 6 {
		r.push([]byte{1}, false)
	}
	if r.head-r.tail != 4 || r.slotLocked(r.tail).seq != r.tail {
		t.Fatalf("count bound: tail %d head %d", r.tail, r.head)
	}
}

// TestReplayFromBeforeTheBuffer: a replay asking for batches the buffer no
// longer holds gets what it holds, starting at its tail, then the end
// marker, as vLLM answers.
func TestReplayFromBeforeTheBuffer(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) {
		c.KVEventsEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsReplayEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsBuffer = 2
	})
	// One batch a request: each request's batch is waited for before the
	// next is sent, since a request arriving before the scheduler's round
	// ends (a loaded box) would share its batch.
	for i := range 4 {
		ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 1}, promptTokens(i, 40)))
		testkit.Eventually(t, fmt.Sprintf("batch %d", i+1), func() bool {
			ring := ts.srv.events.ring
			ring.mu.Lock()
			defer ring.mu.Unlock()
			return ring.head == uint64(i+1)
		})
	}
	seqs, _ := zmtptest.RequestReplay(t, ts.srv.KVEventsReplayEndpoint(), 0)
	if len(seqs) != 2 || seqs[0] != 2 || seqs[1] != 3 {
		t.Errorf("replayed %v, want [2 3]", seqs)
	}
}

// TestKVEventsTimedConcurrent runs the stepping scheduler (not the
// zero-latency path) with concurrent requests sharing a prefix and a cache
// too small for all of them, so stores, hits and evictions interleave
// within steps.
func TestKVEventsTimedConcurrent(t *testing.T) {
	r := startEventRig(t, config.KVFormatVLLMArray, func(c *config.Sim) {
		c.TimeScale = 0.01
		c.MaxModelLen = 128
		c.KVBlocks = 48
		c.MaxNumSeqs = 4
		c.MaxNumBatchedTokens = 64
	})
	const n = 12
	errs := make(chan error, n)
	for i := range n {
		p := append(promptTokens(7, 24), promptTokens(100+i, 20+i)...)
		body := complBody(t, map[string]any{"max_tokens": 10 + i}, p)
		go func() {
			resp, err := r.ts.client.Post(r.ts.url+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != 200 {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	r.requests += n
	st := r.waitSynced(t)
	if st.Removed == 0 || st.Batches < 5 {
		t.Errorf("expected evictions over several steps: %+v", st)
	}
}
