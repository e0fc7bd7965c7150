package kvd

import (
	"bytes"
	"testing"
)

// TestEverySizeSideBySide (issue 31): values of every size up to the
// largest slot live in one arena whatever size came first, each read back
// zero-copy from a slot whose header holds it.
func TestEverySizeSideBySide(t *testing.T) {
	s := newTestStore(t, 64<<20, 64<<20, nil, nil) // 4 MiB pages
	if s.MaxArenaValue() < 1<<20 {
		t.Fatalf("largest arena value %d", s.MaxArenaValue())
	}
	sizes := []int{3, 28, 4096, 256 << 10, 1 << 20, 64, 1008, 65536}
	for i, n := range sizes {
		if ok, reason := set(s, i+1, n, "short"); !ok {
			t.Fatalf("set %d bytes: %s", n, reason)
		}
	}
	for i, n := range sizes {
		h := s.Get([]byte(ns.Model), []byte(ns.CompatKey), key(i+1), nil)
		if !h.Found || !h.Arena || h.Length != n || h.SlotSize < n+HeaderBytes || h.SlotSize%SlotAlign != 0 || (h.Offset-HeaderBytes)%SlotAlign != 0 {
			t.Fatalf("%d bytes: %+v", n, h)
		}
		got, err := ReadSlot(s.arena.mem, h.Offset, h.Length, h.Version, nil)
		if err != nil || !bytes.Equal(got, value(i+1, n)) {
			t.Fatalf("%d bytes read back: %v", n, err)
		}
	}
	c := s.Counters()
	if len(c.Classes) < 5 || c.ArenaEntries != int64(len(sizes)) {
		t.Fatalf("classes %+v entries %d", c.Classes, c.ArenaEntries)
	}
	var used, bytesIn int64
	for _, cs := range c.Classes {
		used += cs.UsedSlots
		bytesIn += cs.ValueBytes
	}
	if used != int64(len(sizes)) || bytesIn != c.HostBytes {
		t.Fatalf("per-class use %d slots %d bytes, want %d and %d", used, bytesIn, len(sizes), c.HostBytes)
	}
	// Clearing returns every page.
	s.Clear(nil, nil)
	if c := s.Counters(); c.FreePages != c.Pages || len(c.Classes) != 0 {
		t.Fatalf("after clear: %+v", c)
	}
}

// TestEvictionAcrossClasses (issue 31): a class short of memory takes
// pages from another class by evicting entries of at most its own
// retention, lowest first; a long value is never evicted for an
// ephemeral one of another class, and a refusal says why.
func TestEvictionAcrossClasses(t *testing.T) {
	// 1 MiB arena: 16 pages of 64 KiB.
	s := newTestStore(t, 1<<20, 1<<20, nil, nil)
	const small, big = 4000, 60000 // 16 per page; 1 per page
	// Half the pages hold long small values, half ephemeral small ones.
	k := 1
	for range 8 * 16 {
		if ok, reason := set(s, k, small, "long"); !ok {
			t.Fatalf("long %d: %s", k, reason)
		}
		k++
	}
	for range 8 * 16 {
		if ok, reason := set(s, k, small, "ephemeral"); !ok {
			t.Fatalf("ephemeral %d: %s", k, reason)
		}
		k++
	}
	// Big ephemeral values take the ephemeral pages, never the long ones.
	for i := range 8 {
		if ok, reason := set(s, 1000+i, big, "ephemeral"); !ok {
			t.Fatalf("big ephemeral %d: %s", i, reason)
		}
	}
	for k := 1; k <= 8*16; k++ {
		if !has(s, k) {
			t.Fatalf("long value %d evicted for an ephemeral one", k)
		}
	}
	// Memory is exhausted by values of higher retention than none.
	if ok, reason := set(s, 2000, big, "none"); ok || reason != ReasonDisplaceHigher {
		t.Fatalf("a big none value: %v %q", ok, reason)
	}
	if ok, reason := set(s, 2001, small, "none"); ok || reason != ReasonDisplaceHigher {
		t.Fatalf("a small none value: %v %q", ok, reason)
	}
	// A long big value may displace ephemeral ones (of its own class now).
	if ok, reason := set(s, 3000, big, "long"); !ok {
		t.Fatal(reason)
	}
	c := s.Counters()
	if c.EvictionsByRetention[RetentionLong] != 0 || c.EvictionsByRetention[RetentionEphemeral] != 8*16+1 {
		t.Fatalf("evictions %+v", c.EvictionsByRetention)
	}
}

