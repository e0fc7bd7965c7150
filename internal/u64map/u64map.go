package u64map

import "math/bits"

// Map maps uint64 keys (block hashes, already well mixed) to V: open
// addressing with linear probing and backward-shift deletion (no
// tombstones, so a long-lived table's probes stay short), placed by a
// Fibonacci multiply of the key. It grows like a Go map, at 3/4 full,
// and never shrinks. The zero Map is empty and ready; no operation but a
// growing insert allocates.
type Map[V any] struct {
	keys    []uint64 // 0: empty slot
	vals    []V
	n       int // keys held in keys
	zero    V   // key 0's value, which cannot live in keys
	hasZero bool
	shift   uint8 // 64 − log2(len(keys))
}

// minSize is the first table's size.
const minSize = 64

// ZeroSlot is the slot Find returns for key 0, which lives beside the table.
const ZeroSlot = -1

// Len is the number of keys held.
func (m *Map[V]) Len() int {
	if m.hasZero {
		return m.n + 1
	}
	return m.n
}

// fib is 2^64 / φ, the Fibonacci multiplier that places a key.
const fib = 0x9e3779b97f4a7c15

func (m *Map[V]) home(k uint64) int {
	return int((k * fib) >> m.shift)
}

// Find returns k's slot (for At and DeleteSlot) and whether k is held.
func (m *Map[V]) Find(k uint64) (slot int, ok bool) {
	if k == 0 {
		return ZeroSlot, m.hasZero
	}
	if m.n == 0 {
		return 0, false
	}
	mask := len(m.keys) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		switch m.keys[i] {
		case k:
			return i, true
		case 0:
			return 0, false
		}
	}
}

// Get returns k's value and whether k is held.
func (m *Map[V]) Get(k uint64) (V, bool) {
	i, ok := m.Find(k)
	if !ok {
		var zero V
		return zero, false
	}
	return *m.At(i), true
}

// At returns the value in a slot Find reported held (or Ref filled); it is
// valid until the next insert or delete.
func (m *Map[V]) At(slot int) *V {
	if slot == ZeroSlot {
		return &m.zero
	}
	return &m.vals[slot]
}

// Ref returns k's value, inserting k with V's zero value when it is not
// held (added reports that); the pointer is valid until the next insert
// or delete.
func (m *Map[V]) Ref(k uint64) (v *V, added bool) {
	if k == 0 {
		added = !m.hasZero
		m.hasZero = true
		return &m.zero, added
	}
	if 4*(m.n+1) > 3*len(m.keys) {
		m.grow()
	}
	mask := len(m.keys) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		switch m.keys[i] {
		case k:
			return &m.vals[i], false
		case 0:
			m.keys[i] = k
			m.n++
			return &m.vals[i], true
		}
	}
}

// Set makes v k's value.
func (m *Map[V]) Set(k uint64, v V) {
	p, _ := m.Ref(k)
	*p = v
}

// DeleteSlot drops the key in a slot Find reported held.
func (m *Map[V]) DeleteSlot(slot int) {
	var zero V
	if slot == ZeroSlot {
		m.zero, m.hasZero = zero, false
		return
	}
	// Backward shift: move later entries of the probe run into the hole
	// unless their home lies cyclically in (hole, their slot].
	m.n--
	mask := len(m.keys) - 1
	i := slot
	for j := i; ; {
		j = (j + 1) & mask
		k := m.keys[j]
		if k == 0 {
			break
		}
		if home := m.home(k); (j-home)&mask < (j-i)&mask {
			continue // home is after the hole: the entry stays
		}
		m.keys[i], m.vals[i] = k, m.vals[j]
		i = j
	}
	m.keys[i], m.vals[i] = 0, zero
}

// Delete drops k (a key not held is ignored).
func (m *Map[V]) Delete(k uint64) {
	if i, ok := m.Find(k); ok {
		m.DeleteSlot(i)
	}
}

// Reset drops every key, keeping the table's size.
func (m *Map[V]) Reset() {
	clear(m.keys)
	clear(m.vals)
	var zero V
	m.n, m.zero, m.hasZero = 0, zero, false
}

// grow doubles the table (or makes the first one) and re-inserts.
func (m *Map[V]) grow() {
	size := max(minSize, 2*len(m.keys))
	keys, vals := m.keys, m.vals
	m.keys, m.vals = make([]uint64, size), make([]V, size)
	m.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	mask := size - 1
	for s, k := range keys {
		if k == 0 {
			continue
		}
		i := m.home(k)
		for m.keys[i] != 0 {
			i = (i + 1) & mask
		}
		m.keys[i], m.vals[i] = k, vals[s]
	}
}
