package kvcache

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// touchReference is Touch as it was before touchLocked: every found block
// moved to the front, deepest first. touchLocked must leave every LRU
// exactly as this does.
func touchReference(x *Index, w *Worker, hashes []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if w.removed.Load() {
		return
	}
	for j := len(hashes) - 1; j >= 0; j-- {
		if i := x.findLocked(hashes[j], w); i != 0 {
			x.lruMoveFrontLocked(w, i)
		}
	}
}

// lruOf lists w's LRU from the most recent block, by router hash, and
// checks the back links on the way.
func lruOf(t testing.TB, x *Index, w *Worker) []uint64 {
	t.Helper()
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []uint64
	var prev uint32
	for i := w.lruHead; i != 0; i = x.at(i).next {
		if x.at(i).prev != prev {
			t.Fatalf("block %d: prev %d, want %d", i, x.at(i).prev, prev)
		}
		out = append(out, x.at(i).hash)
		prev = i
	}
	if w.lruTail != prev {
		t.Fatalf("tail %d, want %d", w.lruTail, prev)
	}
	return out
}

// touchPair drives an index through Touch and a twin through
// touchReference with the same stores, removals and touches.
type touchPair struct {
	t       testing.TB
	x, y    *Index
	wx, wy  []*Worker
	chains  [][]uint64 // router hashes of the chains stored so far
	tokens  [][]uint32 // their tokens
	nextEng uint64
}

func newTouchPair(t testing.TB, maxBlocks, workers int) *touchPair {
	p := &touchPair{t: t, x: NewIndex(IndexConfig{MaxBlocks: maxBlocks}), y: NewIndex(IndexConfig{MaxBlocks: maxBlocks})}
	for i := range workers {
		name := string(rune('a' + i))
		p.wx = append(p.wx, mustRegister(t, p.x, name, 2))
		p.wy = append(p.wy, mustRegister(t, p.y, name, 2))
	}
	return p
}

// op applies one operation chosen by (a, b, c) to both indexes.
func (p *touchPair) op(a, b, c byte) {
	wi := int(a>>4) % len(p.wx)
	switch a & 7 {
	case 0, 1, 2: // store a chain: a new one, or a prefix/extension of an old one
		n := 1 + int(b)%24
		var base []uint32
		if len(p.chains) > 0 && c&1 == 1 {
			// Re-store (part of) an old chain, possibly extended: the
			// blocks already held move to the front, deepest last.
			base = slices.Clone(p.tokens[int(c>>1)%len(p.tokens)])
		}
		for len(base) < 2*n {
			base = append(base, uint32(len(p.chains))<<16|uint32(len(base)))
		}
		base = base[:2*n]
		eng := make([]uint64, n)
		for k := range eng {
			p.nextEng++
			eng[k] = p.nextEng
		}
		ev := stored(eng, nil, base, 2)
		p.x.Apply(p.wx[wi], batchOf(ev))
		p.y.Apply(p.wy[wi], batchOf(ev))
		hs := AppendBlockHashes(nil, base, 2)
		p.chains = append(p.chains, hs)
		p.tokens = append(p.tokens, base)
	case 3: // remove one block by its engine hash
		if p.nextEng == 0 {
			return
		}
		e := 1 + uint64(b)<<8 | uint64(c)
		e = 1 + e%p.nextEng
		p.x.Apply(p.wx[wi], batchOf(removed(e)))
		p.y.Apply(p.wy[wi], batchOf(removed(e)))
	default: // touch
		hs := p.touchHashes(b, c)
		p.x.Touch(p.wx[wi], hs)
		touchReference(p.y, p.wy[wi], hs)
	}
	p.check()
}

// touchHashes picks what to touch: a prefix of a chain (the router's
// case), a slice from its middle, with a foreign or repeated hash, or
// reversed.
func (p *touchPair) touchHashes(b, c byte) []uint64 {
	if len(p.chains) == 0 {
		return []uint64{uint64(b)}
	}
	ch := p.chains[int(b)%len(p.chains)]
	n := 1 + int(c>>3)%len(ch)
	hs := slices.Clone(ch[:n])
	switch c & 7 {
	case 4:
		hs = slices.Clone(ch[min(n, len(ch)-1):])
	case 5:
		hs = append(hs, 12345, hs[0])
	case 6:
		hs[len(hs)/2] = hs[0]
	case 7:
		slices.Reverse(hs)
	}
	return hs
}

func (p *touchPair) check() {
	p.t.Helper()
	if p.x.Len() != p.y.Len() {
		p.t.Fatalf("len %d, reference %d", p.x.Len(), p.y.Len())
	}
	for i := range p.wx {
		got, want := lruOf(p.t, p.x, p.wx[i]), lruOf(p.t, p.y, p.wy[i])
		if !slices.Equal(got, want) {
			p.t.Fatalf("worker %d LRU\n got  %x\n want %x", i, got, want)
		}
	}
}

