package kvcache

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/zmtp/zmtptest"
)

// TestParentZeroAndEmptyBytesAreRoot: engines that write 0 or an empty bytes
// hash for "no parent" store root blocks, not orphans.
func TestParentZeroAndEmptyBytesAreRoot(t *testing.T) {
	e := newEngineSim(t, 2)
	for name, parent := range map[string]any{"int0": 0, "uint0": uint64(0), "empty bytes": []byte{}, "zero bytes": []byte{0, 0, 0, 0, 0, 0, 0, 0}} {
		t.Run(name, func(t *testing.T) {
			b := decodeOK(t, mp(t, []any{1.0, []any{arrStored([]uint64{e.engineHash(0), e.engineHash(1)}, parent, e.tokens, e.bs, nil, "GPU")}}))
			if ev := b.Events[0]; ev.HasParent {
				t.Fatalf("parent %v decoded as a real parent %x", parent, ev.Parent)
			}
			idx := NewIndex(IndexConfig{MaxBlocks: 100})
			w, err := idx.Register(Key{Worker: "w"}, e.bs)
			if err != nil {
				t.Fatal(err)
			}
			if res := idx.Apply(w, b); res.Stored != 2 || res.UnknownParent != 0 {
				t.Fatalf("apply %+v", res)
			}
			if got := idx.Match(w, e.routerHashes()); got != 2 {
				t.Fatalf("match %d, want 2", got)
			}
		})
	}
}

