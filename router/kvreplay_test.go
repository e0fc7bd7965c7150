package router_test

import (
	"context"
	"encoding/binary"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/infera/infera/router"
	"github.com/infera/infera/tokenizer"
)

// zmqPub is an engine-side PUB endpoint on zmq4's connection API (zmq4's
// PUB socket leaks a goroutine on Close): it accepts subscribers and sends
// [topic, seq, payload] to each, as vLLM's publisher does.
type zmqPub struct {
	ln    net.Listener
	subs  chan struct{}
	mu    sync.Mutex
	conns []*zmq4.Conn
	raws  []net.Conn
	wg    sync.WaitGroup
}

func newZMQPub(t *testing.T) *zmqPub {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &zmqPub{ln: ln, subs: make(chan struct{}, 16)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, nc := range p.raws {
			nc.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *zmqPub) endpoint() string { return "tcp://" + p.ln.Addr().String() }

func (p *zmqPub) accept() {
	defer p.wg.Done()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			return
		}
		zc, err := zmq4.Open(nc, null.Security(), zmq4.Pub, nil, true, nil)
		if err != nil {
			nc.Close()
			continue
		}
		// Wait for the subscription message (0x01 + prefix).
		msg, err := zc.RecvMsg()
		if err != nil || len(msg.Frames) != 1 || len(msg.Frames[0]) == 0 || msg.Frames[0][0] != 1 {
			nc.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, zc)
		p.raws = append(p.raws, nc)
		p.mu.Unlock()
		p.subs <- struct{}{}
	}
}

func (p *zmqPub) waitSubscriber(t *testing.T) {
	t.Helper()
	select {
	case <-p.subs:
	case <-time.After(15 * time.Second):
		t.Fatal("no subscriber connected")
	}
}

func (p *zmqPub) publish(seq uint64, payload []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.SendMsg(zmq4.NewMsgFrom([]byte("kv-events"), seqBytes(seq), payload))
	}
}

// zmqReplay is a vLLM-style replay server on a zmq4 ROUTER socket.
type zmqReplay struct {
	sock zmq4.Socket
	mu   sync.Mutex
	buf  map[uint64][]byte
	wg   sync.WaitGroup
}

func newZMQReplay(t *testing.T) *zmqReplay {
	t.Helper()
	r := &zmqReplay{sock: zmq4.NewRouter(context.Background()), buf: make(map[uint64][]byte)}
	if err := r.sock.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	r.wg.Add(1)
	go r.serve()
	t.Cleanup(func() {
		r.sock.Close()
		r.wg.Wait()
	})
	return r
}

func (r *zmqReplay) endpoint() string { return "tcp://" + r.sock.Addr().String() }

func (r *zmqReplay) add(seq uint64, payload []byte) {
	r.mu.Lock()
	r.buf[seq] = payload
	r.mu.Unlock()
}

func (r *zmqReplay) serve() {
	defer r.wg.Done()
	for {
		msg, err := r.sock.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		r.mu.Lock()
		var seqs []uint64
		for s := range r.buf {
			if s >= start {
				seqs = append(seqs, s)
			}
		}
		slices.Sort(seqs)
		out := make([][]byte, len(seqs))
		for i, s := range seqs {
			out[i] = r.buf[s]
		}
		r.mu.Unlock()
		for i, s := range seqs {
			_ = r.sock.Send(zmq4.NewMsgFrom(id, []byte{}, seqBytes(s), out[i]))
		}
		_ = r.sock.Send(zmq4.NewMsgFrom(id, []byte{}, seqBytes(^uint64(0)), []byte{}))
	}
}

func seqBytes(seq uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	return b[:]
}

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
	pub, rep := newZMQPub(t), newZMQReplay(t)
	up := jsonUpstream(t)
	rec := record(up, "m", "")
	ep, rp, bs := pub.endpoint(), rep.endpoint(), 16
	rec.KVEventsEndpoint, rec.KVEventsReplayEndpoint, rec.KVBlockSize = &ep, &rp, &bs
	tr := startRouter(t, newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = router.TokenizerBytes })), router.DefaultConfig(), rec)
	pub.waitSubscriber(t)
	eventually(t, "the stream to be confirmed", func() bool {
		_, v, _ := tr.cacheView(t, rec.WorkerID, "")
		return v.Mode == "precise"
	})

	tokens := tokenizer.Bytes{}.Encode(strings.Repeat("0123456789abcdef", 6))
	for seq, blocks := range [][2]int{{0, 2}, {2, 4}, {4, 6}} {
		b := storedBatch(t, tokens, blocks[0], blocks[1])
		rep.add(uint64(seq), b)
		if seq != 1 { // batch 1 is lost on the way
			pub.publish(uint64(seq), b)
		}
	}
	eventually(t, "all 6 blocks indexed", func() bool {
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
