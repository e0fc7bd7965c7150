package router

import "github.com/infera/infera/internal/u64map"

// blockCounts is a target's in-flight prompt blocks: block hash → the
// requests holding it. Every pick adds its prompt's blocks and every
// release removes them, so a 32k-token prompt is 2,048 increments and
// 2,048 decrements (issue 37's scale point, 512 workers, pick p99 ≤ 1 ms);
// with Go's map those were a quarter of the pick, hence u64map's
// open-addressing table, a prompt's blocks a call. It is not safe for
// concurrent use (kvTarget.mu guards it).
type blockCounts struct {
	m u64map.Map[int32]
	// held is the sum of the counts: the blocks of every request in
	// flight, so a release whose blocks are all of them (the target's one
	// request in flight) empties the table with one Reset instead of a
	// delete a block.
	held int
}

// Len is the number of distinct blocks held.
func (b *blockCounts) Len() int { return b.m.Len() }

// Has reports whether block h is held.
func (b *blockCounts) Has(h uint64) bool {
	_, ok := b.m.Find(h)
	return ok
}

// AddAll counts one more request holding each of hs.
func (b *blockCounts) AddAll(hs []uint64) {
	u64map.AddCounts(&b.m, hs)
	b.held += len(hs)
}

// RemoveAll undoes an AddAll(hs) not undone yet: one request fewer holds
// each of hs.
func (b *blockCounts) RemoveAll(hs []uint64) {
	if b.held == len(hs) {
		// hs's counts are all there are (the target's one request in
		// flight): removing them leaves nothing.
		b.m.Reset()
		b.held = 0
		return
	}
	b.held -= u64map.RemoveCounts(&b.m, hs)
}
