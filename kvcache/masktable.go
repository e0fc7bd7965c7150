package kvcache

import (
	"sync"
	"sync/atomic"
)

// shard holds the part of a group's router-hash table whose top hash bits
// match its index. Readers take no lock: they read the table through
// atomics and retry when a writer changed the shard meanwhile (ver moved),
// so a lookup costs two loads of ver and the probe, and concurrent readers
// write no shared cache line (a read lock's count was one store per block
// per reader). Writers are serialised by Index.mu already; each change of
// the table is bracketed by ver going odd and back to even with the
// shard's mu held, so that a reader that keeps meeting changes can wait on
// mu instead of spinning on a writer that is not running.
type shard struct {
	mu  sync.Mutex
	ver atomic.Uint64 // odd while a writer changes tab or its slots
	tab atomic.Pointer[maskTable]
	_   [40]byte // keep neighbouring shards' counters off one cache line
}

// maskTable is open addressing with linear probing and backward-shift
// deletion (no tombstones), placed by the hash's low bits (router hashes
// are xxh64 outputs; the shard took the top ones). A slot is empty when
// its mask is 0: a held hash always has a worker's bit set, so any key,
// 0 included, can be held. It is replaced, never resized in place, so a
// reader's probe stays within the slots it loaded.
type maskTable struct {
	slots []maskSlot // a power of two long
	last  uint64     // len(slots) − 1
	n     int        // hashes held; writers only
}

// maskSlot is one router hash's entry: which of the group's 64 workers hold
// it (bit = slot mod 64), which is all a lookup reads, and the list of
// their blocks, which only writers (under Index.mu) read or write.
type maskSlot struct {
	key  atomic.Uint64
	mask atomic.Uint64
	head uint32
}

// entry is a router hash's value as writers read and set it.
type entry struct {
	head uint32
	mask uint64
}

// minMaskTable is a shard's first table size.
const minMaskTable = 8

// shardRetries is how many times a reader retries a probe that met a
// change before it waits on the writers' shard lock.
const shardRetries = 4

// emptyTable is every shard's table until its first write: one empty slot,
// never written (a first set grows it), so that readers need no nil check.
var emptyTable = &maskTable{slots: make([]maskSlot, 1)}

// init gives a new shard the empty table.
func (sh *shard) init() { sh.tab.Store(emptyTable) }

// homeMask is maskOf's common case, small enough to inline in the
// lookups' loops: h in its home slot, or that slot empty, with the version
// unchanged around the reads (an odd version, a write under way, never
// equals v&^1). ok false: call maskOf.
func (sh *shard) homeMask(h uint64) (mask uint64, ok bool) {
	v := sh.ver.Load()
	t := sh.tab.Load()
	sl := &t.slots[h&t.last]
	mask = sl.mask.Load()
	return mask, (mask == 0 || sl.key.Load() == h) && sh.ver.Load() == v&^1
}

// maskOf returns the mask of the workers holding h (0: none). It takes no
// lock unless writers changed the shard under it shardRetries times.
func (sh *shard) maskOf(h uint64) uint64 {
	for range shardRetries {
		v := sh.ver.Load()
		if v&1 != 0 {
			continue
		}
		m := sh.tab.Load().maskOf(h)
		if sh.ver.Load() == v {
			return m
		}
	}
	sh.mu.Lock()
	m := sh.tab.Load().maskOf(h)
	sh.mu.Unlock()
	return m
}

// maskOf probes t for h. A probe torn by a concurrent writer may answer
// anything; the caller's version check discards it. It is bounded by the
// table's length, so a torn probe still ends.
func (t *maskTable) maskOf(h uint64) uint64 {
	s := t.slots
	last := t.last
	i := h & last
	for range s {
		sl := &s[i]
		m := sl.mask.Load()
		if m == 0 {
			return 0
		}
		if sl.key.Load() == h {
			return m
		}
		i = (i + 1) & last
	}
	return 0
}

// find returns h's slot in t, or -1. Writers only.
func (t *maskTable) find(h uint64) int {
	if t.n == 0 {
		return -1
	}
	last := uint64(len(t.slots) - 1)
	for i := h & last; ; i = (i + 1) & last {
		sl := &t.slots[i]
		if sl.mask.Load() == 0 {
			return -1
		}
		if sl.key.Load() == h {
			return int(i)
		}
	}
}

// get returns h's entry (zero when not held). Writers only: they read the
// shard without the version dance, being the only ones to change it.
func (sh *shard) get(h uint64) entry {
	t := sh.tab.Load()
	i := t.find(h)
	if i < 0 {
		return entry{}
	}
	sl := &t.slots[i]
	return entry{head: sl.head, mask: sl.mask.Load()}
}

// set makes e (mask non-zero) h's entry. Index.mu held.
func (sh *shard) set(h uint64, e entry) {
	sh.mu.Lock()
	sh.ver.Add(1)
	t := sh.tab.Load()
	if i := t.find(h); i >= 0 {
		sl := &t.slots[i]
		sl.head = e.head
		sl.mask.Store(e.mask)
	} else {
		if 4*(t.n+1) > 3*len(t.slots) {
			t = t.grown()
			sh.tab.Store(t)
		}
		t.insert(h, e)
	}
	sh.ver.Add(1)
	sh.mu.Unlock()
}

// del drops h's entry (a hash not held is ignored). Index.mu held.
func (sh *shard) del(h uint64) {
	t := sh.tab.Load()
	i := t.find(h)
	if i < 0 {
		return
	}
	sh.mu.Lock()
	sh.ver.Add(1)
	t.deleteSlot(i)
	sh.ver.Add(1)
	sh.mu.Unlock()
}

// insert puts h, known absent, into its first empty slot.
func (t *maskTable) insert(h uint64, e entry) {
	last := uint64(len(t.slots) - 1)
	i := h & last
	for t.slots[i].mask.Load() != 0 {
		i = (i + 1) & last
	}
	sl := &t.slots[i]
	sl.key.Store(h)
	sl.head = e.head
	sl.mask.Store(e.mask)
	t.n++
}

// grown returns a table twice t's size (minMaskTable at least) holding t's
// entries. t itself is left as it is for readers still probing it.
func (t *maskTable) grown() *maskTable {
	size := max(minMaskTable, 2*len(t.slots))
	nt := &maskTable{slots: make([]maskSlot, size), last: uint64(size - 1)}
	for i := range t.slots {
		sl := &t.slots[i]
		if m := sl.mask.Load(); m != 0 {
			nt.insert(sl.key.Load(), entry{head: sl.head, mask: m})
		}
	}
	return nt
}

// deleteSlot empties slot i by backward shift: later entries of its probe
// run move into the hole unless their home lies cyclically in (hole,
// their slot].
func (t *maskTable) deleteSlot(i int) {
	t.n--
	last := len(t.slots) - 1
	for j := i; ; {
		j = (j + 1) & last
		sj := &t.slots[j]
		m := sj.mask.Load()
		if m == 0 {
			break
		}
		k := sj.key.Load()
		if home := int(k) & last; (j-home)&last < (j-i)&last {
			continue // home is after the hole: the entry stays
		}
		si := &t.slots[i]
		si.key.Store(k)
		si.head = sj.head
		si.mask.Store(m)
		i = j
	}
	si := &t.slots[i]
	si.mask.Store(0)
	si.key.Store(0)
	si.head = 0
}
