package peer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/kvd"
	"github.com/infera/infera/kvd/peer"
	"github.com/infera/infera/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	model  = []byte("Qwen/Qwen3-8B")
	compat = []byte("tp0of1_pp0of1")
)

// newStore is a kvd store with a shared arena of 8 KiB slots.
func newStore(t testing.TB) *kvd.Store {
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
	return st
}

// source is a kvd that serves its arena: its transport engine on one
// loopback listener, its locate requests on another.
type source struct {
	store *kvd.Store
	eng   *transport.TCP
	srv   *peer.Server
	addr  string
}

func startSource(t testing.TB, opt peer.ServerOptions) *source {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eng, err := transport.NewTCP(transport.TCPConfig{Listener: ln, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	s := &source{store: newStore(t), eng: eng}
	if s.srv, err = peer.NewServer(s.store, eng, opt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.srv.Close()
		eng.Close()
	})
	s.addr = servetest.Loopback(t, "peer", s.srv.Serve)
	return s
}

// serveBench serves srv's locate requests on loopback for a benchmark.
func serveBench(b *testing.B, srv *peer.Server) string {
	b.Helper()
	return servetest.Loopback(b, "peer", srv.Serve)
}

// newPuller is a puller with its own engine and a scratch region of
// scratch bytes.
func newPuller(t testing.TB, scratch int, secret []byte) *peer.Puller {
	return newPullerOrdered(t, scratch, secret, true)
}

// unordered hides the TCP engine's InOrder, as an engine that may run a
// batch's ops in any order (Mooncake, MoRI) lacks it: the puller re-reads
// headers in a batch of their own.
type unordered struct{ transport.Engine }

func newPullerOrdered(t testing.TB, scratch int, secret []byte, ordered bool) *peer.Puller {
	t.Helper()
	tcp, err := transport.NewTCP(transport.TCPConfig{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	var eng transport.Engine = tcp
	if !ordered {
		eng = unordered{tcp}
	}
	p, err := peer.NewPuller(eng, scratch, secret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		eng.Close()
	})
	return p
}

func set(t testing.TB, st *kvd.Store, key string, value []byte) {
	t.Helper()
	if ok, reason := st.Set(&kvd.SetArgs{Model: model, CompatKey: compat, Key: []byte(key), Value: value}); !ok {
		t.Fatalf("set %s: %s", key, reason)
	}
}

// TestPullBlocks: blocks set on the source arrive byte for byte; keys it
// does not hold are misses; the counters say so. Both ways of re-reading
// the headers (in the payloads' batch, or after it).
func TestPullBlocks(t *testing.T) {
	for _, ordered := range []bool{true, false} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) { testPullBlocks(t, ordered) })
	}
}

func testPullBlocks(t *testing.T, ordered bool) {
	src := startSource(t, peer.ServerOptions{})
	want := map[string][]byte{}
	var keys [][]byte
	for i := range 40 {
		k := fmt.Sprintf("block-%02d", i)
		v := bytes.Repeat([]byte{byte(i)}, 1000+i*150)
		set(t, src.store, k, v)
		want[k] = v
		keys = append(keys, []byte(k))
	}
	keys = append(keys, []byte("absent"))
	p := newPullerOrdered(t, 256<<10, nil, ordered)
	got := map[string][]byte{}
	st, err := p.Pull(t.Context(), src.addr, model, compat, keys, func(k, v []byte) { got[string(k)] = bytes.Clone(v) })
	if err != nil {
		t.Fatal(err)
	}
	if st.Asked != 41 || st.Located != 40 || st.Pulled != 40 || st.Torn != 0 || len(got) != 40 {
		t.Fatalf("stats %+v, got %d", st, len(got))
	}
	for k, v := range want {
		if !bytes.Equal(got[k], v) {
			t.Fatalf("%s: %d bytes, want %d", k, len(got[k]), len(v))
		}
	}
	if s := src.srv.Stats(); s.Requests != 1 || s.Located != 40 {
		t.Fatalf("server stats %+v", s)
	}
	// Many small batches: a scratch region that holds a few blocks only.
	small := newPullerOrdered(t, 16<<10, nil, ordered)
	n := 0
	if _, err := small.Pull(t.Context(), src.addr, model, compat, keys, func(k, v []byte) {
		if !bytes.Equal(v, want[string(k)]) {
			t.Errorf("%s: wrong bytes", k)
		}
		n++
	}); err != nil || n != 40 {
		t.Fatalf("small scratch: %d pulled, %v", n, err)
	}
}

// TestPullNeverTorn: blocks rewritten on the source while they are pulled
// arrive whole or not at all (each value is one repeated byte: a torn read
// would mix two).
func TestPullNeverTorn(t *testing.T) {
	for _, ordered := range []bool{true, false} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) { testPullNeverTorn(t, ordered) })
	}
}

