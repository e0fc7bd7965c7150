package kvd

// slabs is the arena's size-class allocator (as memcached's and Redis's
// slab allocators): the arena is cut into pages of pageSize bytes, each
// page belongs to one class at a time and is cut into that class's slots.
// Class slot sizes are the page size divided by 1, 2, … 8, then by
// factors growing about 1.25× and by every power of two (multiples of
// 64, down to 64 bytes), so values of every size up to pageSize-HeaderBytes
// live side by side. A page whose slots are all free goes back to the
// free pages; a class short of slots takes a free page, or reclaims a
// page of another class whose entries may all be evicted.
//
// Every slot keeps the 16-byte header the protocol fixes (version,
// length, reserved) at its start; a slot starts at page*pageSize +
// i*slotSize, a multiple of 64. slabs is not safe for concurrent use:
// the Store's mutex guards it.
type slabs struct {
	pageSize int
	classes  []slabClass
	pages    []slabPage
	free     []int32 // free pages, popped from the end
}

type slabClass struct {
	size  int   // slot size, header included
	per   int   // slots per page
	free  []int // free slot offsets
	pages int   // pages held
	used  int   // slots holding an entry or a lease
	bytes int64 // payload bytes stored
}

type slabPage struct {
	class  int8 // -1: free
	used   int32
	leased int32
	byRet  [numRetentions]int32 // entries on the page by retention
	owners []*entry             // slot index → entry (nil: free or leased)
}

// slabGrowth is the class growth factor, in quarters (5/4 = 1.25).
const slabGrowth = 5

// newSlabs lays out an arena of size bytes with pages of pageSize bytes
// (a multiple of SlotAlign).
func newSlabs(size int64, pageSize int) *slabs {
	sl := &slabs{pageSize: pageSize}
	// Slot sizes pageSize/k (rounded down to 64) so slots tile a page, k
	// stepping by about 1.25× (every k up to 8) and every power of two
	// (KV blocks are), down to 64 bytes.
	var sizes []int // descending
	for k, p2 := 1, 1; ; {
		kk := min(k, p2)
		ss := pageSize / kk / SlotAlign * SlotAlign
		if ss < SlotAlign {
			break
		}
		if len(sizes) == 0 || sizes[len(sizes)-1] != ss {
			sizes = append(sizes, ss)
		}
		if kk == k {
			k = max(k+1, k*slabGrowth/4)
		}
		if kk == p2 {
			p2 *= 2
		}
	}
	if sizes[len(sizes)-1] != SlotAlign {
		sizes = append(sizes, SlotAlign)
	}
	for i := len(sizes) - 1; i >= 0; i-- {
		sl.classes = append(sl.classes, slabClass{size: sizes[i], per: pageSize / sizes[i]})
	}
	n := int(size / int64(pageSize))
	sl.pages = make([]slabPage, n)
	sl.free = make([]int32, n)
	for i := range n {
		sl.pages[i].class = -1
		sl.free[i] = int32(n - 1 - i) // pop from the end: page 0 first
	}
	return sl
}

