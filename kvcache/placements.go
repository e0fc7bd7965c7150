package kvcache

import (
	"slices"
	"sync"

	"github.com/infera/infera/internal/u64map"
)

// Placements is the approximate cache view of one worker (and DP rank): the
// block hashes of the prompts the router itself sent there, each kept for a
// TTL after its last placement and bounded in number (least recently placed
// dropped first). The router matches against it when it cannot trust or
// does not have the engine's own events — no event stream, a stream not yet
// confirmed or resyncing, no tokenizer, multimodal prompts — as SGLang's
// cache-aware router does with its approximate tree.
//
// Concurrency: Match takes a read lock, Record a write lock; both are safe
// for concurrent use. Neither allocates once the table and ring have grown to
// their working size.
type Placements struct {
	mu   sync.RWMutex
	m    u64map.Map[int64] // hash → last placement (unix ns)
	ring []placement       // placements in time order, circular (see pushLocked)
	head int               // oldest placement in ring
	n    int               // placements in ring
	max  int
	ttl  int64
	last int64 // time of the newest placement
	// forgot is the time of the newest placement dropped while current (by
	// the bound, the TTL or Clear): a hash the view does not hold was
	// placed, if ever, no later than that.
	forgot int64
}

// placement is one Record of one hash. A hash placed again is appended again;
// its older ring entries become stale (their time no longer equals m's).
type placement struct {
	hash uint64
	at   int64
}

// NewPlacements returns an empty view holding at most maxBlocks hashes, each
// for ttlNanos after it was last placed (<= 0: no expiry).
func NewPlacements(maxBlocks int, ttlNanos int64) *Placements {
	if maxBlocks <= 0 {
		maxBlocks = 1
	}
	return &Placements{max: maxBlocks, ttl: ttlNanos}
}

// Len returns how many hashes are held (expired ones not yet dropped
// included).
func (p *Placements) Len() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.m.Len()
}

// Match returns how many leading hashes were placed within the TTL before
// now (unix ns).
func (p *Placements) Match(hashes []uint64, now int64) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for j, h := range hashes {
		at, ok := p.m.Get(h)
		if !ok || (p.ttl > 0 && now-at >= p.ttl) {
			return j
		}
	}
	return len(hashes)
}

// Held returns how many leading hashes an LRU cache of capacity units
// still holds, by what was placed here: hash j, last placed at at_j, counts
// while now − at_j + (j+1)×per < capacity — the j+1 blocks ending with it
// were the most recent in the cache, and what the cache took in since
// (now − at_j, in the units of the placement times) takes the rest of it.
// The caller's clock counts the cache's intake, not wall time. A hash the
// view no longer holds is taken as placed when it forgot its newest
// dropped placement (a lower bound on its age); one it never dropped
// anything before stops nothing: the view knows only what it recorded.
func (p *Placements) Held(hashes []uint64, now, capacity, per int64) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	room := capacity
	for j, h := range hashes {
		room -= per
		at, ok := p.m.Get(h)
		if !ok {
			if p.forgot == 0 {
				continue
			}
			at = p.forgot
		}
		if now-at >= room {
			return j
		}
	}
	return len(hashes)
}

// Record notes that a prompt with these block hashes was placed at now.
// Hashes are recorded from the deepest up so that the first block is the
// most recent: eviction then takes the tails before the prefixes they hang
// from.
func (p *Placements) Record(hashes []uint64, now int64) {
	if len(hashes) > p.max {
		// Only the first max blocks can ever be held; recording the rest
		// would evict the prefix that makes them reachable.
		hashes = hashes[:p.max]
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(now)
	for j := len(hashes) - 1; j >= 0; j-- {
		// Strictly increasing times keep every ring entry distinguishable
		// from a later placement of the same hash.
		at := max(now, p.last+1)
		p.last = at
		if p.n == p.max {
			p.popLocked()
		}
		p.m.Set(hashes[j], at)
		p.pushLocked(placement{hash: hashes[j], at: at})
	}
}

// Clear drops every placement.
func (p *Placements) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m.Reset()
	p.head, p.n = 0, 0
	p.forgot = max(p.forgot, p.last)
}

// The ring is circular: n entries from head on, wrapping at len(ring),
// which grows up to max.
func (p *Placements) pushLocked(e placement) {
	if p.n == len(p.ring) {
		// Full backing array below max: make it linear, then grow.
		if p.head != 0 {
			slices.Reverse(p.ring[:p.head])
			slices.Reverse(p.ring[p.head:])
			slices.Reverse(p.ring)
			p.head = 0
		}
		p.ring = append(p.ring, e)
		p.n++
		return
	}
	p.ring[(p.head+p.n)%len(p.ring)] = e
	p.n++
}

func (p *Placements) popLocked() {
	e := p.ring[p.head]
	// A hash placed again since holds a later time: that entry is stale.
	if i, ok := p.m.Find(e.hash); ok && *p.m.At(i) == e.at {
		p.m.DeleteSlot(i)
		p.forgot = e.at
	}
	p.head = (p.head + 1) % len(p.ring)
	p.n--
}

// expireLocked drops placements older than the TTL; entries are in time
// order, so it stops at the first live one.
func (p *Placements) expireLocked(now int64) {
	if p.ttl <= 0 {
		return
	}
	for p.n > 0 && now-p.ring[p.head].at >= p.ttl {
		p.popLocked()
	}
}
