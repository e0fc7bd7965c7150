package kvcache

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// refPlacements is Placements as it was with Go's map: the reference the
// open-addressing table is held to.
type refPlacements struct {
	mu   sync.RWMutex
	m    map[uint64]int64 // hash → last placement (unix ns)
	ring []refPlacement   // placements in time order, circular (see pushLocked)
	head int              // oldest placement in ring
	n    int              // placements in ring
	max  int
	ttl  int64
	last int64 // time of the newest placement
}

// placement is one Record of one hash. A hash placed again is appended again;
// its older ring entries become stale (their time no longer equals m's).
type refPlacement struct {
	hash uint64
	at   int64
}

// NewrefPlacements returns an empty view holding at most maxBlocks hashes, each
// for ttlNanos after it was last placed (<= 0: no expiry).
func newRefPlacements(maxBlocks int, ttlNanos int64) *refPlacements {
	if maxBlocks <= 0 {
		maxBlocks = 1
	}
	return &refPlacements{m: make(map[uint64]int64), max: maxBlocks, ttl: ttlNanos}
}

// Len returns how many hashes are held (expired ones not yet dropped
// included).
func (p *refPlacements) Len() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.m)
}

// Match returns how many leading hashes were placed within the TTL before
// now (unix ns).
func (p *refPlacements) Match(hashes []uint64, now int64) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for j, h := range hashes {
		at, ok := p.m[h]
		if !ok || (p.ttl > 0 && now-at >= p.ttl) {
			return j
		}
	}
	return len(hashes)
}

// Record notes that a prompt with these block hashes was placed at now.
// Hashes are recorded from the deepest up so that the first block is the
// most recent: eviction then takes the tails before the prefixes they hang
// from.
func (p *refPlacements) Record(hashes []uint64, now int64) {
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
		p.m[hashes[j]] = at
		p.pushLocked(refPlacement{hash: hashes[j], at: at})
	}
}

// Clear drops every placement.
func (p *refPlacements) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.m)
	p.head, p.n = 0, 0
}

// The ring is circular: n entries from head on, wrapping at len(ring),
// which grows up to max.
func (p *refPlacements) pushLocked(e refPlacement) {
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

func (p *refPlacements) popLocked() {
	e := p.ring[p.head]
	if at, ok := p.m[e.hash]; ok && at == e.at {
		delete(p.m, e.hash)
	}
	p.head = (p.head + 1) % len(p.ring)
	p.n--
}

// expireLocked drops placements older than the TTL; entries are in time
// order, so it stops at the first live one.
func (p *refPlacements) expireLocked(now int64) {
	if p.ttl <= 0 {
		return
	}
	for p.n > 0 && now-p.ring[p.head].at >= p.ttl {
		p.popLocked()
	}
}

// checkPlacementsOps drives a Placements and a refPlacements through the
// same records (hashes from a small universe with 0 in it, so that keys
// repeat, collide in the table and are evicted and expire), matches and
// clears, and compares every answer.
func checkPlacementsOps(t *testing.T, max int, ttl int64, ops []byte) {
	p, q := NewPlacements(max, ttl), newRefPlacements(max, ttl)
	now := int64(1000)
	var hs []uint64
	for i := 0; i+1 < len(ops); i += 2 {
		a, b := ops[i], ops[i+1]
		now += int64(a >> 5)
		hs = hs[:0]
		for k := range 1 + int(b)%40 {
			hs = append(hs, uint64((int(a)*7+k*int(b|1))%97)*0x9e3779b97f4a7c15>>(a&3))
		}
		switch a & 3 {
		case 0, 1:
			p.Record(hs, now)
			q.Record(hs, now)
		case 2:
			if got, want := p.Match(hs, now), q.Match(hs, now); got != want {
				t.Fatalf("op %d: match %d, reference %d", i/2, got, want)
			}
		case 3:
			if b%16 == 0 {
				p.Clear()
				q.Clear()
			}
		}
		if p.Len() != q.Len() {
			t.Fatalf("op %d: len %d, reference %d", i/2, p.Len(), q.Len())
		}
	}
	// Every hash of the universe answers alike at the end.
	for h := range uint64(97) {
		for _, s := range []uint64{0, 1, 2, 3} {
			k := []uint64{h * 0x9e3779b97f4a7c15 >> s}
			if got, want := p.Match(k, now), q.Match(k, now); got != want {
				t.Fatalf("hash %x: match %d, reference %d", k[0], got, want)
			}
		}
	}
}

// TestPlacementsMatchReference: the open-addressing Placements answers
// every Match and Len as the map-based one did.
func TestPlacementsMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 5))
	for n := range 300 {
		ops := make([]byte, 2*(50+n))
		for i := range ops {
			ops[i] = byte(rng.Uint32())
		}
		checkPlacementsOps(t, 1+n%70, int64(n%5)*40, ops)
	}
}

func FuzzPlacements(f *testing.F) {
	f.Add(uint8(10), uint8(3), []byte{0, 5, 2, 5, 64, 9, 1, 200, 2, 9, 3, 16, 2, 5})
	f.Fuzz(func(t *testing.T, max, ttl uint8, ops []byte) {
		checkPlacementsOps(t, 1+int(max), int64(ttl%8)*30, ops)
	})
}

// BenchmarkPlacementsRecord: a pick's Record of a 32k-token prompt (2,048
// blocks), the same prompt again and again (the ring's stale entries
// evicted), into the default provisional bound; against the map version.
func BenchmarkPlacementsRecord(b *testing.B) {
	hs := AppendChainHashes(nil, 42, 2048)
	b.Run("table", func(b *testing.B) {
		p := NewPlacements(1<<16, 0)
		now := int64(0)
		for b.Loop() {
			now++
			p.Record(hs, now)
		}
	})
	b.Run("map", func(b *testing.B) {
		p := newRefPlacements(1<<16, 0)
		now := int64(0)
		for b.Loop() {
			now++
			p.Record(hs, now)
		}
	})
}
