package tokenizer

import (
	"hash/maphash"
	"sync"
)

// mergeTable maps an adjacent token pair to its merge rank and result id.
// Open addressing with linear probing over a power-of-two table: a lookup is
// one multiply and usually one probe, several times cheaper than a Go map on
// the innermost loop of encoding.
type mergeTable struct {
	keys  []uint64 // left<<32 | right; emptyKey marks a free slot
	vals  []uint64 // rank<<32 | result id
	shift uint
}

const emptyKey = ^uint64(0)

func newMergeTable(n int) *mergeTable {
	size, shift := 16, uint(60)
	for size < 2*n {
		size <<= 1
		shift--
	}
	t := &mergeTable{keys: make([]uint64, size), vals: make([]uint64, size), shift: shift}
	for i := range t.keys {
		t.keys[i] = emptyKey
	}
	return t
}

func (t *mergeTable) slot(key uint64) int {
	return int((key * 0x9E3779B97F4A7C15) >> t.shift)
}

// put keeps the first (lowest-rank) entry for a pair, as Hugging Face does
// when a merges list repeats a pair.
func (t *mergeTable) put(left, right, rank, id uint32) {
	key := uint64(left)<<32 | uint64(right)
	mask := len(t.keys) - 1
	for i := t.slot(key); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case emptyKey:
			t.keys[i] = key
			t.vals[i] = uint64(rank)<<32 | uint64(id)
			return
		case key:
			return
		}
	}
}

// get returns rank and result id of merging left with right.
func (t *mergeTable) get(left, right uint32) (rank, id uint32, ok bool) {
	key := uint64(left)<<32 | uint64(right)
	mask := len(t.keys) - 1
	for i := t.slot(key); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case key:
			v := t.vals[i]
			return uint32(v >> 32), uint32(v), true
		case emptyKey:
			return 0, 0, false
		}
	}
}

// bpe is a byte-level BPE model: words arrive as raw bytes and start as one
// symbol per byte (the byte's vocabulary entry in GPT-2's alphabet).
type bpe struct {
	merges       *mergeTable
	byteIDs      [256]uint32
	byteOK       [256]bool
	unk          uint32
	hasUnk       bool
	ignoreMerges bool
	// words maps a whole word (raw bytes) to its id for ignore_merges.
	words map[string]uint32
	cache *wordCache
}

// smallWord is the length up to which the quadratic scan beats the heap.
const smallWord = 48

// appendWord appends the ids of one pre-tokenized word to dst.
func (m *bpe) appendWord(dst []uint32, word string, sc *scratch) []uint32 {
	if m.ignoreMerges {
		if id, ok := m.words[word]; ok {
			return append(dst, id)
		}
	}
	if len(word) == 1 {
		return m.appendByte(dst, word[0])
	}
	// First this call's own small cache (no lock, no atomics), then the
	// shared one.
	var l1 *l1Entry
	if m.cache != nil && len(word) <= m.cache.maxWord {
		if sc.l1 == nil {
			sc.l1 = new([l1Words]l1Entry)
		}
		l1 = &sc.l1[l1Slot(word)]
		if l1.word == word {
			return append(dst, l1.ids...)
		}
		if e, ok := m.cache.get(word); ok {
			*l1 = e
			return append(dst, e.ids...)
		}
	}
	start := len(dst)
	syms := sc.syms[:0]
	for i := 0; i < len(word); i++ {
		if !m.byteOK[word[i]] {
			// No vocabulary entry for this byte: it can take part in no
			// merge, so the word is encoded in pieces around it.
			syms = m.mergeSyms(syms, sc)
			dst = append(dst, syms...)
			syms = syms[:0]
			if m.hasUnk {
				dst = append(dst, m.unk)
			}
			continue
		}
		syms = append(syms, m.byteIDs[word[i]])
	}
	syms = m.mergeSyms(syms, sc)
	dst = append(dst, syms...)
	sc.syms = syms[:0]
	if e, ok := m.cache.put(word, dst[start:]); ok && l1 != nil {
		*l1 = e
	}
	return dst
}

