package kvd

import (
	"bytes"
	"testing"
)

func setMany(s *Store, ret string, kv ...[]byte) (bool, string) {
	return s.SetMany(&SetManyArgs{Model: []byte(ns.Model), CompatKey: []byte(ns.CompatKey), Pairs: kv, Retention: []byte(ret)})
}

func valueOf(t *testing.T, s *Store, k []byte) []byte {
	t.Helper()
	h := s.Get([]byte(ns.Model), []byte(ns.CompatKey), k, nil)
	if !h.Found {
		return nil
	}
	v, ok := s.AppendHit(nil, h)
	if !ok {
		t.Fatal("torn read")
	}
	return v
}

// TestSetManyAllOrNothing: when one pair cannot be stored, none is — not
// the ones before it — and the slots taken for them are free again.
func TestSetManyAllOrNothing(t *testing.T) {
	const n = 1008 // slot = 1024 with its header
	t.Run("arena-room", func(t *testing.T) {
		s := newTestStore(t, 8*1024, 8*1024, nil, nil)
		for k := 1; k <= 7; k++ {
			if ok, reason := set(s, k, n, "long"); !ok {
				t.Fatal(reason)
			}
		}
		free := s.Counters().FreeSlots
		// One slot is free: the first pair would fit, the second not.
		if ok, reason := setMany(s, "short", key(30), value(30, n), key(31), value(31, n)); ok || reason != ReasonDisplaceHigher {
			t.Fatalf("MSET over the room: %v %q", ok, reason)
		}
		if has(s, 30) || has(s, 31) {
			t.Fatal("a pair of a refused MSET was stored")
		}
		if got := s.Counters().FreeSlots; got != free {
			t.Fatalf("free slots %d after a refused MSET, want %d", got, free)
		}
		for k := 1; k <= 7; k++ {
			if !bytes.Equal(valueOf(t, s, key(k)), value(k, n)) {
				t.Fatalf("key %d changed", k)
			}
		}
		// What fits is stored.
		if ok, reason := setMany(s, "short", key(30), value(30, n)); !ok {
			t.Fatal(reason)
		}
		if !bytes.Equal(valueOf(t, s, key(30)), value(30, n)) {
			t.Fatal("stored value differs")
		}
	})
	t.Run("downgrade", func(t *testing.T) {
		s := newTestStore(t, 64*1024, 64*1024, nil, nil)
		set(s, 1, 100, "long")
		if ok, reason := setMany(s, "short", key(2), value(2, 100), key(1), value(9, 100)); ok || reason != ReasonDowngrade {
			t.Fatalf("MSET over a long key: %v %q", ok, reason)
		}
		if has(s, 2) || !bytes.Equal(valueOf(t, s, key(1)), value(1, 100)) {
			t.Fatal("a refused MSET changed the store")
		}
		if ok, reason := setMany(s, "short", key(3), value(3, 100), nil, value(4, 100)); ok || reason != ReasonEmptyKey || has(s, 3) {
			t.Fatalf("MSET with an empty key: %v %q", ok, reason)
		}
	})
	t.Run("inline-room", func(t *testing.T) {
		s := newTestStore(t, 0, 3*n, nil, nil)
		if ok, reason := setMany(s, "short", key(1), value(1, n), key(2), value(2, n), key(3), value(3, n)); !ok {
			t.Fatal(reason)
		}
		if ok, reason := setMany(s, "short", key(4), value(4, n), key(5), value(5, n), key(6), value(6, n), key(7), value(7, n)); ok || reason != ReasonDisplaceHigher {
			t.Fatalf("MSET over the inline budget: %v %q", ok, reason)
		}
		for k := 4; k <= 7; k++ {
			if has(s, k) {
				t.Fatalf("key %d of a refused MSET stored", k)
			}
		}
		if ok, reason := setMany(s, "short", key(8), value(8, 4*n)); ok || reason != ReasonLargerThanStore {
			t.Fatalf("MSET of a value over the store: %v %q", ok, reason)
		}
	})
}

// TestSetManyStores: every pair lands, large values included (copied
// without the mutex), a repeated key keeps its last value, and an
// overwrite replaces the old value.
func TestSetManyStores(t *testing.T) {
	s := newTestStore(t, 4<<20, 4<<20, nil, nil)
	big := bytes.Repeat([]byte("b"), 100<<10)
	set(s, 1, 10, "short")
	if ok, reason := setMany(s, "short", key(1), big, key(2), value(2, 10), key(2), value(3, 20), key(4), value(4, 200<<10)); !ok {
		t.Fatal(reason)
	}
	if !bytes.Equal(valueOf(t, s, key(1)), big) || !bytes.Equal(valueOf(t, s, key(2)), value(3, 20)) ||
		!bytes.Equal(valueOf(t, s, key(4)), value(4, 200<<10)) {
		t.Fatal("stored values differ")
	}
	if c := s.Counters(); c.Entries != 3 || c.HostBytes != int64(len(big)+20+200<<10) {
		t.Fatalf("entries %d, bytes %d", c.Entries, c.HostBytes)
	}
}
