package kvcache

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
)

// Key names one prefix cache: a worker (its discovery worker_id) and, for a
// data-parallel worker, the rank. Workers without data parallelism use rank 0.
type Key struct {
	Worker string
	DPRank int
}

// Mode says whether a worker's index entry mirrors its engine's cache.
type Mode uint8

const (
	// ModeApproximate: the index has missed events (never synced, a sequence
	// gap without replay, a malformed batch), so it may lack blocks the
	// engine holds; the router must not trust a miss.
	ModeApproximate Mode = iota
	// ModePrecise: every event since the engine's cache was last known empty
	// has been applied.
	ModePrecise
)

func (m Mode) String() string {
	if m == ModePrecise {
		return "precise"
	}
	return "approximate"
}

// DefaultMaxBlocks bounds an index built with a zero IndexConfig.MaxBlocks.
const DefaultMaxBlocks = 1 << 20

// maxSlots is how many workers one index can hold at once (slot is a uint16).
const maxSlots = math.MaxUint16

const (
	chunkShift = 14 // 16384 blocks (512 KiB) per slab chunk
	chunkSize  = 1 << chunkShift
	chunkMask  = chunkSize - 1

	shardBits  = 8
	numShards  = 1 << shardBits
	shardShift = 64 - shardBits

	// Workers are grouped by slot in groups of 64; each group has its own
	// router-hash table (masktable.go) whose slots carry a 64-bit
	// membership mask.
	groupShift = 6
	maxGroups  = (maxSlots + 63) >> groupShift
)

// IndexConfig sizes an Index.
type IndexConfig struct {
	// MaxBlocks bounds the (worker, block) entries held across all workers.
	// At the bound, the worker holding the most blocks loses its least
	// recently stored or touched one, so pressure is shared max-min fairly
	// and a quiet worker's cache view is not flushed by a busy one. Size it
	// at or above the fleet's total engine KV blocks so that eviction is only
	// a safety valve. 0 means DefaultMaxBlocks.
	MaxBlocks int
}

// block is one (worker, router hash) entry. Blocks live in a chunked slab and
// are addressed by uint32 (0 = none) so the index holds no pointers per
// block: the GC never scans it and an entry costs 32 bytes.
type block struct {
	hash   uint64 // router hash
	engine uint64 // engine hash that stored it (its engine-map key)
	same   uint32 // next block with the same router hash (other workers)
	prev   uint32 // worker LRU neighbour towards the head (more recent)
	next   uint32 // worker LRU neighbour towards the tail; free-list link when free
	slot   uint16
}

// group indexes the blocks of slots [64g, 64g+64).
type group struct {
	shards [numShards]shard
}

func newGroup() *group {
	g := new(group)
	for i := range g.shards {
		g.shards[i].init()
	}
	return g
}

func (g *group) shardOf(h uint64) *shard { return &g.shards[h>>shardShift] }

// Worker is an index handle for one Key. The router keeps handles in its
// fleet snapshot and passes them to Match/MatchMany; the event applier
// passes its handle to Apply. After Unregister a handle matches nothing.
type Worker struct {
	key  Key
	idx  *Index
	slot uint16

	removed   atomic.Bool
	precise   atomic.Bool
	blocks    atomic.Int64
	capacity  atomic.Int64 // most blocks held when the engine removed one
	blockSize atomic.Int32

	// prompts: the last prompts routed to the worker, for learning the
	// router hash of a parent stored before the index knew the worker
	// (LearnPrompt, learnParentLocked). Guarded by promptMu, taken inside
	// Index.mu by the applier and alone by the router.
	promptMu   sync.Mutex
	prompts    [recentPrompts]recentPrompt
	promptNext int

	// Guarded by Index.mu.
	engine      map[uint64]uint64 // engine hash → router hash
	otherGroups uint64            // group_idx values seen with a non-attention kind
	lruHead     uint32            // most recently stored/touched block
	lruTail     uint32
	livePos     int // position in Index.live
}

// Key returns the worker and rank this handle indexes.
func (w *Worker) Key() Key { return w.key }