func (m *bpe) appendByte(dst []uint32, b byte) []uint32 {
	if m.byteOK[b] {
		return append(dst, m.byteIDs[b])
	}
	if m.hasUnk {
		return append(dst, m.unk)
	}
	return dst
}

// mergeSyms applies merges in rank order, the leftmost pair first among
// equal ranks, until none applies.
func (m *bpe) mergeSyms(syms []uint32, sc *scratch) []uint32 {
	if len(syms) < 2 {
		return syms
	}
	if len(syms) > smallWord {
		return m.mergeHeap(syms, sc)
	}
	// ranks[i] and ids[i] describe the pair syms[i], syms[i+1]; after a
	// merge only the two pairs touching the new symbol are looked up again.
	const none = ^uint32(0)
	ranks, ids := sc.ranks[:0], sc.ids[:0]
	for i := 0; i+1 < len(syms); i++ {
		r, id, ok := m.merges.get(syms[i], syms[i+1])
		if !ok {
			r = none
		}
		ranks, ids = append(ranks, r), append(ids, id)
	}
	for {
		best, bestRank := -1, none
		for i, r := range ranks {
			if r < bestRank {
				best, bestRank = i, r
			}
		}
		if best < 0 {
			break
		}
		syms[best] = ids[best]
		syms = append(syms[:best+1], syms[best+2:]...)
		ranks = append(ranks[:best], ranks[best+1:]...)
		ids = append(ids[:best], ids[best+1:]...)
		if best > 0 {
			r, id, ok := m.merges.get(syms[best-1], syms[best])
			if !ok {
				r = none
			}
			ranks[best-1], ids[best-1] = r, id
		}
		if best < len(ranks) {
			r, id, ok := m.merges.get(syms[best], syms[best+1])
			if !ok {
				r = none
			}
			ranks[best], ids[best] = r, id
		}
	}
	sc.ranks, sc.ids = ranks[:0], ids[:0]
	return syms
}

