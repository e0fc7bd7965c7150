package u64map

// AddCounts counts one more of each key in a Map of counts (a key not held
// enters at 1): Ref and an increment a key, in one loop with the table in
// locals, for the router's in-flight blocks, a prompt's keys at a time.
// The table grows when Ref would.
func AddCounts(m *Map[int32], keys []uint64) {
	if len(keys) == 0 {
		return
	}
	if len(m.keys) == 0 {
		m.grow()
	}
	ks, vs, shift := m.keys, m.vals, m.shift
	mask := len(ks) - 1
next:
	for _, k := range keys {
		if k == 0 {
			m.zero++
			m.hasZero = true
			continue
		}
		if 4*(m.n+1) > 3*len(ks) {
			m.grow()
			ks, vs, shift = m.keys, m.vals, m.shift
			mask = len(ks) - 1
		}
		for i := int((k * fib) >> shift); ; i = (i + 1) & mask {
			switch ks[i] {
			case k:
				vs[i]++
				continue next
			case 0:
				ks[i], vs[i] = k, 1
				m.n++
				continue next
			}
		}
	}
}

// RemoveCounts counts one fewer of each key, dropping a key whose count
// reaches 0 (DeleteSlot); keys not held are ignored. It returns how many
// keys were held.
func RemoveCounts(m *Map[int32], keys []uint64) int {
	held := 0
next:
	for _, k := range keys {
		if k == 0 {
			if m.hasZero {
				held++
				if m.zero > 1 {
					m.zero--
				} else {
					m.DeleteSlot(ZeroSlot)
				}
			}
			continue
		}
		ks := m.keys
		if m.n == 0 {
			continue
		}
		mask := len(ks) - 1
		for i := int((k * fib) >> m.shift); ; i = (i + 1) & mask {
			switch ks[i] {
			case k:
				held++
				if m.vals[i] > 1 {
					m.vals[i]--
				} else {
					m.DeleteSlot(i)
				}
				continue next
			case 0:
				continue next
			}
		}
	}
	return held
}
