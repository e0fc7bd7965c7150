package tokenizer

import (
	"hash/maphash"
	"sync"
)

// Segment cache: the ids of recent long segments, the texts between
// raw-matched added tokens. A chat template puts a special token around
// every message (<|im_start|>user\n...<|im_end|>), so a segment is about one
// message, and a multi-turn conversation re-encodes only its new turn: every
// earlier message is a hit. Encoding a segment on its own is exact, as the
// encoder never lets a pre-tokenizer split, a normalizer or a merge cross an
// added token (encodeRaw), so a hit returns what encoding would.

// minCachedSegment is the shortest segment (bytes) the cache keeps: shorter
// ones encode in about the time a lookup takes.
const minCachedSegment = 256

// defaultCacheSegmentTokens bounds the cache's ids (4 bytes each) by default.
const defaultCacheSegmentTokens = 1 << 20

// segKey identifies a segment by two independent 64-bit hashes and its
// length: a false hit needs a 128-bit collision.
type segKey struct {
	h1, h2 uint64
	n      int
}

type segEntry struct {
	key        segKey
	ids        []uint32 // immutable once stored
	prev, next *segEntry
}

// segmentCache is a least-recently-used cache of segment ids bounded by the
// total ids it holds. It is safe for concurrent use; ids returned by get are
// never modified (eviction only drops the reference).
type segmentCache struct {
	seed1, seed2 maphash.Seed
	maxTokens    int

	mu     sync.Mutex
	m      map[segKey]*segEntry
	head   segEntry // sentinel: head.next is the most recent
	tokens int
}

// newSegmentCache returns a cache of up to maxTokens ids; maxTokens <= 0
// disables it (nil).
func newSegmentCache(maxTokens int) *segmentCache {
	if maxTokens <= 0 {
		return nil
	}
	c := &segmentCache{seed1: maphash.MakeSeed(), seed2: maphash.MakeSeed(), maxTokens: maxTokens, m: make(map[segKey]*segEntry)}
	c.head.prev, c.head.next = &c.head, &c.head
	return c
}

func (c *segmentCache) key(seg string) segKey {
	return segKey{maphash.String(c.seed1, seg), maphash.String(c.seed2, seg), len(seg)}
}

func (c *segmentCache) unlink(e *segEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (c *segmentCache) pushFront(e *segEntry) {
	e.prev, e.next = &c.head, c.head.next
	c.head.next.prev = e
	c.head.next = e
}

func (c *segmentCache) get(k segKey) ([]uint32, bool) {
	c.mu.Lock()
	e, ok := c.m[k]
	if ok {
		c.unlink(e)
		c.pushFront(e)
	}
	c.mu.Unlock()
	if !ok {
		return nil, false
	}
	return e.ids, true
}

func (c *segmentCache) put(k segKey, ids []uint32) {
	if len(ids) > c.maxTokens/4 {
		return // one segment must not flush the cache
	}
	own := append([]uint32(nil), ids...) // no zeroing before the copy
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; ok {
		return
	}
	e := &segEntry{key: k, ids: own}
	c.m[k] = e
	c.pushFront(e)
	c.tokens += len(own)
	for c.tokens > c.maxTokens {
		last := c.head.prev
		c.unlink(last)
		delete(c.m, last.key)
		c.tokens -= len(last.ids)
	}
}

// len returns the number of cached segments (tests).
func (c *segmentCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// encodeSegmentCached is encodeSegment through the segment cache.
func (t *HF) encodeSegmentCached(dst []uint32, seg string, st *encodeState) []uint32 {
	if t.segs == nil || len(seg) < minCachedSegment {
		return t.encodeSegment(dst, seg, st)
	}
	k := t.segs.key(seg)
	if ids, ok := t.segs.get(k); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = t.encodeSegment(dst, seg, st)
	t.segs.put(k, dst[start:])
	return dst
}