// TestTouchMatchesReference: Touch leaves every worker's LRU, and so what
// the index evicts, exactly as moving each found block to the front did,
// over random stores, re-stores, removals and touches (prefixes, middles,
// foreign and repeated hashes, reversed) with eviction at the bound.
func TestTouchMatchesReference(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		p := newTouchPair(t, 20+int(seed)*4, 1+int(seed%3))
		for range 300 {
			p.op(byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()))
		}
	}
}

// TestTouchInPlace: a chain is stored root first; touching a prefix of
// another chain moves it to the front root first, and touching the prefix
// that already leads the LRU changes nothing.
func TestTouchInPlace(t *testing.T) {
	x := NewIndex(IndexConfig{})
	w := mustRegister(t, x, "w", 1)
	x.Apply(w, batchOf(stored([]uint64{1, 2, 3}, nil, []uint32{7, 8, 9}, 1)))
	a := AppendBlockHashes(nil, []uint32{7, 8, 9}, 1)
	x.Apply(w, batchOf(stored([]uint64{4, 5}, nil, []uint32{5, 6}, 1)))
	b := AppendBlockHashes(nil, []uint32{5, 6}, 1)
	if got := lruOf(t, x, w); !slices.Equal(got, []uint64{b[0], b[1], a[0], a[1], a[2]}) {
		t.Fatalf("after stores: %x", got)
	}
	x.Touch(w, a[:2])
	want := []uint64{a[0], a[1], b[0], b[1], a[2]}
	if got := lruOf(t, x, w); !slices.Equal(got, want) {
		t.Fatalf("after touch: %x", got)
	}
	x.Touch(w, a[:2])
	x.Touch(w, a[:1])
	if got := lruOf(t, x, w); !slices.Equal(got, want) {
		t.Fatalf("after touches in place: %x", got)
	}
}

func FuzzTouch(f *testing.F) {
	f.Add(uint8(30), uint8(2), []byte{0, 10, 0, 0, 5, 1, 4, 0, 9, 7, 0, 255, 3, 1, 1, 4, 0, 0})
	f.Add(uint8(8), uint8(1), []byte{0, 20, 0, 4, 0, 200, 1, 3, 3, 6, 0, 33, 5, 0, 13})
	f.Fuzz(func(t *testing.T, maxBlocks, workers uint8, ops []byte) {
		if len(ops) > 3*200 {
			ops = ops[:3*200]
		}
		p := newTouchPair(t, 4+int(maxBlocks), 1+int(workers%4))
		for i := 0; i+2 < len(ops); i += 3 {
			p.op(ops[i], ops[i+1], ops[i+2])
		}
	})
}

// TestTouchZeroAlloc: Touch, in place or moving blocks, does not allocate.
func TestTouchZeroAlloc(t *testing.T) {
	x := NewIndex(IndexConfig{})
	w := mustRegister(t, x, "w", 2)
	tokens := make([]uint32, 2*64)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	eng := make([]uint64, 64)
	for i := range eng {
		eng[i] = uint64(i + 1)
	}
	x.Apply(w, batchOf(stored(eng, nil, tokens, 2)))
	hs := AppendBlockHashes(nil, tokens, 2)
	other := slices.Clone(hs)
	slices.Reverse(other)
	if n := testing.AllocsPerRun(100, func() {
		x.Touch(w, hs)
		x.Touch(w, hs)
		x.Touch(w, other)
	}); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}

// BenchmarkTouch: the release's Touch of a 1024-block prefix of a worker
// holding 2048 blocks among 1Mi: the prefix touched last (in place), two
// prefixes alternating (each moves), and a prefix freshly stored (deepest
// first in the LRU).
func BenchmarkTouch(b *testing.B) {
	const workers, perWorker, prefix = 512, 2048, 1024
	x := NewIndex(IndexConfig{MaxBlocks: workers*perWorker + 1<<16})
	rng := rand.New(rand.NewPCG(1, 2))
	var w *Worker
	chains := make([][]uint64, 0, 4)
	var next uint64
	for i := range workers {
		h := mustRegister(b, x, string(rune(0x100+i)), 16)
		for stored := 0; stored < perWorker; stored += prefix {
			tokens := make([]uint32, prefix*16)
			for k := range tokens {
				tokens[k] = rng.Uint32N(150000)
			}
			eng := make([]uint64, prefix)
			for k := range eng {
				next++
				eng[k] = next
			}
			x.Apply(h, batchOf(Event{Type: EventBlockStored, Hashes: eng, Tokens: tokens, BlockSize: 16}))
			if i == 3 {
				chains = append(chains, AppendBlockHashes(nil, tokens, 16))
			}
		}
		if i == 3 {
			w = h
		}
	}
	b.Run("in-place", func(b *testing.B) {
		x.Touch(w, chains[0])
		for b.Loop() {
			x.Touch(w, chains[0])
		}
	})
	b.Run("alternating", func(b *testing.B) {
		k := 0
		for b.Loop() {
			x.Touch(w, chains[k&1])
			k++
		}
	})
	b.Run("reference/alternating", func(b *testing.B) {
		k := 0
		for b.Loop() {
			touchReference(x, w, chains[k&1])
			k++
		}
	})
}