func testPullNeverTorn(t *testing.T, ordered bool) {
	src := startSource(t, peer.ServerOptions{})
	var keys [][]byte
	for i := range 16 {
		k := fmt.Sprintf("hot-%d", i)
		set(t, src.store, k, bytes.Repeat([]byte{0}, 6000))
		keys = append(keys, []byte(k))
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for g := byte(1); ctx.Err() == nil; g++ {
			for _, k := range keys {
				src.store.Set(&kvd.SetArgs{Model: model, CompatKey: compat, Key: k, Value: bytes.Repeat([]byte{g}, 6000)})
			}
		}
	}()
	p := newPullerOrdered(t, 256<<10, nil, ordered)
	pulled, torn := 0, 0
	for range 200 {
		st, err := p.Pull(t.Context(), src.addr, model, compat, keys, func(k, v []byte) {
			if len(v) != 6000 || bytes.Count(v, v[:1]) != len(v) {
				t.Errorf("%s: torn value delivered", k)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		pulled += st.Pulled
		torn += st.Torn
	}
	cancel()
	wg.Wait()
	t.Logf("pulled %d, torn (dropped) %d", pulled, torn)
	if pulled == 0 {
		t.Fatal("nothing pulled")
	}
}

// TestSourceDiesMidPull: a source that goes away while a puller reads
// yields misses and an error, never wrong bytes.
func TestSourceDiesMidPull(t *testing.T) {
	src := startSource(t, peer.ServerOptions{})
	var keys [][]byte
	for i := range 200 {
		k := fmt.Sprintf("b%03d", i)
		set(t, src.store, k, bytes.Repeat([]byte{byte(i)}, 4000))
		keys = append(keys, []byte(k))
	}
	p := newPuller(t, 16<<10, nil) // many batches: the engine closes between them
	var once sync.Once
	delivered := 0
	_, err := p.Pull(t.Context(), src.addr, model, compat, keys, func(k, v []byte) {
		var i int
		fmt.Sscanf(string(k), "b%03d", &i)
		if len(v) != 4000 || bytes.Count(v, []byte{byte(i)}) != 4000 {
			t.Errorf("%s: wrong bytes", k)
		}
		delivered++
		once.Do(func() { src.eng.Close() })
	})
	if !errors.Is(err, peer.ErrUnavailable) || delivered == 0 || delivered == len(keys) {
		t.Fatalf("delivered %d of %d, err %v", delivered, len(keys), err)
	}
	if s := p.Stats(); s.Failed != 1 {
		t.Fatalf("puller stats %+v", s)
	}
}

// TestSecretAndAllow: a wrong secret is denied; a network outside Allow
// is refused before any request.
func TestSecretAndAllow(t *testing.T) {
	src := startSource(t, peer.ServerOptions{Secret: []byte("s3cret")})
	set(t, src.store, "k", []byte("v"))
	keys := [][]byte{[]byte("k")}
	if _, err := newPuller(t, 256<<10, []byte("wrong")).Pull(t.Context(), src.addr, model, compat, keys, func(k, v []byte) {}); !errors.Is(err, peer.ErrDenied) {
		t.Fatalf("wrong secret: %v", err)
	}
	n := 0
	if _, err := newPuller(t, 256<<10, []byte("s3cret")).Pull(t.Context(), src.addr, model, compat, keys, func(k, v []byte) { n++ }); err != nil || n != 1 {
		t.Fatalf("right secret: %d %v", n, err)
	}
	fenced := startSource(t, peer.ServerOptions{Allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := newPuller(t, 256<<10, nil).Pull(ctx, fenced.addr, model, compat, keys, func(k, v []byte) {}); !errors.Is(err, peer.ErrUnavailable) {
		t.Fatalf("outside Allow: %v", err)
	}
	if s := fenced.srv.Stats(); s.Refused != 1 || s.Requests != 0 {
		t.Fatalf("fenced stats %+v", s)
	}
}

// TestRegisteredOnly: with the registry fence (Registered) the listener
// serves a puller whose connections come from a registered kvd's host and
// refuses, counted, one from any other address; Allow still admits its
// networks (routers). Two "hosts" on loopback: 127.0.0.1 and 127.0.0.2.
func TestRegisteredOnly(t *testing.T) {
	registered := netip.MustParseAddr("127.0.0.2")
	var logs bytes.Buffer
	var mu sync.Mutex
	src := startSource(t, peer.ServerOptions{Registered: func(ip netip.Addr) bool { return ip == registered },
		Log: zerolog.New(lockedWriter{&mu, &logs})})
	set(t, src.store, "k", []byte("v"))
	keys := [][]byte{[]byte("k")}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	for range 2 {
		if _, err := newPuller(t, 256<<10, nil).Pull(ctx, src.addr, model, compat, keys, func(k, v []byte) {}); !errors.Is(err, peer.ErrUnavailable) {
			t.Fatalf("unregistered source: %v", err)
		}
	}
	p := newPuller(t, 256<<10, nil)
	p.SetSource(registered)
	n := 0
	if _, err := p.Pull(ctx, src.addr, model, compat, keys, func(k, v []byte) { n++ }); err != nil || n != 1 {
		t.Fatalf("registered source: %d %v", n, err)
	}
	if s := src.srv.Stats(); s.Refused != 2 || s.Unregistered != 2 || s.Requests != 1 {
		t.Fatalf("stats %+v, want 2 refused (unregistered) and 1 request", s)
	}
	mu.Lock()
	refusals := bytes.Count(logs.Bytes(), []byte("not a registered kvd"))
	mu.Unlock()
	if refusals != 1 {
		t.Fatalf("%d refusal log lines, want 1 (rate-limited):\n%s", refusals, logs.String())
	}
	// Allow admits routers' networks beside the registry.
	routed := startSource(t, peer.ServerOptions{Registered: func(netip.Addr) bool { return false },
		Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	set(t, routed.store, "k", []byte("v"))
	if _, err := newPuller(t, 256<<10, nil).Pull(ctx, routed.addr, model, compat, keys, func(k, v []byte) {}); err != nil {
		t.Fatalf("allowed network: %v", err)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// TestHintPulls: a hint sent to kvd H's control listener, naming kvd G as
// the source, has H pull G's blocks into its store before the reply (the
// hint's wait); a wrong secret is denied; a kvd without a prefetcher
// refuses hints.
func TestHintPulls(t *testing.T) {
	g := startSource(t, peer.ServerOptions{Secret: []byte("fleet")})
	var keys [][]byte
	for i := range 12 {
		k := fmt.Sprintf("pfx-%02d", i)
		set(t, g.store, k, bytes.Repeat([]byte{byte(i + 1)}, 3000))
		keys = append(keys, []byte(k))
	}
	// H: its own store, a puller and prefetcher, and a control listener
	// that takes hints.
	hStore := newStore(t)
	pf := peer.NewPrefetcher(hStore, newPuller(t, 256<<10, []byte("fleet")), 8, zerolog.Nop())
	t.Cleanup(pf.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eng, err := transport.NewTCP(transport.TCPConfig{Listener: ln, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	hSrv, err := peer.NewServer(hStore, eng, peer.ServerOptions{Secret: []byte("fleet"), Hint: pf.HintWait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hSrv.Close() })
	hAddr := servetest.Loopback(t, "peer-h", hSrv.Serve)

	hinter := peer.NewHinter([]byte("fleet"))
	defer hinter.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	r, err := hinter.Send(ctx, hAddr, peer.Hint{Model: model, Compat: compat, Source: g.addr, Keys: keys, Deadline: 5 * time.Second, Wait: peer.MaxHintWait})
	if err != nil || !r.Done || r.Pulled != 12 {
		t.Fatalf("hint: %+v %v", r, err)
	}
	var sc kvd.Scratch
	for _, k := range keys {
		if h := hStore.Get(model, compat, k, &sc); !h.Found {
			t.Fatalf("%s not in H after the hint", k)
		}
	}
	if c := hStore.Counters(); c.PrefetchUseful != 12 {
		t.Fatalf("useful prefetches %d, want 12 (every pulled block read once)", c.PrefetchUseful)
	}
	if s := hSrv.Stats(); s.Hints != 1 {
		t.Fatalf("H server stats %+v", s)
	}
	// Kept connection: a second hint on it (no wait).
	if r, err := hinter.Send(ctx, hAddr, peer.Hint{Model: model, Compat: compat, Source: g.addr, Keys: keys[:1], Deadline: time.Second}); err != nil || r.Done {
		t.Fatalf("second hint: %+v %v", r, err)
	}
	wrong := peer.NewHinter([]byte("nope"))
	defer wrong.Close()
	if _, err := wrong.Send(ctx, hAddr, peer.Hint{Model: model, Compat: compat, Source: g.addr, Keys: keys, Deadline: time.Second}); !errors.Is(err, peer.ErrDenied) {
		t.Fatalf("wrong secret: %v", err)
	}
	// G serves locates but takes no hints.
	if _, err := hinter.Send(ctx, g.addr, peer.Hint{Model: model, Compat: compat, Source: hAddr, Keys: keys, Deadline: time.Second}); !errors.Is(err, peer.ErrProtocol) {
		t.Fatalf("hint to a kvd without a prefetcher: %v", err)
	}
	if _, err := hinter.Send(ctx, hAddr, peer.Hint{Model: model, Compat: compat, Source: "no-port", Keys: keys, Deadline: time.Second}); !errors.Is(err, peer.ErrProtocol) {
		t.Fatalf("bad source: %v", err)
	}
}
