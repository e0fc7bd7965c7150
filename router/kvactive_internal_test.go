package router

import (
	"math/rand/v2"
	"testing"
)

// TestBlockCountsAgainstMap drives blockCounts and a Go map with the same
// random adds and removes (keys from sets small and large, tables kept
// up to 3/4 full, so that probe runs collide, wrap and shift; hash 0
// included) and compares them after every
// step.
func TestBlockCountsAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, universe := range []int{3, 50, 700, 5000} {
		var b blockCounts
		ref := map[uint64]int32{}
		keys := make([]uint64, universe)
		for i := range keys {
			keys[i] = rng.Uint64()
		}
		keys[0] = 0
		for step := range 40000 {
			h := keys[rng.IntN(universe)]
			if rng.IntN(100) < 55 || step < universe {
				b.Add(h)
				ref[h]++
			} else {
				b.Remove(h)
				if ref[h] > 1 {
					ref[h]--
				} else {
					delete(ref, h)
				}
			}
			if b.Len() != len(ref) {
				t.Fatalf("universe %d step %d: Len %d, map %d", universe, step, b.Len(), len(ref))
			}
			if step%97 == 0 {
				for _, k := range keys {
					if _, ok := ref[k]; b.Has(k) != ok {
						t.Fatalf("universe %d step %d: Has(%x) = %v, map %v", universe, step, k, b.Has(k), ok)
					}
				}
			}
		}
		// Drain: everything removed leaves an empty table.
		for k, n := range ref {
			for range n {
				b.Remove(k)
			}
		}
		if b.Len() != 0 {
			t.Fatalf("universe %d: %d left after removing everything", universe, b.Len())
		}
		for _, k := range keys {
			if b.Has(k) {
				t.Fatalf("universe %d: %x still held", universe, k)
			}
		}
	}
}

func TestBlockCountsAllocs(t *testing.T) {
	var b blockCounts
	hs := make([]uint64, 2048)
	for i := range hs {
		hs[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	run := func() {
		for _, h := range hs {
			b.Add(h)
		}
		for _, h := range hs {
			b.Remove(h)
		}
	}
	run()
	if n := testing.AllocsPerRun(20, run); n != 0 {
		t.Fatalf("%.1f allocs per run, want 0", n)
	}
}
