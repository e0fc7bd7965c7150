package router

import (
	"bytes"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/kvd"
	"github.com/infera/infera/kvd/peer"
	"github.com/infera/infera/transport"
)

// peerKVD is an in-process kvd with a peer listener: its store, and, when
// it takes hints, a prefetcher that pulls with the secret.
type peerKVD struct {
	store *kvd.Store
	addr  string
}

func startPeerKVD(t *testing.T, secret string, hints bool) *peerKVD {
	t.Helper()
	a, _, err := kvd.OpenArena(4<<20, false, false)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kvd.NewStore(kvd.StoreOptions{MaxBytes: 4 << 20, Arena: a, SlotBytes: 8 << 10, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		a.Close()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eng, err := transport.NewTCP(transport.TCPConfig{Listener: ln, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	opt := peer.ServerOptions{Secret: []byte(secret)}
	if hints {
		pullEng, err := transport.NewTCP(transport.TCPConfig{Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pullEng.Close() })
		pl, err := peer.NewPuller(pullEng, 1<<20, []byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pl.Close() })
		pf := peer.NewPrefetcher(st, pl, 8, zerolog.Nop())
		t.Cleanup(pf.Close)
		opt.Hint = pf.HintWait
	}
	srv, err := peer.NewServer(st, eng, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return &peerKVD{store: st, addr: servetest.Loopback(t, "kvd-peer", srv.Serve)}
}

// peerHintEnv: workers 0 (G) and 1 (H) on two hosts, G holding a prompt's
// prefix in the router's index and its blocks in G's kvd under its
// engine hashes; it returns the env, the prompt and the blocks' keys.
func peerHintEnv(t *testing.T, gPeer, hPeer string, wait time.Duration, gStore *kvd.Store) (*kvEnv, string, [][]byte) {
	return peerHintEnvRecords(t, kvRecord(0, func(r *discovery.Record) { r.KVDPeer = gPeer }),
		kvRecord(1, func(r *discovery.Record) { r.KVDPeer = hPeer }), wait, gStore)
}

// onHost moves a test record to host (its worker_id and url).
func onHost(rec discovery.Record, host string) discovery.Record {
	rec.WorkerID = host + rec.WorkerID[strings.LastIndexByte(rec.WorkerID, ':'):]
	rec.URL = "http://" + rec.WorkerID
	return rec
}

// peerHintEnvRecords is peerHintEnv with G's and H's records given.
func peerHintEnvRecords(t *testing.T, gRec, hRec discovery.Record, wait time.Duration, gStore *kvd.Store) (*kvEnv, string, [][]byte) {
	t.Helper()
	e := newKVEnv(t, kvConfig(func(c *KVAwareConfig) {
		c.TokenizerSpec, c.RecentWeight, c.ProvisionalTTL = TokenizerBytes, 0, 0
		c.PeerHints, c.PeerSecret, c.PeerWait = true, "s3cret", wait
	}), gRec, hRec)
	e.makePrecise()
	prompt := unique(7, 320)
	tokens := chatTokens(t, prompt)
	g := gRec.WorkerID
	e.store(g, tokens)
	hs := kvcache.AppendBlockHashes(nil, tokens, 16)
	eng := e.p.idx.AppendEngineHashes(nil, (*e.p.workers[g].targets.Load())[0].idx, hs)
	if len(eng) != len(hs) {
		t.Fatalf("engine hashes %d of %d", len(eng), len(hs))
	}
	var keys [][]byte
	for i, h := range eng {
		k := binary.BigEndian.AppendUint64(nil, h)
		keys = append(keys, k)
		if gStore != nil {
			if ok, reason := gStore.Set(&kvd.SetArgs{Model: []byte("m"), CompatKey: []byte(DefaultPrewarmCompatKey), Key: k,
				Value: bytes.Repeat([]byte{byte(i + 1)}, 2000)}); !ok {
				t.Fatal(reason)
			}
		}
	}
	return e, chat(prompt + " and more"), keys
}

// pickH repeats the warm request until the warm share bound sends one to
// H (worker 1), the pick that directs a pull.
func (e *kvEnv) pickH(body string) { e.pickTo(kvRecord(1, nil).WorkerID, body) }

// pickTo repeats the request until a pick sends it to worker h.
func (e *kvEnv) pickTo(h, body string) {
	e.t.Helper()
	for range 50 {
		got := e.serial(body)
		e.clock.advance(10 * time.Millisecond)
		if got == h {
			return
		}
	}
	e.t.Fatal("no pick went to H")
}

// TestPeerHintDirectsPull: a pick that sends G's warm prefix to H first
// has H's kvd pull G's blocks (the hint names G's kvd), and they are in
// H's store when Pick returns.
func TestPeerHintDirectsPull(t *testing.T) {
	g, h := startPeerKVD(t, "s3cret", false), startPeerKVD(t, "s3cret", true)
	e, body, keys := peerHintEnv(t, g.addr, h.addr, 5*time.Second, g.store)
	e.pickH(body)
	if m := gatherLabeled(t, e.r, "infera_router_kvd_peer_hints_total", "pulled"); m != 1 {
		t.Fatalf("pulled hints %v", m)
	}
	// The blocks the continued prompt shares with G's (the last stored
	// block ends the first message, which the continuation changes).
	n := int(gather(t, e.r, "infera_router_kvd_peer_pulled_blocks_total").GetCounter().GetValue())
	if n < len(keys)-2 || n > len(keys) {
		t.Fatalf("pulled %d blocks of G's %d", n, len(keys))
	}
	var sc kvd.Scratch
	for i, k := range keys[:n] {
		if hit := h.store.Get([]byte("m"), []byte(DefaultPrewarmCompatKey), k, &sc); !hit.Found {
			t.Fatalf("block %d not in H's kvd when the pick returned", i)
		}
	}
}

// TestPeerHintFromRegistry: the kvds are named by the kvd registry, by the
// host of each worker's id: G's record names no kvd, H's names a dead one
// (a stale kvd_peer), and the registry wins: H's kvd pulls from G's.
func TestPeerHintFromRegistry(t *testing.T) {
	g, h := startPeerKVD(t, "s3cret", false), startPeerKVD(t, "s3cret", true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	gRec := onHost(kvRecord(0, nil), "10.0.0.1")
	hRec := onHost(kvRecord(1, func(r *discovery.Record) { r.KVDPeer = dead }), "10.0.0.2")
	e, body, keys := peerHintEnvRecords(t, gRec, hRec, 5*time.Second, g.store)
	kvdRec := func(host, peer string) discovery.KVDRecord {
		return discovery.KVDRecord{Host: host, Peer: peer, Transport: discovery.KVDTransport{Kind: discovery.KVDTransportTCP, Addr: peer}}
	}
	e.r.UpdateKVDs(discovery.NewKVDSnapshot(1, []discovery.KVDRecord{kvdRec("10.0.0.1", g.addr), kvdRec("10.0.0.2", h.addr)}))
	e.pickTo(hRec.WorkerID, body)
	if m := gatherLabeled(t, e.r, "infera_router_kvd_peer_hints_total", "pulled"); m != 1 {
		t.Fatalf("pulled hints %v (failed %v)", m, gatherLabeled(t, e.r, "infera_router_kvd_peer_hints_total", "failed"))
	}
	n := int(gather(t, e.r, "infera_router_kvd_peer_pulled_blocks_total").GetCounter().GetValue())
	if n < len(keys)-2 || n > len(keys) {
		t.Fatalf("pulled %d blocks of G's %d", n, len(keys))
	}
}

// TestPeerHintFailureStaysOffThePath: a hint H's kvd cannot take (nobody
// listens there) costs the pick no more than the dial, and is counted.
func TestPeerHintFailureStaysOffThePath(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	g := startPeerKVD(t, "s3cret", false)
	e, body, _ := peerHintEnv(t, g.addr, dead, 5*time.Second, g.store)
	begin := time.Now()
	e.pickH(body)
	if took := time.Since(begin); took > 3*time.Second {
		t.Fatalf("picks took %v with H's kvd down", took)
	}
	if m := gatherLabeled(t, e.r, "infera_router_kvd_peer_hints_total", "failed"); m != 1 {
		t.Fatalf("failed hints %v", m)
	}
}

// gatherLabeled returns the counter of name whose first label has value
// label (0 when absent).
func gatherLabeled(t *testing.T, r *Router, name, label string) float64 {
	t.Helper()
	for _, mf := range gatherAll(t, r) {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestPeerHintSkipsUnsupportedEngine: when either worker's engine keys its
// kvd blocks otherwise than the simulator (a vLLM worker: chunk keys over
// digests the KV events do not carry whole), no hint is sent, the pick
// does not wait, and the skip is counted.
func TestPeerHintSkipsUnsupportedEngine(t *testing.T) {
	vllm := func(r *discovery.Record) { r.Engine, r.RealEngine = discovery.EngineVLLM, "" }
	sim := func(r *discovery.Record) { r.Engine, r.RealEngine = discovery.EngineVLLM, discovery.EngineSim }
	for _, tc := range []struct {
		name   string
		g, h   func(*discovery.Record)
		hinted bool
	}{
		{"vllm to vllm", vllm, vllm, false},
		{"sim to vllm", sim, vllm, false},
		{"vllm to sim", vllm, sim, false},
		{"sim imitating vllm", sim, sim, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, h := startPeerKVD(t, "s3cret", false), startPeerKVD(t, "s3cret", true)
			gRec := kvRecord(0, func(r *discovery.Record) { tc.g(r); r.KVDPeer = g.addr })
			hRec := kvRecord(1, func(r *discovery.Record) { tc.h(r); r.KVDPeer = h.addr })
			e, body, keys := peerHintEnvRecords(t, gRec, hRec, 5*time.Second, g.store)
			e.pickH(body)
			unsupported := gatherLabeled(t, e.r, "infera_router_kvd_peer_hints_total", "unsupported")
			pulled := gatherLabeled(t, e.r, "infera_router_kvd_peer_hints_total", "pulled")
			if tc.hinted {
				if unsupported != 0 || pulled != 1 {
					t.Fatalf("unsupported %v pulled %v, want 0 and 1", unsupported, pulled)
				}
				return
			}
			if unsupported != 1 || pulled != 0 {
				t.Fatalf("unsupported %v pulled %v, want 1 and 0", unsupported, pulled)
			}
			var sc kvd.Scratch
			for i, k := range keys {
				if h.store.Get([]byte("m"), []byte(DefaultPrewarmCompatKey), k, &sc).Found {
					t.Fatalf("block %d pulled into H's kvd without a hint", i)
				}
			}
		})
	}
}
