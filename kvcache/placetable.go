package kvcache

import "math/bits"

// placeTable is Placements' map from block hash to last placement time:
// open addressing with linear probing and backward-shift deletion (no
// tombstones), placed by a Fibonacci multiply of the hash, like the
// router's in-flight block counter. Every pick records its whole prompt
// (2,048 blocks at 32k tokens), one update and one ring-eviction lookup
// per block, and Go's map made that an eighth of a 512-worker pick. It
// grows like a map and never shrinks; Placements' lock guards it.
type placeTable struct {
	keys    []uint64 // 0: empty slot
	vals    []int64
	n       int   // keys held in keys
	zero    int64 // hash 0's value, which cannot live in keys
	hasZero bool
	shift   uint8 // 64 − log2(len(keys))
}

// placeTableMin is the first table's size.
const placeTableMin = 64

func (t *placeTable) len() int {
	if t.hasZero {
		return t.n + 1
	}
	return t.n
}

func (t *placeTable) home(h uint64) int {
	return int((h * 0x9e3779b97f4a7c15) >> t.shift)
}

// get returns h's value.
func (t *placeTable) get(h uint64) (int64, bool) {
	if h == 0 {
		return t.zero, t.hasZero
	}
	if t.n == 0 {
		return 0, false
	}
	mask := len(t.keys) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case h:
			return t.vals[i], true
		case 0:
			return 0, false
		}
	}
}

// set makes v h's value.
func (t *placeTable) set(h uint64, v int64) {
	if h == 0 {
		t.zero, t.hasZero = v, true
		return
	}
	if 4*(t.n+1) > 3*len(t.keys) {
		t.grow()
	}
	mask := len(t.keys) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case h:
			t.vals[i] = v
			return
		case 0:
			t.keys[i], t.vals[i] = h, v
			t.n++
			return
		}
	}
}

// deleteIf drops h if its value is v.
func (t *placeTable) deleteIf(h uint64, v int64) {
	if h == 0 {
		if t.hasZero && t.zero == v {
			t.zero, t.hasZero = 0, false
		}
		return
	}
	if t.n == 0 {
		return
	}
	mask := len(t.keys) - 1
	i := t.home(h)
	for ; t.keys[i] != h; i = (i + 1) & mask {
		if t.keys[i] == 0 {
			return
		}
	}
	if t.vals[i] != v {
		return
	}
	// Backward shift: move later entries of the probe run into the hole
	// unless their home lies cyclically in (hole, their slot].
	t.n--
	for j := i; ; {
		j = (j + 1) & mask
		k := t.keys[j]
		if k == 0 {
			break
		}
		if home := t.home(k); (j-home)&mask < (j-i)&mask {
			continue // home is after the hole: the entry stays
		}
		t.keys[i], t.vals[i] = k, t.vals[j]
		i = j
	}
	t.keys[i], t.vals[i] = 0, 0
}

// reset drops every key, keeping the table's size.
func (t *placeTable) reset() {
	clear(t.keys)
	clear(t.vals)
	t.n, t.zero, t.hasZero = 0, 0, false
}

// grow doubles the table (or makes the first one) and re-inserts.
func (t *placeTable) grow() {
	size := max(placeTableMin, 2*len(t.keys))
	keys, vals := t.keys, t.vals
	t.keys, t.vals = make([]uint64, size), make([]int64, size)
	t.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	mask := size - 1
	for k, h := range keys {
		if h == 0 {
			continue
		}
		i := t.home(h)
		for t.keys[i] != 0 {
			i = (i + 1) & mask
		}
		t.keys[i], t.vals[i] = h, vals[k]
	}
}
