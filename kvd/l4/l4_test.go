package l4

import (
	"bytes"
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/infera/infera/internal/redistest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd"
	"github.com/infera/infera/kvd/tablespace"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	model  = []byte("meta-llama/Llama-3.1-8B")
	compat = []byte("tp0of1_pp0of1")
)

// host is one kvd store (no arena) over an L4 tier, optionally over L3.
type host struct {
	store *kvd.Store
	tier  *Tier
	ts    *tablespace.Tablespace
}

func newHost(t *testing.T, url string, withL3 bool) *host {
	t.Helper()
	h := &host{}
	opt := Options{URLs: []string{url}, Prefix: "test:", TTL: time.Hour, Timeout: 200 * time.Millisecond, Log: zerolog.Nop()}
	if withL3 {
		ts, err := tablespace.Open(tablespace.Config{Paths: []string{filepath.Join(t.TempDir(), "l3")}, Bytes: 16 << 20, SlotBytes: 64 << 10,
			ContainerBytes: 8 << 20, DirectIO: tablespace.DirectIO("off"), Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		h.ts = ts
		opt.Below, opt.BelowNotFound = ts, tablespace.ErrNotFound
	}
	tier, err := Open(opt)
	if err != nil {
		t.Fatal(err)
	}
	h.tier = tier
	st, err := kvd.NewStore(kvd.StoreOptions{MaxBytes: 8 << 20, Long: tier, LongNotFound: ErrNotFound, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	h.store = st
	t.Cleanup(func() {
		st.Close()
		tier.Close()
		if h.ts != nil {
			h.ts.Close()
		}
	})
	return h
}

func (h *host) set(t *testing.T, key string, v []byte) {
	t.Helper()
	if ok, reason := h.store.Set(&kvd.SetArgs{Model: model, CompatKey: compat, Key: []byte(key), Value: v, Retention: []byte("long")}); !ok {
		t.Fatalf("set %s: %s", key, reason)
	}
}

func (h *host) get(key string) ([]byte, bool) {
	hit := h.store.Get(model, compat, []byte(key), nil)
	v, ok := h.store.AppendHit(nil, hit)
	return v, ok
}

func client(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestWriteBehindReadThrough: a long entry set on host A is written to
// Redis (with a TTL and a checksum frame); host B, with nothing local,
// reads it through L4 and promotes it into RAM.
func TestWriteBehindReadThrough(t *testing.T) {
	rs := redistest.Start(t)
	rc := client(t, rs.Addr)
	a, b := newHost(t, rs.URL(), false), newHost(t, rs.URL(), false)
	val := bytes.Repeat([]byte("kv"), 5000)
	a.set(t, "block-1", val)
	rk := a.tier.RedisKey(model, compat, []byte("block-1"))
	if rk != "test:meta-llama/Llama-3.1-8B:tp0of1_pp0of1:"+"626c6f636b2d31" {
		t.Fatalf("redis key %q", rk)
	}
	ctx := context.Background()
	testkit.Eventually(t, "write-behind", func() bool { return rc.Exists(ctx, rk).Val() == 1 })
	if ttl := rc.TTL(ctx, rk).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("ttl %v", ttl)
	}
	raw, _ := rc.Get(ctx, rk).Bytes()
	if p, ok := unframe(raw); !ok || !bytes.Equal(p, val) {
		t.Fatal("stored value is not the framed block")
	}
	if b.store.Resident(model, compat, []byte("block-1")) {
		t.Fatal("B has the block before reading it")
	}
	if !b.store.Exists(model, compat, []byte("block-1"), nil) {
		t.Fatal("exists through L4")
	}
	v, ok := b.get("block-1")
	if !ok || !bytes.Equal(v, val) {
		t.Fatalf("B read-through: %v", ok)
	}
	if !b.store.Resident(model, compat, []byte("block-1")) {
		t.Fatal("L4 hit not promoted into B's RAM")
	}
	if s := b.tier.Stats(); s.Hits != 1 {
		t.Fatalf("B stats %+v", s)
	}
	// The second read is a RAM hit: L4 is not asked again.
	if _, ok := b.get("block-1"); !ok || b.tier.Stats().Hits != 1 {
		t.Fatal("second read went to L4")
	}
	if _, ok := b.get("absent"); ok {
		t.Fatal("absent key found")
	}
	// Deleting on A deletes in Redis too.
	a.store.Delete(model, compat, []byte("block-1"), nil)
	testkit.Eventually(t, "delete-behind", func() bool { return rc.Exists(ctx, rk).Val() == 0 })
}

// TestChecksumMismatchIsMiss: a corrupted Redis value is a miss (and is
// deleted), never served.
func TestChecksumMismatchIsMiss(t *testing.T) {
	rs := redistest.Start(t)
	rc := client(t, rs.Addr)
	a, b := newHost(t, rs.URL(), false), newHost(t, rs.URL(), false)
	a.set(t, "blk", []byte("the real kv bytes"))
	rk := a.tier.RedisKey(model, compat, []byte("blk"))
	ctx := context.Background()
	testkit.Eventually(t, "write-behind", func() bool { return rc.Exists(ctx, rk).Val() == 1 })
	rc.SetRange(ctx, rk, int64(headerSize+2), "X")
	if _, ok := b.get("blk"); ok {
		t.Fatal("corrupted value served")
	}
	if s := b.tier.Stats(); s.ChecksumFailures != 1 || s.Hits != 0 {
		t.Fatalf("stats %+v", s)
	}
	testkit.Eventually(t, "corrupt copy deleted", func() bool { return rc.Exists(ctx, rk).Val() == 0 })
	rc.Set(ctx, rk, "not a kvd value", 0) // a foreign value is a miss too
	if _, ok := b.get("blk"); ok {
		t.Fatal("foreign value served")
	}
}

// TestOutage: Redis killed mid-run → kvd keeps serving from RAM/L3,
// writes are dropped and counted, the gauge drops; when Redis returns the
// tier recovers and writes flow again.
func TestOutage(t *testing.T) {
	rs := redistest.Start(t)
	a := newHost(t, rs.URL(), true)
	a.set(t, "before", []byte("v0"))
	rc := client(t, rs.Addr)
	ctx := context.Background()
	testkit.Eventually(t, "write-behind", func() bool { return rc.Exists(ctx, a.tier.RedisKey(model, compat, []byte("before"))).Val() == 1 })
	rs.Kill()
	for i := range 50 {
		a.set(t, "during-"+string(rune('a'+i%26))+string(rune('a'+i/26)), []byte("v1"))
	}
	if v, ok := a.get("before"); !ok || string(v) != "v0" {
		t.Fatal("RAM entry not served during the outage")
	}
	if _, ok := a.get("never-stored"); ok {
		t.Fatal("miss during outage answered a value")
	}
	testkit.Eventually(t, "down gauge", func() bool { return !a.tier.Up() })
	a.set(t, "while-down", []byte("v2"))
	testkit.Eventually(t, "L3 write during outage", func() bool {
		return a.ts.Exists(kvd.Composite(nil, model, compat, []byte("while-down")))
	})
	if s := a.tier.Stats(); s.WritesDropped == 0 || s.Outages != 1 {
		t.Fatalf("stats during outage %+v", s)
	}
	rs.Restart()
	testkit.Eventually(t, "recovery", a.tier.Up)
	a.set(t, "after", []byte("v3"))
	rc2 := client(t, rs.Addr)
	testkit.Eventually(t, "write after recovery", func() bool {
		return rc2.Exists(ctx, a.tier.RedisKey(model, compat, []byte("after"))).Val() == 1
	})
}

// TestL3ThenL4: with L3 below, an L3 hit does not ask Redis; an L3 miss
// found in L4 is promoted into L3 and RAM.
func TestL3ThenL4(t *testing.T) {
	rs := redistest.Start(t)
	rc := client(t, rs.Addr)
	a, b := newHost(t, rs.URL(), true), newHost(t, rs.URL(), true)
	a.set(t, "shared", []byte("prefix kv"))
	ctx := context.Background()
	testkit.Eventually(t, "write-behind", func() bool { return rc.Exists(ctx, a.tier.RedisKey(model, compat, []byte("shared"))).Val() == 1 })
	if !a.ts.Exists(kvd.Composite(nil, model, compat, []byte("shared"))) {
		t.Fatal("not written to A's L3")
	}
	if v, ok := b.get("shared"); !ok || string(v) != "prefix kv" {
		t.Fatal("B did not read through L4")
	}
	testkit.Eventually(t, "promotion into B's L3", func() bool { return b.ts.Exists(kvd.Composite(nil, model, compat, []byte("shared"))) })
	if b.tier.Stats().Promotions != 1 {
		t.Fatalf("stats %+v", b.tier.Stats())
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open(Options{}); err == nil {
		t.Fatal("no URL accepted")
	}
	if _, err := Open(Options{URLs: []string{"http://x"}}); err == nil {
		t.Fatal("bad URL accepted")
	}
}

// TestCluster: a 3-node Redis cluster as L4; keys spread over the nodes
// and a second host reads every block back through the cluster.
func TestCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.URL()
	}
	mk := func() *host {
		tier, err := Open(Options{URLs: urls, Prefix: "c:", TTL: time.Hour, Timeout: time.Second, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		st, err := kvd.NewStore(kvd.StoreOptions{MaxBytes: 8 << 20, Long: tier, LongNotFound: ErrNotFound, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close(); tier.Close() })
		return &host{store: st, tier: tier}
	}
	a, b := mk(), mk()
	const n = 60
	for i := range n {
		a.set(t, "blk-"+strconv.Itoa(i), []byte("value-"+strconv.Itoa(i)))
	}
	testkit.Eventually(t, "write-behind to the cluster", func() bool { return a.tier.Stats().Writes == n })
	for i := range n {
		if v, ok := b.get("blk-" + strconv.Itoa(i)); !ok || string(v) != "value-"+strconv.Itoa(i) {
			t.Fatalf("block %d not read through the cluster", i)
		}
	}
	if s := b.tier.Stats(); s.Hits != n {
		t.Fatalf("stats %+v", s)
	}
	for _, nd := range nodes {
		if c := client(t, nd.Addr); c.DBSize(context.Background()).Val() == 0 {
			t.Errorf("node %s holds no keys", nd.Addr)
		}
	}
}
