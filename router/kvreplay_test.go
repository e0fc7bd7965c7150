package router_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/router"
	"github.com/infera/infera/tokenizer"
	"github.com/infera/infera/zmtp/zmtptest"
)

// storedBatch is a vLLM (map form) batch storing blocks [from, to) of
// tokens, engine hashes 1000+i, chained to block from-1.
func storedBatch(t *testing.T, tokens []uint32, from, to int) []byte {
	t.Helper()
	hashes := make([]uint64, 0, to-from)
	for i := from; i < to; i++ {
		hashes = append(hashes, uint64(1000+i))
	}
	var parent any
	if from > 0 {
		parent = uint64(1000 + from - 1)
	}
	ev := map[string]any{
		"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
		"token_ids": tokens[from*16 : to*16], "block_size": 16, "lora_id": nil, "medium": "GPU",
	}
	b, err := msgpack.Marshal([]any{1.0, []any{ev}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKVReplayRecoversDroppedBatch: a batch lost on the live stream is
// fetched from the replay socket; the index ends complete and the metrics
// show the gap and the replay.
func TestKVReplayRecoversDroppedBatch(t *testing.T) {
	pub, rep := zmtptest.NewPublisher(t, "127.0.0.1:0", "kv-events"), zmtptest.NewReplay(t)
	up := jsonUpstream(t)
	rec := record(up, "m", "")
	ep, rp, bs := pub.Endpoint(), rep.Endpoint(), 16
	rec.KVEventsEndpoint, rec.KVEventsReplayEndpoint, rec.KVBlockSize = &ep, &rp, &bs
	tr := startRouter(t, newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = router.TokenizerBytes })), router.DefaultConfig(), rec)
	pub.WaitSubscriber(t)
	testkit.Eventually(t, "the stream to be confirmed", func() bool {
		_, v, _ := tr.cacheView(t, rec.WorkerID, "")
		return v.Mode == "precise"
	})

	tokens := tokenizer.Bytes{}.Encode(strings.Repeat("0123456789abcdef", 6))
	for seq, blocks := range [][2]int{{0, 2}, {2, 4}, {4, 6}} {
		b := storedBatch(t, tokens, blocks[0], blocks[1])
		rep.Add(uint64(seq), b)
		if seq != 1 { // batch 1 is lost on the way
			pub.Publish(uint64(seq), b)
		}
	}
	testkit.Eventually(t, "all 6 blocks indexed", func() bool {
		_, v, _ := tr.cacheView(t, rec.WorkerID, "")
		return v.BlockCount == 6 && v.Mode == "precise"
	})
	labels := `{dp_rank="0",worker_id="` + rec.WorkerID + `"}`
	for name, want := range map[string]float64{
		"infera_router_kv_event_gaps_total":    1,
		"infera_router_kv_event_resyncs_total": 0,
		"infera_router_kv_event_batches_total": 3,
	} {
		if v, ok := tr.metric(t, name+labels); !ok || v != want {
			t.Errorf("%s = %v (%v), want %v", name, v, ok, want)
		}
	}
	if v, _ := tr.metric(t, "infera_router_kv_event_replays_total"+labels); v < 2 {
		t.Errorf("replays %v, want the connect-time one and the gap's", v)
	}
	// The whole prompt now routes as a 6-block hit.
	tr.do(t, http.MethodPost, "/v1/completions", `{"model":"m","prompt":"`+strings.Repeat("0123456789abcdef", 6)+`"}`)
	if v, _ := tr.metric(t, "infera_router_kv_hit_blocks_total"); v != 6 {
		t.Errorf("hit blocks %v, want 6", v)
	}
}