// TestSubscriberReplayWithTopicFrame: a replay server that puts its topic
// before the sequence and ends with an all-ones sequence and a non-empty
// payload is followed like vLLM's.
func TestSubscriberReplayWithTopicFrame(t *testing.T) {
	pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@w")
	rep := zmtptest.NewReplay(t)
	rep.SetFraming([]byte("kv@w"), []byte{0xc0})
	e := newEngineSim(t, 8)
	rep.Add(0, e.storeBatch(0, 4))
	rep.Add(1, e.storeBatch(4, 8))
	idx, s := newTestSubscriber(t, DefaultSubscriberConfig())
	key := Key{Worker: "topic:8000"}
	w, err := s.Add(Source{Key: key, Endpoint: pub.Endpoint(), ReplayEndpoint: rep.Endpoint(), BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "replay on connect", func() bool { return stats(t, s, key).Replays >= 1 })
	st := stats(t, s, key)
	if st.NextSeq != 2 || st.Mode != ModePrecise || st.ReplayFailures != 0 || st.Gaps != 0 {
		t.Fatalf("stats %+v", st)
	}
	if idx.Match(w, e.routerHashes()) != 8 {
		t.Fatal("replayed blocks do not match")
	}
}

// TestSubscriberFirstSeqNotZeroIsNotAGap: a router that starts next to a
// running engine without a replay socket joins at the first batch it sees:
// no gap, no resync; the worker is rebuilt from what follows.
func TestSubscriberFirstSeqNotZeroIsNotAGap(t *testing.T) {
	for _, rebuild := range []bool{false, true} {
		name := "stays approximate"
		if rebuild {
			name = "rebuilt"
		}
		t.Run(name, func(t *testing.T) {
			pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@w")
			cfg := subConfig(func(c *SubscriberConfig) {
				c.RebuildAfter = 0
				if rebuild {
					c.RebuildAfter = time.Nanosecond
				}
			})
			idx, s := newTestSubscriber(t, cfg)
			key := Key{Worker: "join:8000"}
			w, err := s.Add(Source{Key: key, Endpoint: pub.Endpoint(), BlockSize: 4})
			if err != nil {
				t.Fatal(err)
			}
			pub.WaitSubscriber(t)
			e := newEngineSim(t, 8)
			pub.Publish(41, e.storeBatch(0, 4))
			pub.Publish(42, e.storeBatch(4, 8))
			testkit.Eventually(t, "both batches", func() bool { return stats(t, s, key).NextSeq == 43 })
			st := stats(t, s, key)
			if st.Gaps != 0 || st.Resyncs != 0 || st.Joins != 1 || st.Blocks != 8 || st.UnknownParent != 0 {
				t.Fatalf("stats %+v", st)
			}
			if want := map[bool]Mode{false: ModeApproximate, true: ModePrecise}[rebuild]; st.Mode != want {
				t.Fatalf("mode %v, want %v (stats %+v)", st.Mode, want, st)
			}
			if rebuild && st.Rebuilds != 1 {
				t.Fatalf("rebuilds %d", st.Rebuilds)
			}
			if idx.Match(w, e.routerHashes()) != 8 {
				t.Fatal("blocks after the join do not match")
			}
		})
	}
}

// TestDropLogOncePerWorkerAndReason: blocks the index cannot take are
// logged once per worker and reason, however often they come.
func TestDropLogOncePerWorkerAndReason(t *testing.T) {
	var logs testkit.LogSink
	idx := NewIndex(IndexConfig{MaxBlocks: 1000})
	cfg := DefaultSubscriberConfig()
	cfg.BackoffMin, cfg.BackoffMax = 10*time.Millisecond, 50*time.Millisecond
	s, err := NewSubscriber(idx, cfg, zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	e := newEngineSim(t, 4)
	orphan := mp(t, []any{1.0, []any{arrStored([]uint64{0xAA}, uint64(0xDEAD), e.tokens[:4], 4, nil, "GPU")}})
	lora := mp(t, []any{1.0, []any{arrStored([]uint64{0xBB}, nil, e.tokens[:4], 4, 7, "GPU")}})
	workers := []string{"a:1", "b:1"}
	var pubs []*zmtptest.Publisher
	for _, id := range workers {
		pub := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv@"+id)
		if _, err := s.Add(Source{Key: Key{Worker: id}, Endpoint: pub.Endpoint(), BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
		pub.WaitSubscriber(t)
		pubs = append(pubs, pub)
	}
	for i, pub := range pubs {
		for seq := range uint64(6) {
			if seq%2 == 0 {
				pub.Publish(seq, orphan)
			} else {
				pub.Publish(seq, lora)
			}
		}
		key := Key{Worker: workers[i]}
		testkit.Eventually(t, "all batches", func() bool { return stats(t, s, key).NextSeq == 6 })
		if st := stats(t, s, key); st.UnknownParent != 3 || st.Skipped != 3 {
			t.Fatalf("stats %+v", st)
		}
	}
	out := logs.String()
	for _, id := range workers {
		for _, reason := range []string{"unknown_parent", "lora"} {
			n := 0
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, `"worker":"`+id+`"`) && strings.Contains(line, `"reason":"`+reason+`"`) &&
					strings.Contains(line, "not indexed") {
					n++
				}
			}
			if n != 1 {
				t.Errorf("worker %s reason %s logged %d times, want 1\n%s", id, reason, n, out)
			}
		}
	}
}

// TestLearnParentFromRoutedPrompt: a block whose parent the engine stored
// before the router knew the worker is learned from the prompt the router
// routed there: the parent chain is the prompt's, and the prefix the engine
// served from its cache is indexed too.
func TestLearnParentFromRoutedPrompt(t *testing.T) {
	e := newEngineSim(t, 8)
	idx := NewIndex(IndexConfig{MaxBlocks: 100})
	w, err := idx.Register(Key{Worker: "w"}, e.bs)
	if err != nil {
		t.Fatal(err)
	}
	all := e.routerHashes()
	// Without the prompt, blocks 5..7 (parent: engine block 4, unknown)
	// are dropped.
	late := decodeOK(t, e.storeBatch(5, 8))
	if res := idx.Apply(w, late); res.UnknownParent != 3 || res.Dropped&DropUnknownParent == 0 {
		t.Fatalf("apply without prompt %+v", res)
	}
	// Another prompt, and the one whose tail the engine stored.
	other := seqTokens(16, func(i int) uint32 { return uint32(9000 + i) })
	idx.NotePrompt(w, other, AppendBlockHashes(nil, other, e.bs), e.bs)
	idx.NotePrompt(w, e.tokens, all, e.bs)
	res := idx.Apply(w, decodeOK(t, e.storeBatch(5, 8)))
	if res.Stored != 3 || res.Learned != 5 || res.UnknownParent != 0 {
		t.Fatalf("apply with prompt %+v", res)
	}
	if got := idx.Match(w, all); got != 8 {
		t.Fatalf("match %d, want 8", got)
	}
	// The learned parent resolves a removal, and later children.
	if res := idx.Apply(w, decodeOK(t, e.removeBatch(4))); res.Removed != 1 {
		t.Fatalf("remove learned parent %+v", res)
	}
	if got := idx.Match(w, all); got != 4 {
		t.Fatalf("match after removing block 4: %d, want 4", got)
	}
}
