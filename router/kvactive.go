package router

import "math/bits"

// blockCounts is a target's in-flight prompt blocks: block hash → the
// requests holding it. Every pick adds its prompt's blocks and every
// release removes them, so a 32k-token prompt is 2,048 increments and
// 2,048 decrements (issue 37's scale point, 512 workers, pick p99 ≤ 1 ms);
// with Go's map those were a quarter of the pick. This is an open-addressing
// table with linear probing and backward-shift deletion (no tombstones, so
// a long-running target's probes stay short), placed by a Fibonacci
// multiply of the hash. It grows like a map and never shrinks; it is not
// safe for concurrent use (kvTarget.mu guards it).
type blockCounts struct {
	keys  []uint64 // 0: empty slot
	vals  []int32
	n     int   // distinct keys in keys
	zero  int32 // the count of hash 0, which cannot live in keys
	shift uint8 // 64 − log2(len(keys))
}

// blockCountsMin is the first table's size.
const blockCountsMin = 64

// Len is the number of distinct blocks held.
func (b *blockCounts) Len() int {
	if b.zero > 0 {
		return b.n + 1
	}
	return b.n
}

// Has reports whether block h is held.
func (b *blockCounts) Has(h uint64) bool {
	if h == 0 {
		return b.zero > 0
	}
	if b.n == 0 {
		return false
	}
	mask := len(b.keys) - 1
	for i := b.home(h); ; i = (i + 1) & mask {
		switch b.keys[i] {
		case h:
			return true
		case 0:
			return false
		}
	}
}

// Add counts one more request holding block h.
func (b *blockCounts) Add(h uint64) {
	if h == 0 {
		b.zero++
		return
	}
	if 4*(b.n+1) > 3*len(b.keys) {
		b.grow()
	}
	mask := len(b.keys) - 1
	for i := b.home(h); ; i = (i + 1) & mask {
		switch b.keys[i] {
		case h:
			b.vals[i]++
			return
		case 0:
			b.keys[i], b.vals[i] = h, 1
			b.n++
			return
		}
	}
}

// Remove counts one request fewer holding block h (a block not held is
// ignored).
func (b *blockCounts) Remove(h uint64) {
	if h == 0 {
		b.zero = max(0, b.zero-1)
		return
	}
	if b.n == 0 {
		return
	}
	mask := len(b.keys) - 1
	i := b.home(h)
	for ; b.keys[i] != h; i = (i + 1) & mask {
		if b.keys[i] == 0 {
			return
		}
	}
	if b.vals[i] > 1 {
		b.vals[i]--
		return
	}
	// Backward shift: move later entries of the probe run into the hole
	// unless their home lies cyclically in (hole, their slot].
	b.n--
	for j := i; ; {
		j = (j + 1) & mask
		k := b.keys[j]
		if k == 0 {
			break
		}
		if home := b.home(k); (j-home)&mask < (j-i)&mask {
			continue // home is after the hole: the entry stays
		}
		b.keys[i], b.vals[i] = k, b.vals[j]
		i = j
	}
	b.keys[i], b.vals[i] = 0, 0
}

func (b *blockCounts) home(h uint64) int {
	return int((h * 0x9e3779b97f4a7c15) >> b.shift)
}

// grow doubles the table (or makes the first one) and re-inserts.
func (b *blockCounts) grow() {
	size := max(blockCountsMin, 2*len(b.keys))
	keys, vals := b.keys, b.vals
	b.keys, b.vals = make([]uint64, size), make([]int32, size)
	b.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	mask := size - 1
	for k, h := range keys {
		if h == 0 {
			continue
		}
		i := b.home(h)
		for b.keys[i] != 0 {
			i = (i + 1) & mask
		}
		b.keys[i], b.vals[i] = h, vals[k]
	}
}
