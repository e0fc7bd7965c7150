package kvd

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd/tablespace"
)

func newTestStore(t *testing.T, arenaBytes, maxBytes int64, long LongStore, now func() time.Time) *Store {
	t.Helper()
	o := StoreOptions{MaxBytes: maxBytes, Long: long, LongNotFound: tablespace.ErrNotFound, Now: now, Log: zerolog.Nop()}
	if arenaBytes > 0 {
		a, _, err := OpenArena(arenaBytes, false, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		o.Arena = a
	}
	s, err := NewStore(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func set(s *Store, k int, n int, ret string) (bool, string) {
	return s.Set(&SetArgs{Model: []byte(ns.Model), CompatKey: []byte(ns.CompatKey), Key: key(k), Value: value(k, n), Retention: []byte(ret)})
}

func has(s *Store, k int) bool {
	return s.Exists([]byte(ns.Model), []byte(ns.CompatKey), key(k), nil)
}

// TestRetentionUnderPressure (acceptance 4): with RAM full, none and
// ephemeral entries are evicted before short ones, short before long, LRU
// within a class; a lower class never displaces a higher one. Both the
// arena and the inline tier obey it.
func TestRetentionUnderPressure(t *testing.T) {
	for _, tier := range []string{"arena", "inline"} {
		t.Run(tier, func(t *testing.T) {
			const n = 1008 // slot = 1024 with its header
			var s *Store
			if tier == "arena" {
				s = newTestStore(t, 8*1024, 8*1024, nil, nil)
			} else {
				s = newTestStore(t, 0, 8*n, nil, nil)
			}
			// 1,2 none; 3,4 ephemeral; 5,6 short; 7,8 long.
			for i, r := range []string{"none", "none", "ephemeral", "ephemeral", "short", "short", "long", "long"} {
				if ok, reason := set(s, i+1, n, r); !ok {
					t.Fatalf("fill %d: %s", i+1, reason)
				}
			}
			present := func(want ...int) {
				t.Helper()
				var got []int
				for k := 1; k <= 20; k++ {
					if has(s, k) {
						got = append(got, k)
					}
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("present %v, want %v", got, want)
				}
			}
			set(s, 11, n, "short")
			present(2, 3, 4, 5, 6, 7, 8, 11) // none first, oldest first
			set(s, 12, n, "short")
			present(3, 4, 5, 6, 7, 8, 11, 12)
			set(s, 13, n, "short")
			set(s, 14, n, "short")
			present(5, 6, 7, 8, 11, 12, 13, 14) // then ephemeral
			// A get refreshes 5, so 6 is the least recently used short.
			s.Get([]byte(ns.Model), []byte(ns.CompatKey), key(5), nil)
			set(s, 15, n, "short")
			present(5, 7, 8, 11, 12, 13, 14, 15)
			// none and ephemeral cannot displace short or long.
			if ok, reason := set(s, 16, n, "ephemeral"); ok || reason != ReasonDisplaceHigher {
				t.Fatalf("ephemeral displaced a higher class: %v %q", ok, reason)
			}
			// long displaces short before any long.
			for k := 17; k <= 22; k++ {
				if ok, reason := set(s, k, n, "long"); !ok {
					t.Fatalf("long %d: %s", k, reason)
				}
			}
			var got []int
			for k := 1; k <= 30; k++ {
				if has(s, k) {
					got = append(got, k)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint([]int{7, 8, 17, 18, 19, 20, 21, 22}) {
				t.Fatalf("after long writes present %v", got)
			}
			if ok, reason := set(s, 23, n, "short"); ok || reason != ReasonDisplaceHigher {
				t.Fatalf("short displaced long: %v %q", ok, reason)
			}
			c := s.Counters()
			if c.EvictionsByRetention[RetentionNone] != 2 || c.EvictionsByRetention[RetentionEphemeral] != 2 ||
				c.EvictionsByRetention[RetentionShort] != 7 || c.EvictionsByRetention[RetentionLong] != 0 {
				t.Fatalf("evictions by retention %v", c.EvictionsByRetention)
			}
		})
	}
}

// TestReserveEvictsLowestClass: a lease has no retention yet, so it takes
// the least valuable slot.
func TestReserveEvictsLowestClass(t *testing.T) {
	s := newTestStore(t, 4*1024, 4*1024, nil, nil)
	for i, r := range []string{"long", "short", "none", "ephemeral"} {
		set(s, i+1, 1008, r)
	}
	if tok, _, _, _, reason := s.Reserve(1000, 1); tok == 0 {
		t.Fatal(reason)
	}
	if has(s, 3) || !has(s, 1) || !has(s, 2) || !has(s, 4) {
		t.Fatal("reserve did not evict the none entry")
	}
}

func TestRetentionDowngradeRefused(t *testing.T) {
	s := newTestStore(t, 64*1024, 64*1024, nil, nil)
	if ok, _ := set(s, 1, 100, "long"); !ok {
		t.Fatal("set")
	}
	if ok, reason := set(s, 1, 100, "short"); ok || reason != ReasonDowngrade {
		t.Fatalf("downgrade: %v %q", ok, reason)
	}
	if ok, _ := set(s, 1, 100, "long"); !ok {
		t.Fatal("same retention overwrite refused")
	}
	if ok, reason := set(s, 1, 100, "forever"); ok || reason != ReasonBadRetention {
		t.Fatalf("bad retention: %v %q", ok, reason)
	}
	tok, _, _, _, _ := s.Reserve(100, 7)
	ok, reason := s.Commit(&CommitArgs{Token: tok, Conn: 7, Model: []byte(ns.Model), CompatKey: []byte(ns.CompatKey), Key: key(1), Length: 100, Retention: []byte("default")})
	if ok || reason != ReasonDowngrade {
		t.Fatalf("commit downgrade: %v %q", ok, reason)
	}
	if c := s.Counters(); c.LeasesActive != 0 || c.FreeSlots != c.NumSlots-1 {
		t.Fatalf("refused commit kept its slot: %+v", c)
	}
	tok, _, _, _, _ = s.Reserve(100, 7)
	if ok, reason := s.Commit(&CommitArgs{Token: tok, Conn: 7, Key: key(2), Length: 10, Retention: []byte("sometimes")}); ok || reason != ReasonBadRetention {
		t.Fatalf("commit bad retention: %v %q", ok, reason)
	}
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestTTL(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	s := newTestStore(t, 64*1024, 64*1024, nil, clk.now)
	m, ck := []byte(ns.Model), []byte(ns.CompatKey)
	s.Set(&SetArgs{Model: m, CompatKey: ck, Key: key(1), Value: value(1, 10), TTL: 2, HasTTL: true})
	s.Set(&SetArgs{Model: m, CompatKey: ck, Key: key(2), Value: value(2, 10)})
	if ok, _ := s.Set(&SetArgs{Model: m, CompatKey: ck, Key: key(3), Value: value(3, 10), TTL: 0, HasTTL: true}); !ok {
		t.Fatal("ttl 0 not acked")
	}
	if has(s, 3) {
		t.Fatal("ttl 0 stored")
	}
	clk.advance(1999 * time.Millisecond)
	if !has(s, 1) {
		t.Fatal("expired early")
	}
	clk.advance(time.Millisecond)
	if has(s, 1) || !has(s, 2) {
		t.Fatal("ttl not applied")
	}
	if h := s.Get(m, ck, key(1), nil); h.Found {
		t.Fatal("expired entry served")
	}
	// Lease TTL is whole seconds.
	tok, _, _, _, _ := s.Reserve(10, 1)
	s.Commit(&CommitArgs{Token: tok, Conn: 1, Model: m, CompatKey: ck, Key: key(4), Length: 10, TTLSeconds: 5})
	clk.advance(5 * time.Second)
	if has(s, 4) {
		t.Fatal("commit ttl not applied")
	}
	if c := s.Counters(); c.Expired != 2 || c.Entries != 1 {
		t.Fatalf("counters %+v", c)
	}
}

func TestNamespaceClear(t *testing.T) {
	s := newTestStore(t, 64*1024, 64*1024, nil, nil)
	for i, n := range []string{"a", "a", "b"} {
		s.Set(&SetArgs{Model: []byte(n), Key: key(i), Value: value(i, 10)})
	}
	// A model that is a prefix of another must not match it.
	s.Set(&SetArgs{Model: []byte("ab"), Key: key(9), Value: value(9, 10)})
	if n := s.Clear([]byte("a"), nil); n != 2 {
		t.Fatalf("cleared %d", n)
	}
	if c := s.Counters(); c.Entries != 2 {
		t.Fatalf("entries %d", c.Entries)
	}
}

func TestLongWriteThroughPromotionPrefetch(t *testing.T) {
	long := newTablespace(t)
	d := startDaemon(t, daemonOpts{arenaBytes: 4 * 1024, long: long})
	c := dial(t, d, ClientOptions{SharedArena: true})
	v := value(1, 1000)
	if ok, reason, _ := c.Set(ns, key(1), v, SetOptions{Retention: "long"}); !ok {
		t.Fatal(reason)
	}
	c.Set(ns, key(2), value(2, 1000), SetOptions{Retention: "short"})
	testkit.Eventually(t, "write-through", func() bool { return d.store.Counters().LongWrites == 1 })
	if long.Len() != 1 {
		t.Fatalf("l3 holds %d entries; only long ones belong there", long.Len())
	}
	// Push the long entry out of RAM with more long entries, then read it
	// back from L3.
	for k := 10; k < 14; k++ {
		c.Set(ns, key(k), value(k, 1000), SetOptions{Retention: "long"})
	}
	testkit.Eventually(t, "write-through", func() bool { return d.store.Counters().LongWrites == 5 })
	if d.store.Counters().Entries != 4 {
		t.Fatal("arena not full")
	}
	if p, _ := c.Exists(ns, [][]byte{key(1), key(2)}, nil); !p[0] || p[1] {
		t.Fatalf("exists across tiers %v", p)
	}
	if d.store.Counters().LongHits != 0 {
		t.Fatal("exists promoted")
	}
	got, ret, ok, err := c.Get(ns, key(1), nil)
	if err != nil || !ok || !bytes.Equal(got, v) || ret != RetentionLong {
		t.Fatalf("l3 get: %v %q %v", ok, ret, err)
	}
	if cn := d.store.Counters(); cn.LongHits != 1 || cn.Entries != 4 {
		t.Fatalf("promotion: %+v", cn)
	}
	// Prefetch: key 10 was evicted by the promotion; hint it back.
	if d.store.Resident([]byte(ns.Model), []byte(ns.CompatKey), key(10)) {
		t.Fatal("key 10 still in RAM")
	}
	if err := c.PrefetchHint(ns, [][]byte{key(10), key(99)}, time.Minute); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "prefetch", func() bool { return d.store.Counters().PrefetchFetched == 1 })
	if cn := d.store.Counters(); cn.PrefetchHints != 1 || cn.PrefetchUseful != 0 {
		t.Fatalf("prefetch counters %+v", cn)
	}
	if _, _, ok, _ := c.Get(ns, key(10), nil); !ok {
		t.Fatal("prefetched key missing")
	}
	c.Get(ns, key(10), nil)
	if cn := d.store.Counters(); cn.PrefetchUseful != 1 {
		t.Fatalf("useful prefetches %d", cn.PrefetchUseful)
	}
	st, _ := c.Stats()
	if st.LongBytes != 5*1000 {
		t.Fatalf("long_bytes %d", st.LongBytes)
	}
	if n, _ := c.Clear(Namespace{}); n != 4 || long.Len() != 0 {
		t.Fatalf("clear all: %d, l3 %d", n, long.Len())
	}
}

func TestPrefetchQueueBounded(t *testing.T) {
	long := newTablespace(t)
	s := newTestStore(t, 64*1024, 64*1024, long, nil)
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = key(i)
	}
	s.Prefetch(nil, nil, keys, time.Second)
	c := s.Counters()
	if c.PrefetchDropped == 0 || c.PrefetchDropped > 1000-64 {
		t.Fatalf("dropped %d of 1000 with a 64-key queue", c.PrefetchDropped)
	}
}

func TestHugeTTLDoesNotOverflow(t *testing.T) {
	s := newTestStore(t, 64*1024, 64*1024, nil, nil)
	s.Set(&SetArgs{Key: key(1), Value: value(1, 10), TTL: 1e300, HasTTL: true})
	tok, _, _, _, _ := s.Reserve(10, 1)
	s.Commit(&CommitArgs{Token: tok, Conn: 1, Key: key(2), Length: 10, TTLSeconds: 1 << 62})
	if !s.Exists(nil, nil, key(1), nil) || !s.Exists(nil, nil, key(2), nil) {
		t.Fatal("an entry with a huge TTL expired at once")
	}
}

func TestFixedSlotBytes(t *testing.T) {
	a, _, err := OpenArena(64*1024, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	s, err := NewStore(StoreOptions{MaxBytes: 64 * 1024, Arena: a, SlotBytes: 4000, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.SlotSize() != 4032 {
		t.Fatalf("slot size %d", s.SlotSize())
	}
	// A small first value no longer shrinks the slots.
	set(s, 1, 10, "short")
	if ok, reason := set(s, 2, 4000, "short"); !ok {
		t.Fatal(reason)
	}
	if ok, _ := set(s, 3, 4017, "short"); ok {
		t.Fatal("a value larger than the fixed slot went into the arena")
	}
	if _, err := NewStore(StoreOptions{MaxBytes: 1 << 20, SlotBytes: 4000}); err == nil {
		t.Fatal("slot bytes without an arena accepted")
	}
}

// memLong is an in-memory L3 with prefix removal, standing in for an L3
// that implements LongPrefixDeleter (the tablespace does not yet).
type memLong struct {
	mu sync.Mutex
	m  map[string][]byte
}

func newMemLong() *memLong { return &memLong{m: map[string][]byte{}} }

func (l *memLong) Put(k, v []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[string(k)] = append([]byte(nil), v...)
	return nil
}

func (l *memLong) Get(k, dst []byte) ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.m[string(k)]
	if !ok {
		return dst[:0], tablespace.ErrNotFound
	}
	return append(dst[:0], v...), nil
}

func (l *memLong) Exists(k []byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.m[string(k)]
	return ok
}

func (l *memLong) Delete(k []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, string(k))
	return nil
}

func (l *memLong) Clear() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.m)
	return nil
}

func (l *memLong) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

func (l *memLong) UsedBytes() int64 { return 0 }
func (l *memLong) Close() error     { return nil }

func (l *memLong) DeletePrefix(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for k := range l.m {
		if strings.HasPrefix(k, string(p)) {
			delete(l.m, k)
			n++
		}
	}
	return n, nil
}

// TestNamespaceClearReachesL3: clear of one namespace drops its L3
// entries too (a later get must not promote them back), and no other
// namespace's, not even one whose model starts with the cleared one's.
// A namespace clear reaches L3 both over the in-memory L3 and over the real
// tablespace (which removes by prefix through its journal).
func TestNamespaceClearReachesL3(t *testing.T) {
	for _, tc := range []struct {
		name string
		long func(t *testing.T) lenLong
	}{
		{"memory", func(*testing.T) lenLong { return newMemLong() }},
		{"tablespace", func(t *testing.T) lenLong { return newTablespace(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			long := tc.long(t)
			d := startDaemon(t, daemonOpts{arenaBytes: 64 * 1024, long: long})
			c := dial(t, d, ClientOptions{SharedArena: true})
			a, ab := Namespace{Model: "a", CompatKey: "x"}, Namespace{Model: "ab", CompatKey: "x"}
			for i := range 4 {
				for _, n := range []Namespace{a, ab} {
					if ok, reason, err := c.Set(n, key(i), value(i, 100), SetOptions{Retention: "long"}); !ok || err != nil {
						t.Fatal(reason, err)
					}
				}
			}
			testkit.Eventually(t, "write-through", func() bool { return long.Len() == 8 })
			if n, err := c.Clear(a); err != nil || n != 4 {
				t.Fatalf("clear: %d %v", n, err)
			}
			if long.Len() != 4 {
				t.Fatalf("l3 holds %d entries after the clear, want the other namespace's 4", long.Len())
			}
			present, err := c.Exists(a, [][]byte{key(0), key(3)}, nil)
			if err != nil || present[0] || present[1] {
				t.Fatalf("cleared keys still exist: %v %v", present, err)
			}
			if _, _, ok, _ := c.Get(a, key(1), nil); ok {
				t.Fatal("a cleared key was served from l3")
			}
			for i := range 4 {
				if v, _, ok, _ := c.Get(ab, key(i), nil); !ok || !bytes.Equal(v, value(i, 100)) {
					t.Fatalf("other namespace's key %d lost", i)
				}
			}
			if _, err := c.Clear(Namespace{}); err != nil || long.Len() != 0 {
				t.Fatalf("clear all: l3 holds %d (%v)", long.Len(), err)
			}
		})
	}
}

// lenLong is an L3 whose entry count the test can read.
type lenLong interface {
	LongStore
	Len() int
}