// Blocks returns how many blocks the index holds for the worker.
func (w *Worker) Blocks() int { return int(w.blocks.Load()) }

// Capacity returns the worker's cache capacity in blocks: the cache size
// its engine reports (ReportCapacity), or as its events reveal it, the
// most blocks the index held for it when its engine removed one (an engine
// evicts only when its cache is full), whichever is more; 0 while neither
// is known. Blocks of running sequences not yet full are not reported, so
// the learnt one is the room for cached prefixes, a little below the
// engine's own count, and reaches it only once the cache has turned over.
func (w *Worker) Capacity() int { return int(w.capacity.Load()) }

// ReportCapacity raises the capacity to blocks, the cache size the engine
// reports (its worker record's kv_capacity_blocks): a router that starts
// beside a running fleet knows the room in each cache before its young
// index has seen it fill.
func (w *Worker) ReportCapacity(blocks int) { w.raiseCapacity(int64(blocks)) }

// raiseCapacity sets the capacity to b unless it is already that much.
func (w *Worker) raiseCapacity(b int64) {
	for {
		cur := w.capacity.Load()
		if b <= cur || w.capacity.CompareAndSwap(cur, b) {
			return
		}
	}
}

// Mode returns whether the worker's entry mirrors its engine (ModePrecise).
func (w *Worker) Mode() Mode {
	if w.precise.Load() {
		return ModePrecise
	}
	return ModeApproximate
}

// Approximate reports Mode() == ModeApproximate.
func (w *Worker) Approximate() bool { return !w.precise.Load() }

// SetMode records whether the worker's entry is complete; the event
// applier (Subscriber) owns this.
func (w *Worker) SetMode(m Mode) { w.precise.Store(m == ModePrecise) }

// BlockSize returns the engine block size used for the worker's hashes:
// configured at Register or learned from its first stored event; 0 while
// unknown.
func (w *Worker) BlockSize() int { return int(w.blockSize.Load()) }

// Index is the router's prefix index: for every registered worker, the set of
// router block hashes its engine caches, plus that worker's engine-hash →
// router-hash map for removals and parent chaining. Memory is bounded by
// MaxBlocks.
//
// Concurrency: any number of goroutines may call Match/MatchMany/Worker
// methods concurrently with writers. Writers (Apply, Touch, Clear,
// Register, Unregister) serialise on one mutex and change one hash's shard
// at a time (shard: its lock held, its version odd), so a lookup, which
// takes no lock, retries at most around such updates, never a whole batch.
type Index struct {
	mu sync.Mutex

	// groups[g] is created (under mu) before slot 64g is handed out and
	// never replaced.
	groups [maxGroups]atomic.Pointer[group]
	// chunks is sized once in NewIndex and never re-sliced, so readers may
	// index it without a lock; an element is set (under mu) before any block
	// in it is used. Only writers read blocks: readers see shard masks.
	chunks [][]block

	maxBlocks int
	used      int    // blocks allocated, guarded by mu
	hwm       uint32 // next never-used block index
	free      uint32 // free-list head

	workers []*Worker // by slot; nil = free
	minFree int       // no free slot below this
	live    []*Worker // registered workers, for eviction
	byKey   map[Key]*Worker

	scratch []uint64 // router hashes of the event being applied

	pool sync.Pool // *matchScratch, for queries spanning many groups
}

// groupQuery is one group's part of a MatchMany call.
type groupQuery struct {
	g      *group
	gi     uint16
	active uint64 // workers still matching
	live   uint64 // workers queried
	res    [64]int32
}

// matchScratch holds group queries beyond what fits on the stack.
type matchScratch struct {
	qs []groupQuery
}

// NewIndex returns an empty index.
func NewIndex(cfg IndexConfig) *Index {
	maxBlocks := cfg.MaxBlocks
	if maxBlocks <= 0 {
		maxBlocks = DefaultMaxBlocks
	}
	if maxBlocks > math.MaxUint32-1 {
		maxBlocks = math.MaxUint32 - 1
	}
	x := &Index{
		maxBlocks: maxBlocks,
		// Index 0 is the nil block, so capacity is maxBlocks+1 entries.
		chunks: make([][]block, (maxBlocks+chunkSize)>>chunkShift),
		hwm:    1,
		byKey:  make(map[Key]*Worker),
	}
	x.pool.New = func() any { return new(matchScratch) }
	return x
}