// mergeHeap is the O(n log n) form of mergeSyms for long words (a long run of
// one character is common in real prompts and an easy denial of service for
// the quadratic form). Symbols form a linked list; stale heap entries are
// skipped when popped.
func (m *bpe) mergeHeap(syms []uint32, sc *scratch) []uint32 {
	n := len(syms)
	if cap(sc.prev) < n {
		sc.prev = make([]int32, n)
		sc.next = make([]int32, n)
		sc.alive = make([]bool, n)
	}
	prev, next, alive := sc.prev[:n], sc.next[:n], sc.alive[:n]
	for i := range n {
		prev[i], next[i], alive[i] = int32(i-1), int32(i+1), true
	}
	next[n-1] = -1
	h := sc.heap[:0]
	for i := 0; i+1 < n; i++ {
		if r, id, ok := m.merges.get(syms[i], syms[i+1]); ok {
			h = heapPush(h, mergeItem{rank: r, pos: int32(i), left: syms[i], right: syms[i+1], id: id})
		}
	}
	for len(h) > 0 {
		var it mergeItem
		it, h = heapPop(h)
		p := it.pos
		q := next[p]
		if !alive[p] || q < 0 || syms[p] != it.left || syms[q] != it.right {
			continue
		}
		syms[p] = it.id
		alive[q] = false
		nq := next[q]
		next[p] = nq
		if nq >= 0 {
			prev[nq] = p
			if r, id, ok := m.merges.get(syms[p], syms[nq]); ok {
				h = heapPush(h, mergeItem{rank: r, pos: p, left: syms[p], right: syms[nq], id: id})
			}
		}
		if pp := prev[p]; pp >= 0 {
			if r, id, ok := m.merges.get(syms[pp], syms[p]); ok {
				h = heapPush(h, mergeItem{rank: r, pos: pp, left: syms[pp], right: syms[p], id: id})
			}
		}
	}
	sc.heap = h
	out := syms[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}

type mergeItem struct {
	rank, id    uint32
	left, right uint32
	pos         int32
}

func (a mergeItem) before(b mergeItem) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

// heapPush and heapPop are a binary min-heap on a plain slice; container/heap
// would box every item into an interface.
func heapPush(h []mergeItem, it mergeItem) []mergeItem {
	h = append(h, it)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h[i].before(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeItem) (mergeItem, []mergeItem) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h[l].before(h[m]) {
			m = l
		}
		if r < len(h) && h[r].before(h[m]) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top, h
}

// wordCache remembers the ids of recent words. It is sharded to keep lock
// contention low under concurrent Encode calls and bounded: a shard that
// reaches its share of the limit is emptied rather than tracked for LRU, which
// costs nothing per hit and loses little, as hot words come back at once.
type wordCache struct {
	perShard int
	maxWord  int
	shards   [cacheShards]cacheShard
}

const cacheShards = 32

type cacheShard struct {
	mu sync.RWMutex
	m  map[string]l1Entry
	_  [40]byte // keep shards on separate cache lines
}

// newWordCache returns a cache for up to maxEntries words of up to maxWord
// bytes; maxEntries <= 0 disables caching.
func newWordCache(maxEntries, maxWord int) *wordCache {
	if maxEntries <= 0 {
		return nil
	}
	c := &wordCache{perShard: max(1, maxEntries/cacheShards), maxWord: maxWord}
	for i := range c.shards {
		c.shards[i].m = make(map[string]l1Entry)
	}
	return c
}

// shard picks a shard from the word's length and edge bytes: the shard's map
// hashes the word again anyway, so this only has to spread lock traffic, and
// it costs a fraction of a full hash (words are never empty).
func (c *wordCache) shard(word string) *cacheShard {
	h := uint(len(word))*0x9E37 ^ uint(word[0])*0x85EB ^ uint(word[len(word)-1])*0xC2B3 ^ uint(word[len(word)/2])*0x27D5
	return &c.shards[(h^h>>7)%cacheShards]
}

// get returns the cached entry of word: its own copy of the word and ids.
func (c *wordCache) get(word string) (l1Entry, bool) {
	if c == nil || len(word) > c.maxWord {
		return l1Entry{}, false
	}
	s := c.shard(word)
	s.mu.RLock()
	e, ok := s.m[word]
	s.mu.RUnlock()
	return e, ok
}

// put stores copies of word and ids and returns them.
func (c *wordCache) put(word string, ids []uint32) (l1Entry, bool) {
	if c == nil || len(word) > c.maxWord {
		return l1Entry{}, false
	}
	own := make([]uint32, len(ids))
	copy(own, ids)
	key := string([]byte(word)) // the word may alias a pooled buffer
	s := c.shard(word)
	s.mu.Lock()
	if len(s.m) >= c.perShard {
		clear(s.m)
	}
	e := l1Entry{word: key, ids: own}
	s.m[key] = e
	s.mu.Unlock()
	return e, true
}

// l1Words is the size of the direct-mapped word cache each encode call has
// (in its pooled scratch): hits there cost a hash and a compare, with no
// lock or atomic, which the shared cache's RWMutex costs on every word.
const l1Words = 1 << l1Bits

const l1Bits = 10

// le64 reads s[:8] little-endian (the compiler merges the loads).
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// l1Seed randomizes l1Slot per process.
var l1Seed = uint64(maphash.Comparable(maphash.MakeSeed(), 0)) | 1

// l1Slot picks a word's slot in an l1 cache: an inlined multiplicative hash
// of its length and first and last (up to) eight bytes — a slot is checked by
// comparing the whole word, so a collision costs a miss, never a wrong id,
// and maphash's call was half of a hit's cost.
func l1Slot(word string) uint64 {
	n := len(word)
	var a, b uint64
	if n >= 8 {
		a, b = le64(word), le64(word[n-8:])
	} else {
		for i := 0; i < n; i++ {
			a = a<<8 | uint64(word[i])
		}
	}
	h := (a ^ l1Seed) * 0x9E3779B97F4A7C15
	h ^= (b + uint64(n)) * 0xC2B2AE3D27D4EB4F
	h ^= h >> 29
	return (h * 0x165667B19E3779F9) >> (64 - l1Bits)
}

// l1Entry is a cached word (owned, never a view of caller memory) and its
// ids, shared with the word cache and never modified.
type l1Entry struct {
	word string
	ids  []uint32
}
