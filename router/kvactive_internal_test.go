package router

import (
	"math/rand/v2"
	"testing"
)

// TestBlockCountsAgainstMap drives blockCounts and a Go map with the same
// requests starting (AddAll of a prompt: chains sharing random prefixes,
// blocks repeated, hash 0 among them) and ending (RemoveAll of one in
// flight, at random), down to one request in flight and none (the
// release that empties the table by Reset), and compares them after
// every step.
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
		var flight [][]uint64
		for step := range 6000 {
			if len(flight) == 0 || (rng.IntN(100) < 50 && len(flight) < 12) {
				hs := make([]uint64, rng.IntN(80))
				for i := range hs {
					hs[i] = keys[rng.IntN(universe)]
				}
				if len(flight) > 0 && len(hs) > 0 {
					copy(hs[:rng.IntN(len(hs))], flight[0]) // a shared prefix
				}
				b.AddAll(hs)
				for _, h := range hs {
					ref[h]++
				}
				flight = append(flight, hs)
			} else {
				i := rng.IntN(len(flight))
				hs := flight[i]
				flight = append(flight[:i], flight[i+1:]...)
				b.RemoveAll(hs)
				for _, h := range hs {
					if ref[h]--; ref[h] == 0 {
						delete(ref, h)
					}
				}
			}
			if b.Len() != len(ref) {
				t.Fatalf("universe %d step %d: Len %d, map %d", universe, step, b.Len(), len(ref))
			}
			if step%31 == 0 || len(flight) <= 1 {
				for _, k := range keys {
					if _, ok := ref[k]; b.Has(k) != ok {
						t.Fatalf("universe %d step %d: Has(%x) = %v, map %v", universe, step, k, b.Has(k), ok)
					}
				}
			}
		}
		// Drain: everything removed leaves an empty table.
		for _, hs := range flight {
			b.RemoveAll(hs)
		}
		if b.Len() != 0 || b.held != 0 {
			t.Fatalf("universe %d: %d left (held %d) after removing everything", universe, b.Len(), b.held)
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
		b.AddAll(hs)
		b.AddAll(hs[:100])
		b.RemoveAll(hs)
		b.RemoveAll(hs[:100])
	}
	run()
	if n := testing.AllocsPerRun(20, run); n != 0 {
		t.Fatalf("%.1f allocs per run, want 0", n)
	}
}
