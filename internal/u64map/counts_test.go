package u64map

import (
	"math/rand/v2"
	"testing"
)

// TestCountsAgainstGoMap: AddCounts and RemoveCounts of random batches
// (keys from sets small and large, repeated within a batch, key 0 and keys
// never added among the removals) against a Go map of counts, with the
// count of held keys RemoveCounts reports; the table grows from empty.
func TestCountsAgainstGoMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, universe := range []int{3, 50, 700, 5000} {
		var m Map[int32]
		ref := map[uint64]int32{}
		keys := make([]uint64, universe)
		for i := range keys {
			keys[i] = rng.Uint64()
		}
		keys[0] = 0
		batch := make([]uint64, 0, 64)
		for step := range 4000 {
			batch = batch[:0]
			for range rng.IntN(64) {
				batch = append(batch, keys[rng.IntN(universe)])
			}
			if rng.IntN(100) < 55 {
				AddCounts(&m, batch)
				for _, k := range batch {
					ref[k]++
				}
			} else {
				want := 0
				for _, k := range batch {
					if ref[k] > 0 {
						want++
						ref[k]--
					}
					if ref[k] == 0 {
						delete(ref, k)
					}
				}
				if got := RemoveCounts(&m, batch); got != want {
					t.Fatalf("universe %d step %d: RemoveCounts held %d, want %d", universe, step, got, want)
				}
			}
			if m.Len() != len(ref) {
				t.Fatalf("universe %d step %d: Len %d, map %d", universe, step, m.Len(), len(ref))
			}
			if step%37 == 0 {
				for _, k := range keys {
					v, ok := m.Get(k)
					if rv, rok := ref[k]; ok != rok || v != rv {
						t.Fatalf("universe %d step %d: Get(%x) = %d %v, map %d %v", universe, step, k, v, ok, rv, rok)
					}
				}
			}
		}
	}
}
