package router

import "github.com/infera/infera/internal/u64map"

// blockCounts is a target's in-flight prompt blocks: block hash → the
// requests holding it. Every pick adds its prompt's blocks and every
// release removes them, so a 32k-token prompt is 2,048 increments and
// 2,048 decrements (issue 37's scale point, 512 workers, pick p99 ≤ 1 ms);
// with Go's map those were a quarter of the pick, hence u64map's
// open-addressing table. It is not safe for concurrent use (kvTarget.mu
// guards it).
type blockCounts struct {
	m u64map.Map[int32]
}

// Len is the number of distinct blocks held.
func (b *blockCounts) Len() int { return b.m.Len() }

// Has reports whether block h is held.
func (b *blockCounts) Has(h uint64) bool {
	_, ok := b.m.Find(h)
	return ok
}

// Add counts one more request holding block h.
func (b *blockCounts) Add(h uint64) {
	n, _ := b.m.Ref(h)
	*n++
}

// Remove counts one request fewer holding block h (a block not held is
// ignored).
func (b *blockCounts) Remove(h uint64) {
	i, ok := b.m.Find(h)
	if !ok {
		return
	}
	if n := b.m.At(i); *n > 1 {
		*n--
		return
	}
	b.m.DeleteSlot(i)
}