// classFor is the smallest class whose slot holds a payload of n bytes;
// -1 when none does.
func (sl *slabs) classFor(n int) int {
	need := n + HeaderBytes
	if need > sl.pageSize {
		return -1
	}
	lo, hi := 0, len(sl.classes)-1
	for lo < hi {
		mid := (lo + hi) / 2
		if sl.classes[mid].size >= need {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// maxPayload is the largest value a slot can hold.
func (sl *slabs) maxPayload() int { return sl.pageSize - HeaderBytes }

func (sl *slabs) page(off int) (int, int) {
	return off / sl.pageSize, (off % sl.pageSize) / sl.classes[sl.pages[off/sl.pageSize].class].size
}

// takeFree pops a free slot of class c, assigning a free page to the
// class when it has none; false when neither is there.
func (sl *slabs) takeFree(c int) (int, bool) {
	cl := &sl.classes[c]
	if len(cl.free) == 0 {
		if len(sl.free) == 0 {
			return 0, false
		}
		pg := int(sl.free[len(sl.free)-1])
		sl.free = sl.free[:len(sl.free)-1]
		p := &sl.pages[pg]
		p.class = int8(c)
		if cap(p.owners) >= cl.per {
			p.owners = p.owners[:cl.per]
		} else {
			p.owners = make([]*entry, cl.per)
		}
		base := pg * sl.pageSize
		for i := cl.per - 1; i >= 0; i-- {
			cl.free = append(cl.free, base+i*cl.size)
		}
		cl.pages++
	}
	off := cl.free[len(cl.free)-1]
	cl.free = cl.free[:len(cl.free)-1]
	cl.used++
	sl.pages[off/sl.pageSize].used++
	return off, true
}

// lease marks a taken slot as leased (not evictable) until own or release.
func (sl *slabs) lease(off int) { sl.pages[off/sl.pageSize].leased++ }

// own records e in its taken (or formerly leased) slot.
func (sl *slabs) own(e *entry, wasLeased bool) {
	pg, i := sl.page(e.slot)
	p := &sl.pages[pg]
	if wasLeased {
		p.leased--
	}
	p.owners[i] = e
	p.byRet[e.ret]++
	sl.classes[p.class].bytes += int64(e.length)
}

// release frees a slot (an entry's, when e is not nil, or a lease's);
// an emptied page goes back to the free pages.
func (sl *slabs) release(off int, e *entry, wasLeased bool) {
	pg, i := sl.page(off)
	p := &sl.pages[pg]
	c := int(p.class)
	cl := &sl.classes[c]
	if e != nil {
		p.owners[i] = nil
		p.byRet[e.ret]--
		cl.bytes -= int64(e.length)
	}
	if wasLeased {
		p.leased--
	}
	p.used--
	cl.used--
	cl.free = append(cl.free, off)
	if p.used == 0 {
		sl.freePage(pg)
	}
}

// freePage returns an empty page of a class to the free pages.
func (sl *slabs) freePage(pg int) {
	p := &sl.pages[pg]
	cl := &sl.classes[p.class]
	base, end := pg*sl.pageSize, (pg+1)*sl.pageSize
	k := 0
	for _, off := range cl.free {
		if off < base || off >= end {
			cl.free[k] = off
			k++
		}
	}
	cl.free = cl.free[:k]
	cl.pages--
	p.class = -1
	sl.free = append(sl.free, int32(pg))
}

// reclaimable finds a page of a class other than c that canReclaim at
// retention r; -1 when there is none.
func (sl *slabs) reclaimable(c int, r Retention) int {
	for pg := range sl.pages {
		if int(sl.pages[pg].class) != c && sl.canReclaim(pg, r) {
			return pg
		}
	}
	return -1
}

// canReclaim says whether page pg is held by a class, has no lease and
// holds no entry of retention above r.
func (sl *slabs) canReclaim(pg int, r Retention) bool {
	p := &sl.pages[pg]
	if p.class < 0 || p.leased != 0 {
		return false
	}
	for h := r + 1; h < numRetentions; h++ {
		if p.byRet[h] != 0 {
			return false
		}
	}
	return true
}

// ClassStat is one size class's use of the arena.
type ClassStat struct {
	SlotSize   int64 // bytes per slot, header included
	Pages      int64 // pages the class holds
	Slots      int64 // slots in those pages
	UsedSlots  int64 // slots holding an entry or a lease
	ValueBytes int64 // payload bytes stored
}

// stats appends the classes that hold pages.
func (sl *slabs) stats(dst []ClassStat) []ClassStat {
	for _, cl := range sl.classes {
		if cl.pages == 0 {
			continue
		}
		dst = append(dst, ClassStat{SlotSize: int64(cl.size), Pages: int64(cl.pages), Slots: int64(cl.pages * cl.per), UsedSlots: int64(cl.used), ValueBytes: cl.bytes})
	}
	return dst
}