// MaxBlocks returns the configured bound.
func (x *Index) MaxBlocks() int { return x.maxBlocks }

// Len returns the number of (worker, block) entries held.
func (x *Index) Len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.used
}

func (x *Index) at(i uint32) *block {
	return &x.chunks[i>>chunkShift][i&chunkMask]
}

// shardOf returns the shard holding router hash h for slot's group.
func (x *Index) shardOf(slot uint16, h uint64) *shard {
	return x.groups[slot>>groupShift].Load().shardOf(h)
}

func slotBit(slot uint16) uint64 { return 1 << (slot & 63) }

// Register returns the handle for k, creating it (approximate, empty) if
// needed. blockSize is the engine's block size from discovery; 0 means learn
// it from the first stored event.
func (x *Index) Register(k Key, blockSize int) (*Worker, error) {
	if blockSize < 0 || blockSize > maxBlockSize {
		return nil, fmt.Errorf("%w: block size %d", ErrInvalidConfig, blockSize)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if w, ok := x.byKey[k]; ok {
		if blockSize > 0 && w.BlockSize() == 0 {
			w.blockSize.Store(int32(blockSize))
		}
		return w, nil
	}
	// Lowest free slot, so that workers stay packed into as few groups as
	// possible however often they come and go.
	slot := -1
	for i := x.minFree; i < len(x.workers); i++ {
		if x.workers[i] == nil {
			slot = i
			break
		}
	}
	if slot < 0 {
		if len(x.workers) >= maxSlots {
			return nil, fmt.Errorf("%w: %d workers", ErrTooManyWorkers, maxSlots)
		}
		slot = len(x.workers)
		x.workers = append(x.workers, nil)
	}
	if g := &x.groups[slot>>groupShift]; g.Load() == nil {
		g.Store(newGroup())
	}
	x.minFree = slot + 1
	w := &Worker{key: k, idx: x, slot: uint16(slot), engine: make(map[uint64]uint64), livePos: len(x.live)}
	w.blockSize.Store(int32(blockSize))
	x.workers[slot] = w
	x.live = append(x.live, w)
	x.byKey[k] = w
	return w, nil
}

// Lookup returns the handle registered for k. It takes the writers' mutex:
// call it when the fleet changes, not per request.
func (x *Index) Lookup(k Key) (*Worker, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	w, ok := x.byKey[k]
	return w, ok
}

// Unregister drops a worker's blocks and frees its slot. A MatchMany racing
// with it may still see the worker's blocks, or (if the slot is taken again
// at once) its successor's, for that one call.
func (x *Index) Unregister(w *Worker) {
	if w == nil || w.idx != x {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if w.removed.Load() {
		return
	}
	w.removed.Store(true)
	w.precise.Store(false)
	x.clearLocked(w)
	last := x.live[len(x.live)-1]
	x.live[w.livePos] = last
	last.livePos = w.livePos
	x.live = x.live[:len(x.live)-1]
	x.workers[w.slot] = nil
	x.minFree = min(x.minFree, int(w.slot))
	delete(x.byKey, w.key)
}

// Clear drops every block of w, as on AllBlocksCleared or a resync. It does
// not change w's mode. It costs O(w's blocks) under the writers' mutex.
func (x *Index) Clear(w *Worker) {
	if w == nil || w.idx != x {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if w.removed.Load() {
		return
	}
	x.clearLocked(w)
}

func (x *Index) clearLocked(w *Worker) {
	for w.lruHead != 0 {
		x.freeBlockLocked(w.lruHead)
	}
	w.engine = make(map[uint64]uint64)
	w.otherGroups = 0
}

// Touch marks hashes as recently used by w, typically the matched prefix of
// a request just routed to w, so that hot prefixes (which engines do not
// report on a hit) are not the first evicted.
func (x *Index) Touch(w *Worker, hashes []uint64) {
	if w == nil || w.idx != x || len(hashes) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if w.removed.Load() {
		return
	}
	x.touchLocked(w, hashes)
}

// touchLocked moves w's blocks of hashes to the front of its LRU, from the
// deepest up so the root ends up most recent: LRU then evicts leaves before
// the prefixes they hang from. The result is that of moving each found
// block to the front in turn (touchReference in the tests), cheaper in the
// two common cases:
//
//   - the blocks already lead the LRU in prefix order (the prefix was the
//     last one touched or stored): nothing moves;
//   - otherwise a block's hash is looked for first among the LRU
//     neighbours of the block of the next deeper hash (a chain stored or
//     touched together lies adjacent, root first) before the shard table. A
//     worker holds at most one block per hash, so a neighbour with the
//     hash is the block findLocked returns.
func (x *Index) touchLocked(w *Worker, hashes []uint64) {
	// The leading run of w's LRU that already equals hashes, in order.
	j := 0
	for i := w.lruHead; i != 0 && j < len(hashes); j++ {
		b := x.at(i)
		if b.hash != hashes[j] {
			break
		}
		i = b.next
	}
	if j == len(hashes) {
		return // every block in place: the moves below would change nothing
	}
	// Finding the block of hashes[k] does not depend on the LRU order, so
	// it is done before the block of hashes[k+1] moves, while that block's
	// neighbours are still the chain's.
	k := len(hashes) - 1
	cur := x.findLocked(hashes[k], w)
	for k >= 0 {
		var nxt uint32
		if k > 0 {
			h := hashes[k-1]
			if cur != 0 {
				b := x.at(cur)
				if b.prev != 0 && x.at(b.prev).hash == h {
					nxt = b.prev
				} else if b.next != 0 && x.at(b.next).hash == h {
					nxt = b.next
				}
			}
			if nxt == 0 {
				nxt = x.findLocked(h, w)
			}
		}
		if cur != 0 {
			x.lruMoveFrontLocked(w, cur)
		}
		cur = nxt
		k--
	}
}

// AppendEngineHashes appends to dst the engine's own hashes of the leading
// router hashes w holds, as its KV events named them, stopping at the
// first block w does not hold or whose engine hash is unknown (a learned
// prefix block). Engines that key their kvd blocks by these hashes (the
// simulator) can be asked for exactly those blocks. It takes the writers'
// lock: not for the per-request path.
func (x *Index) AppendEngineHashes(dst []uint64, w *Worker, hashes []uint64) []uint64 {
	if w == nil || w.idx != x {
		return dst
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if w.removed.Load() {
		return dst
	}
	for _, h := range hashes {
		i := x.findLocked(h, w)
		if i == 0 {
			break
		}
		e := x.at(i).engine
		if rh, ok := w.engine[e]; !ok || rh != h {
			break
		}
		dst = append(dst, e)
	}
	return dst
}

// Match returns how many leading hashes w caches (the longest cached
// prefix, in blocks). It does not allocate.
func (x *Index) Match(w *Worker, hashes []uint64) int {
	if w == nil || w.idx != x || w.removed.Load() {
		return 0
	}
	g, bit := x.groups[w.slot>>groupShift].Load(), slotBit(w.slot)
	for j, h := range hashes {
		sh := g.shardOf(h)
		mask, ok := sh.homeMask(h)
		if !ok {
			mask = sh.maskOf(h)
		}
		if mask&bit == 0 {
			return j
		}
	}
	return len(hashes)
}

// MatchMany writes to out[k] the longest cached prefix (in blocks) of hashes
// on ws[k], in one pass over hashes that stops at the first block no queried
// worker still matching holds. Per hash it costs one table probe and one
// 64-bit AND for each group of 64 slots the query touches (one, while the
// index has had at most 64 workers at once). out must have room for len(ws)
// results (extra entries are left alone); nil, foreign or unregistered
// handles get 0. It does not allocate in steady state.
func (x *Index) MatchMany(ws []*Worker, hashes []uint64, out []int) {
	if len(out) < len(ws) {
		ws = ws[:len(out)]
	}
	out = out[:len(ws)]
	for k := range out {
		out[k] = 0
	}
	if len(ws) == 0 || len(hashes) == 0 {
		return
	}
	// Group queries live on the stack (two groups: fleets up to 128
	// workers) and move to pooled scratch beyond that. The stack array is
	// never stored anywhere, so it does not escape.
	var local [2]groupQuery
	n := 0
	var sc *matchScratch
	for _, w := range ws {
		if w == nil || w.idx != x || w.removed.Load() {
			continue
		}
		gi := w.slot >> groupShift
		var q *groupQuery
		if sc == nil {
			q = findGroup(local[:n], gi)
		} else {
			q = findGroup(sc.qs, gi)
		}
		if q == nil {
			gq := groupQuery{g: x.groups[gi].Load(), gi: gi}
			switch {
			case sc == nil && n < len(local):
				local[n] = gq
				q = &local[n]
				n++
			default:
				if sc == nil {
					sc = x.pool.Get().(*matchScratch)
					sc.qs = append(sc.qs[:0], local[:n]...)
				}
				sc.qs = append(sc.qs, gq)
				q = &sc.qs[len(sc.qs)-1]
			}
		}
		q.live |= slotBit(w.slot)
	}
	qs := local[:n]
	if sc != nil {
		qs = sc.qs
	}
	matchGroups(qs, hashes)
	for k, w := range ws {
		if w == nil || w.idx != x {
			continue
		}
		if q := findGroup(qs, w.slot>>groupShift); q != nil && q.live&slotBit(w.slot) != 0 {
			out[k] = int(q.res[w.slot&63])
		}
	}
	if sc != nil {
		sc.qs = sc.qs[:0]
		x.pool.Put(sc)
	}
}

func findGroup(qs []groupQuery, gi uint16) *groupQuery {
	for i := range qs {
		if qs[i].gi == gi {
			return &qs[i]
		}
	}
	return nil
}

// matchGroups walks hashes until no queried worker still matches, recording
// in res the prefix length at which each worker dropped out.
func matchGroups(qs []groupQuery, hashes []uint64) {
	if len(qs) == 1 {
		matchGroup(&qs[0], hashes)
		return
	}
	remaining := 0
	for i := range qs {
		qs[i].active = qs[i].live
		if qs[i].active != 0 {
			remaining++
		}
	}
	j := 0
	for ; j < len(hashes) && remaining > 0; j++ {
		h := hashes[j]
		for i := range qs {
			q := &qs[i]
			if q.active == 0 {
				continue
			}
			sh := q.g.shardOf(h)
			mask, ok := sh.homeMask(h)
			if !ok {
				mask = sh.maskOf(h)
			}
			for dropped := q.active &^ mask; dropped != 0; dropped &= dropped - 1 {
				q.res[bits.TrailingZeros64(dropped)] = int32(j)
			}
			if q.active &= mask; q.active == 0 {
				remaining--
			}
		}
	}
	for i := range qs {
		for a := qs[i].active; a != 0; a &= a - 1 {
			qs[i].res[bits.TrailingZeros64(a)] = int32(j)
		}
	}
}

// matchGroup is matchGroups for one group (a fleet of at most 64 workers,
// the common case): its mask kept in a register, no loop over groups.
func matchGroup(q *groupQuery, hashes []uint64) {
	g, active := q.g, q.live
	j := 0
	for ; j < len(hashes) && active != 0; j++ {
		h := hashes[j]
		sh := g.shardOf(h)
		mask, ok := sh.homeMask(h)
		if !ok {
			mask = sh.maskOf(h)
		}
		for dropped := active &^ mask; dropped != 0; dropped &= dropped - 1 {
			q.res[bits.TrailingZeros64(dropped)] = int32(j)
		}
		active &= mask
	}
	for a := active; a != 0; a &= a - 1 {
		q.res[bits.TrailingZeros64(a)] = int32(j)
	}
	q.active = active
}

// ApplyResult counts what Apply did with a batch.
type ApplyResult struct {
	Stored        int // blocks newly indexed
	Refreshed     int // blocks stored again (already indexed)
	Removed       int // blocks removed
	Cleared       int // AllBlocksCleared events
	UnknownParent int // blocks dropped: parent engine hash unknown
	Skipped       int // blocks ignored: non-attention group, LoRA, extra keys, medium, block size
	UnknownRemove int // removals of engine hashes the index does not hold
	Learned       int // blocks learned from a routed prompt (parent stored before the index knew it)
	// Dropped has a bit set for every reason a stored block was not
	// indexed in this batch, so that the applier can log each reason.
	Dropped DropReasons
}

// DropReasons is a set of reasons for not indexing stored blocks.
type DropReasons uint8

// Drop reasons.
const (
	DropUnknownParent DropReasons = 1 << iota // parent engine hash unknown and not learnable
	DropKind                                  // non-attention kv_cache_spec_kind
	DropLoRA                                  // stored under a LoRA adapter
	DropExtraKeys                             // multimodal or cache-salt extra keys
	DropMedium                                // not the GPU tier
	DropBlockSize                             // block size differs from the worker's
	numDropReasons    = 6
)

var dropNames = [numDropReasons]string{"unknown_parent", "kv_cache_spec_kind", "lora", "extra_keys", "medium", "block_size"}

// String names one reason (snake_case, for logs and metrics); a set of
// several is named by its lowest reason.
func (d DropReasons) String() string {
	for i := range numDropReasons {
		if d&(1<<i) != 0 {
			return dropNames[i]
		}
	}
	return "none"
}

func ignoreDrop(r Ignore) DropReasons {
	switch r {
	case IgnoreKind:
		return DropKind
	case IgnoreLoRA:
		return DropLoRA
	case IgnoreExtraKeys:
		return DropExtraKeys
	case IgnoreMedium:
		return DropMedium
	}
	return 0
}

// Add accumulates r into a.
func (a *ApplyResult) Add(r ApplyResult) {
	a.Stored += r.Stored
	a.Refreshed += r.Refreshed
	a.Removed += r.Removed
	a.Cleared += r.Cleared
	a.UnknownParent += r.UnknownParent
	a.Skipped += r.Skipped
	a.UnknownRemove += r.UnknownRemove
	a.Learned += r.Learned
	a.Dropped |= r.Dropped
}

// Apply applies a decoded batch to w. Stored blocks get router hashes
// recomputed from their token ids, chained from the parent's router hash; a
// stored event whose parent engine hash is unknown is dropped (its hashes
// could not be computed). Apply does not change w's mode.
func (x *Index) Apply(w *Worker, b *Batch) ApplyResult {
	var res ApplyResult
	if w == nil || w.idx != x {
		return res
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if w.removed.Load() {
		return res
	}
	for k := range b.Events {
		ev := &b.Events[k]
		switch ev.Type {
		case EventBlockStored:
			x.applyStoredLocked(w, ev, &res)
		case EventBlockRemoved:
			x.applyRemovedLocked(w, ev, &res)
		case EventAllBlocksCleared:
			x.clearLocked(w)
			res.Cleared++
		}
	}
	return res
}

func (x *Index) applyStoredLocked(w *Worker, ev *Event, res *ApplyResult) {
	if ev.Ignore != IgnoreNone {
		if ev.Ignore == IgnoreKind && ev.HasGroup && ev.Group < 64 {
			w.otherGroups |= 1 << ev.Group
		}
		res.Skipped += len(ev.Hashes)
		res.Dropped |= ignoreDrop(ev.Ignore)
		return
	}
	if len(ev.Hashes) == 0 {
		return
	}
	bs := w.BlockSize()
	if bs == 0 && ev.BlockSize > 0 {
		bs = ev.BlockSize
		w.blockSize.Store(int32(bs))
	}
	if ev.BlockSize != bs {
		res.Skipped += len(ev.Hashes)
		res.Dropped |= DropBlockSize
		return
	}
	var parent uint64
	if ev.HasParent {
		r, ok := w.engine[ev.Parent]
		if !ok {
			r, ok = x.learnParentLocked(w, ev, bs, res)
		}
		if !ok {
			res.UnknownParent += len(ev.Hashes)
			res.Dropped |= DropUnknownParent
			return
		}
		parent = r
	}
	x.scratch = appendChainedHashes(x.scratch[:0], parent, ev.Tokens, bs)
	if len(x.scratch) != len(ev.Hashes) {
		// The decoder guarantees len(tokens) == len(hashes)*block_size; a
		// hand-built batch that breaks it is not applied.
		res.Skipped += len(ev.Hashes)
		return
	}
	// Store leaf first and touch the parent last, so the LRU order runs
	// parent, block 0, …, leaf: eviction takes leaves before the prefixes
	// they hang from, which would otherwise strand whole chains.
	for j := len(ev.Hashes) - 1; j >= 0; j-- {
		if x.storeLocked(w, x.scratch[j], ev.Hashes[j]) {
			res.Stored++
		} else {
			res.Refreshed++
		}
	}
	if ev.HasParent {
		if i := x.findLocked(parent, w); i != 0 {
			x.lruMoveFrontLocked(w, i)
		}
	}
}

func (x *Index) applyRemovedLocked(w *Worker, ev *Event, res *ApplyResult) {
	if ev.Ignore != IgnoreNone {
		res.Skipped += len(ev.Hashes)
		return
	}
	// Removals carry no kind; a group learned to be non-attention (e.g. a
	// sliding-window group sharing hashes with the full-attention group)
	// must not remove the attention group's blocks.
	if ev.HasGroup && ev.Group < 64 && w.otherGroups&(1<<ev.Group) != 0 {
		res.Skipped += len(ev.Hashes)
		return
	}
	for _, e := range ev.Hashes {
		r, ok := w.engine[e]
		if !ok {
			res.UnknownRemove++
			continue
		}
		w.raiseCapacity(w.blocks.Load())
		delete(w.engine, e)
		if i := x.findLocked(r, w); i != 0 {
			x.freeBlockLocked(i)
			res.Removed++
		}
	}
}

// findLocked returns w's block for router hash h, or 0. Writers read the
// shard without its lock or version: only writers (serialised by mu)
// modify it.
func (x *Index) findLocked(h uint64, w *Worker) uint32 {
	e := x.shardOf(w.slot, h).get(h)
	if e.mask&slotBit(w.slot) == 0 {
		return 0
	}
	for i := e.head; i != 0; {
		b := x.at(i)
		if b.slot == w.slot {
			return i
		}
		i = b.same
	}
	return 0
}

// storeLocked indexes router hash h (engine hash e) for w; it reports whether
// the block is new.
func (x *Index) storeLocked(w *Worker, h, e uint64) bool {
	return x.storeEngineLocked(w, h, e, true)
}

// storeEngineLocked is storeLocked; without hasEngine the block's engine
// hash is unknown (a learned prefix block) and only eviction or a clear
// removes it.
func (x *Index) storeEngineLocked(w *Worker, h, e uint64, hasEngine bool) bool {
	if i := x.findLocked(h, w); i != 0 {
		// Already indexed (re-store, or a second engine hash for the same
		// tokens): keep both engine hashes resolvable for removals/parents.
		if hasEngine {
			w.engine[e] = h
		}
		x.lruMoveFrontLocked(w, i)
		return false
	}
	if len(w.engine) > 2*int(w.blocks.Load())+1024 {
		x.sweepEngineMapLocked(w)
	}
	i := x.allocLocked()
	b := x.at(i)
	*b = block{hash: h, engine: e, slot: w.slot}
	sh := x.shardOf(w.slot, h)
	en := sh.get(h)
	b.same = en.head
	sh.set(h, entry{head: i, mask: en.mask | slotBit(w.slot)})
	x.lruPushFrontLocked(w, i)
	if hasEngine {
		w.engine[e] = h
	}
	w.blocks.Add(1)
	return true
}

// sweepEngineMapLocked drops engine-map entries whose router block is gone.
// Such entries arise only when one router block was stored under several
// engine hashes and then evicted; the sweep keeps the map within a constant
// factor of the worker's block count.
func (x *Index) sweepEngineMapLocked(w *Worker) {
	for e, h := range w.engine {
		if x.findLocked(h, w) == 0 {
			delete(w.engine, e)
		}
	}
}

// allocLocked returns a free block index; at the bound it first evicts the
// least recently used block of the worker holding the most.
func (x *Index) allocLocked() uint32 {
	if x.used >= x.maxBlocks {
		var victim *Worker
		for _, w := range x.live {
			if w.lruTail != 0 && (victim == nil || w.blocks.Load() > victim.blocks.Load()) {
				victim = w
			}
		}
		if victim != nil {
			x.freeBlockLocked(victim.lruTail)
		}
	}
	x.used++
	if i := x.free; i != 0 {
		x.free = x.at(i).next
		return i
	}
	i := x.hwm
	x.hwm++
	if c := i >> chunkShift; x.chunks[c] == nil {
		x.chunks[c] = make([]block, chunkSize)
	}
	return i
}

// freeBlockLocked unlinks block i from its hash list (recomputing the
// hash's worker mask) and its worker's LRU, fixes the worker's bookkeeping
// and puts the block on the free list.
func (x *Index) freeBlockLocked(i uint32) {
	b := x.at(i)
	sh := x.shardOf(b.slot, b.hash)
	en := sh.get(b.hash)
	var mask uint64
	var prev uint32
	for p := en.head; p != 0; p = x.at(p).same {
		if p == i {
			continue
		}
		pb := x.at(p)
		mask |= slotBit(pb.slot)
		if pb.same == i {
			prev = p
		}
	}
	head := en.head
	if head == i {
		head = b.same
	}
	// Readers see masks only, never the same-hash lists, so the list is
	// relinked before the entry changes.
	if prev != 0 {
		x.at(prev).same = b.same
	}
	if head == 0 {
		sh.del(b.hash)
	} else {
		sh.set(b.hash, entry{head: head, mask: mask})
	}
	w := x.workers[b.slot]
	x.lruUnlinkLocked(w, i)
	if w.engine[b.engine] == b.hash {
		delete(w.engine, b.engine)
	}
	w.blocks.Add(-1)
	b.next = x.free
	x.free = i
	x.used--
}

func (x *Index) lruPushFrontLocked(w *Worker, i uint32) {
	b := x.at(i)
	b.prev = 0
	b.next = w.lruHead
	if w.lruHead != 0 {
		x.at(w.lruHead).prev = i
	} else {
		w.lruTail = i
	}
	w.lruHead = i
}

func (x *Index) lruUnlinkLocked(w *Worker, i uint32) {
	b := x.at(i)
	if b.prev != 0 {
		x.at(b.prev).next = b.next
	} else {
		w.lruHead = b.next
	}
	if b.next != 0 {
		x.at(b.next).prev = b.prev
	} else {
		w.lruTail = b.prev
	}
	b.prev, b.next = 0, 0
}

func (x *Index) lruMoveFrontLocked(w *Worker, i uint32) {
	if w.lruHead == i {
		return
	}
	x.lruUnlinkLocked(w, i)
	x.lruPushFrontLocked(w, i)
}

// Seed indexes router hashes for w without engine hashes, as a snapshot of
// another view (the NATS view bucket) provides them: only eviction or a
// clear removes them. It reports how many were new.
func (x *Index) Seed(w *Worker, hashes []uint64) int {
	if w == nil || w.idx != x {
		return 0
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if w.removed.Load() {
		return 0
	}
	n := 0
	for _, h := range hashes {
		if x.storeEngineLocked(w, h, 0, false) {
			n++
		}
	}
	return n
}

// AppendHashes appends the router hashes w holds, most recent first.
func (x *Index) AppendHashes(dst []uint64, w *Worker) []uint64 {
	if w == nil || w.idx != x {
		return dst
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if w.removed.Load() {
		return dst
	}
	for i := w.lruHead; i != 0; i = x.at(i).next {
		dst = append(dst, x.at(i).hash)
	}
	return dst
}
