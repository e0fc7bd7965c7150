package u64map

import (
	"math/rand/v2"
	"testing"
)

// check compares m with ref on every key of keys.
func check(t *testing.T, m *Map[int64], ref map[uint64]int64, keys []uint64, what string) {
	t.Helper()
	if m.Len() != len(ref) {
		t.Fatalf("%s: Len %d, map %d", what, m.Len(), len(ref))
	}
	for _, k := range keys {
		v, ok := m.Get(k)
		rv, rok := ref[k]
		if ok != rok || v != rv {
			t.Fatalf("%s: Get(%x) = %d %v, map %d %v", what, k, v, ok, rv, rok)
		}
	}
}

// apply runs one operation on m and ref: op picks Set, Ref+increment,
// Delete or a delete by slot when the value matches.
func apply(t *testing.T, m *Map[int64], ref map[uint64]int64, op byte, k uint64, v int64) {
	t.Helper()
	switch op % 4 {
	case 0:
		m.Set(k, v)
		ref[k] = v
	case 1:
		p, added := m.Ref(k)
		if _, held := ref[k]; added == held {
			t.Fatalf("Ref(%x) added = %v, but the map held it: %v", k, added, held)
		}
		*p++
		ref[k]++
	case 2:
		m.Delete(k)
		delete(ref, k)
	case 3:
		if i, ok := m.Find(k); ok && *m.At(i) == v {
			m.DeleteSlot(i)
		}
		if rv, ok := ref[k]; ok && rv == v {
			delete(ref, k)
		}
	}
}

// TestMapAgainstGoMap drives Map and a Go map with the same random
// operations (keys from sets small and large, so that probe runs collide,
// wrap and shift; key 0 included) and compares them as it goes.
func TestMapAgainstGoMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, universe := range []int{3, 50, 700, 5000} {
		var m Map[int64]
		ref := map[uint64]int64{}
		keys := make([]uint64, universe)
		for i := range keys {
			keys[i] = rng.Uint64()
		}
		keys[0] = 0
		for step := range 40000 {
			op := byte(rng.IntN(7)) // Set and Ref twice as often: tables fill
			if op >= 4 {
				op -= 4
			}
			apply(t, &m, ref, op, keys[rng.IntN(universe)], int64(rng.IntN(3)))
			if step%97 == 0 {
				check(t, &m, ref, keys, "step")
			}
		}
		check(t, &m, ref, keys, "end")
		for k := range ref {
			m.Delete(k)
		}
		clear(ref)
		check(t, &m, ref, keys, "drained")
		m.Set(keys[1], 5)
		m.Set(0, 6)
		m.Reset()
		check(t, &m, ref, keys, "reset")
	}
}

// FuzzMap: any sequence of operations (a byte for the op, a byte for the
// key out of 256, enough to grow the table and collide in it; a byte for
// the value) leaves Map equal to a Go map.
func FuzzMap(f *testing.F) {
	f.Add([]byte{0, 1, 2, 1, 1, 0, 2, 1, 0, 3, 0, 2})
	f.Add([]byte{0, 0, 1, 1, 0, 0, 3, 0, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		rng := rand.New(rand.NewPCG(1, 2))
		keys := make([]uint64, 256)
		for i := range keys {
			keys[i] = rng.Uint64()
		}
		keys[0] = 0
		var m Map[int64]
		ref := map[uint64]int64{}
		for len(ops) >= 3 {
			apply(t, &m, ref, ops[0], keys[ops[1]], int64(ops[2]%4))
			ops = ops[3:]
		}
		check(t, &m, ref, keys, "after the ops")
	})
}

func TestMapAllocs(t *testing.T) {
	var m Map[int32]
	hs := make([]uint64, 2048)
	for i := range hs {
		hs[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	run := func() {
		for _, h := range hs {
			p, _ := m.Ref(h)
			*p++
		}
		for _, h := range hs {
			m.Delete(h)
		}
	}
	run()
	if n := testing.AllocsPerRun(20, run); n != 0 {
		t.Fatalf("%.1f allocs per run, want 0", n)
	}
}