// TestLeasedPageNotReclaimed: a page with a lease is never taken by
// another class.
func TestLeasedPageNotReclaimed(t *testing.T) {
	s := newTestStore(t, 128<<10, 128<<10, nil, nil) // 2 pages of 64 KiB
	tok, _, _, _, reason := s.Reserve(60000, 1)
	if tok == 0 {
		t.Fatal(reason)
	}
	if ok, reason := set(s, 1, 100, "none"); !ok {
		t.Fatal(reason)
	}
	// The big value takes the small value's page, not the leased one.
	if ok, reason := set(s, 2, 60000, "long"); !ok || has(s, 1) {
		t.Fatalf("big set: %v %q", ok, reason)
	}
	if ok, reason := s.Commit(&CommitArgs{Token: tok, Conn: 1, Model: []byte(ns.Model), CompatKey: []byte(ns.CompatKey), Key: key(3), Length: 60000}); !ok {
		t.Fatal(reason)
	}
	if !has(s, 2) || !has(s, 3) {
		t.Fatal("lost an entry")
	}
	// Both pages now hold values of higher retention than none.
	if ok, reason := set(s, 4, 100, "none"); ok || reason != ReasonDisplaceHigher {
		t.Fatalf("none value over full arena: %v %q", ok, reason)
	}
}

// TestTwoBlockSizesShareOneKvd (issue 31, acceptance 1): two engines'
// clients whose KV blocks differ in size (16 KiB and 80 KiB, as two
// models on one host) share one kvd: whichever stores first, both keep
// storing zero-copy into the arena and read their own bytes back, single
// and batched.
func TestTwoBlockSizesShareOneKvd(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 16 << 20})
	type engine struct {
		c    *Client
		ns   Namespace
		size int
	}
	engines := []engine{
		{dial(t, d, ClientOptions{SharedArena: true}), Namespace{Model: "small-model", CompatKey: "tp0of1"}, 16 << 10},
		{dial(t, d, ClientOptions{SharedArena: true}), Namespace{Model: "big-model", CompatKey: "tp0of1"}, 80 << 10},
	}
	for round := range 2 {
		for _, e := range engines {
			var keys [][]byte
			for k := range 8 {
				kk := key(round*100 + k)
				keys = append(keys, kk)
				if ok, reason, err := e.c.Set(e.ns, kk, value(k, e.size), SetOptions{Retention: "long"}); !ok || err != nil {
					t.Fatalf("%s set: %q %v", e.ns.Model, reason, err)
				}
			}
			got, err := e.c.BatchGet(e.ns, keys)
			if err != nil {
				t.Fatal(err)
			}
			for k := range keys {
				if !bytes.Equal(got[k], value(k, e.size)) {
					t.Fatalf("%s batch value %d differs", e.ns.Model, k)
				}
			}
		}
	}
	for _, e := range engines {
		if v, _, ok, err := e.c.Get(e.ns, key(3), nil); !ok || err != nil || !bytes.Equal(v, value(3, e.size)) {
			t.Fatalf("%s get: %v %v", e.ns.Model, ok, err)
		}
	}
	if c := d.store.Counters(); c.InlineEntries != 0 || c.ArenaEntries != 32 || c.Evictions != 0 {
		t.Fatalf("counters %+v", c)
	}
}
