package kvd

import (
	"encoding/binary"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Retention is an entry's eviction class; RAM evicts none before ephemeral
// before short before long, and by LRU within a class.
type Retention uint8

// Retention classes, in eviction order.
const (
	RetentionNone Retention = iota
	RetentionEphemeral
	RetentionShort
	RetentionLong
	numRetentions
)

var retentionNames = [numRetentions]string{"none", "ephemeral", "short", "long"}

func (r Retention) String() string {
	if r < numRetentions {
		return retentionNames[r]
	}
	return ""
}

// Priority is the reference's number for r (0, 10, 50, 100).
func (r Retention) Priority() int {
	return [numRetentions]int{0, 10, 50, 100}[r]
}

// ParseRetention maps a wire name to a Retention.
func ParseRetention(b []byte) (Retention, bool) {
	for i := range numRetentions {
		if string(b) == retentionNames[i] {
			return i, true
		}
	}
	return 0, false
}

// Reasons a set is refused (set_ack / set_commit_response "reason").
const (
	ReasonBadRetention      = "bad_retention"
	ReasonDowngrade         = "retention_downgrade_not_allowed"
	ReasonDisplaceHigher    = "would_displace_higher_priority"
	ReasonLargerThanStore   = "value_larger_than_store"
	ReasonNoArena           = "no_arena"
	ReasonOversize          = "oversize"
	ReasonBadSize           = "bad_size"
	ReasonArenaFull         = "arena_full_no_evictable"
	ReasonUnknownLease      = "unknown_lease"
	ReasonWrongOwner        = "wrong_owner"
	ReasonOversizeCommit    = "oversize_commit"
	ReasonEmptyKey          = "empty_key"
	ReasonLongWriteRejected = "long_write_rejected"
)

// LongStore is the L3 tier below RAM (the tablespace). Keys are opaque
// (kvd passes its composite namespace+key); Put is durable when it returns;
// Get returns the not-found error named in StoreOptions.LongNotFound on a
// miss. Implementations are safe for concurrent use.
type LongStore interface {
	Put(key, value []byte) error
	Get(key, dst []byte) ([]byte, error)
	Exists(key []byte) bool
	Delete(key []byte) error
	Clear() error
	Len() int
	UsedBytes() int64
	Close() error
}

// LongPrefixDeleter is implemented by an L3 that can remove, durably,
// every key that starts with a prefix. Clearing one namespace needs it to
// reach L3 (its keys start with the namespace's composite prefix); over an
// L3 without it such a clear drops the RAM entries only, and says so in
// the log.
type LongPrefixDeleter interface {
	DeletePrefix(prefix []byte) (int, error)
}

// StoreOptions configure a Store.
type StoreOptions struct {
	// MaxBytes is the RAM budget: the arena plus inline values.
	MaxBytes int64
	// Arena, when set, holds values that fit its slot; the rest are inline
	// within MaxBytes - Arena.Size().
	Arena *Arena
	// SlotBytes, when positive, is the arena's largest slot (header
	// included, rounded up to 64): its page size. Zero picks
	// arena/16, at least 64 KiB or the whole arena, at most 4 MiB.
	// Values that fit no slot are inline.
	SlotBytes int
	// Long is the optional L3 tier; LongNotFound is its miss error.
	Long         LongStore
	LongNotFound error
	// LongQueue bounds pending long write-throughs (overflow is dropped
	// and counted); PrefetchQueue bounds pending prefetch keys.
	LongQueue     int
	PrefetchQueue int
	// Now is the clock for TTLs (tests inject one); nil is time.Now.
	Now func() time.Time
	Log zerolog.Logger
}

// maxTTLSeconds caps a TTL (about 100 years) so expiry times cannot overflow.
const maxTTLSeconds = 100 * 365 * 24 * 3600

type entry struct {
	key        string // composite: u16 len | model | u16 len | compat_key | key
	nsLen      int    // bytes of key that are the namespace
	ret        Retention
	expires    int64 // unix ns; 0 = no TTL
	slot       int   // arena slot's start offset, -1 = inline
	length     int
	inline     []byte // immutable once stored
	warmed     bool   // inserted by prefetch, not yet read
	used       uint64 // Store.ticks at the last use: LRU order across classes
	prev, next *entry
}

type lruList struct{ head, tail *entry }

// touch makes e the most recently used entry of its list. Caller holds mu.
func (s *Store) touch(e *entry) {
	s.ticks++
	e.used = s.ticks
	s.list(e).pushFront(e)
}

func (l *lruList) pushFront(e *entry) {
	e.prev, e.next = nil, l.head
	if l.head != nil {
		l.head.prev = e
	}
	l.head = e
	if l.tail == nil {
		l.tail = e
	}
}

func (l *lruList) remove(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

type lease struct {
	slot int
	size int
	conn uint64
}

type prefetchItem struct {
	key string
	ttl time.Duration
}

// Counters is a snapshot of a Store's counters.
type Counters struct {
	Entries, ArenaEntries, InlineEntries int64
	HostBytes, InlineBytes               int64
	LongBytes, LongEntries               int64
	Gets, Sets, Hits, Misses, Evictions  int64
	EvictionsByRetention                 [numRetentions]int64
	Expired, Rejected                    int64
	SlotSize, NumSlots, FreeSlots        int64 // largest slot; slots in pages held; free among them
	Pages, FreePages                     int64
	Classes                              []ClassStat // classes holding pages
	LeasesActive                         int64
	LeasesCommitted, LeasesCancelled     int64
	LongWrites, LongWriteErrors          int64
	LongWritesDropped, LongHits          int64
	PrefetchHints, PrefetchFetched       int64
	PrefetchDropped, PrefetchUseful      int64
	TornReads                            int64
}

// Store is the RAM tier (L2) over the optional shared arena, with the L3
// write-through and the prefetch worker. One mutex guards the index, the
// allocator and the counters; small values are copied into arena slots
// under it, large ones (≥ 64 KiB) into a slot the writer owns without it,
// and readers copy out without it (seqlock).
type Store struct {
	opt   StoreOptions
	arena *Arena
	log   zerolog.Logger

	mu           sync.Mutex
	index        map[string]*entry
	arenaLRU     [][numRetentions]lruList // by size class
	inlineLRU    [numRetentions]lruList
	sl           *slabs // nil without an arena
	ticks        uint64 // use counter for entry.used
	leases       map[uint64]lease
	nextLease    uint64
	inlineBytes  int64
	inlineBudget int64
	arenaBytes   int64
	arenaEntries int64
	kb           []byte // composite-key scratch, under mu
	c            Counters
	closed       bool

	// clears counts clears (under mu): a promotion from L3 read before a
	// clear does not reinsert into RAM after it.
	clears uint64
	// longMu serializes the L3 side of Clear with the write-through: the
	// writer holds it from reading an entry until its Put is done (taken
	// before mu), so a clear never runs between them.
	longMu    sync.Mutex
	nsWarned  bool
	longQ     chan string
	prefetchQ chan prefetchItem
	stop      chan struct{}
	wg        sync.WaitGroup
}

// NewStore starts a Store (and its L3 workers when Long is set).
func NewStore(opt StoreOptions) (*Store, error) {
	if opt.MaxBytes <= 0 {
		return nil, errors.Join(ErrConfig, errors.New("max bytes must be positive"))
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.LongQueue <= 0 {
		opt.LongQueue = 1024
	}
	if opt.PrefetchQueue <= 0 {
		opt.PrefetchQueue = 64
	}
	s := &Store{opt: opt, arena: opt.Arena, log: opt.Log, index: map[string]*entry{}, leases: map[uint64]lease{}, nextLease: 1, stop: make(chan struct{})}
	s.inlineBudget = opt.MaxBytes
	if s.arena != nil {
		s.inlineBudget = max(opt.MaxBytes-s.arena.Size(), 0)
	}
	if opt.SlotBytes > 0 && (s.arena == nil || int64(opt.SlotBytes) > s.arena.Size() || opt.SlotBytes <= HeaderBytes) {
		return nil, errors.Join(ErrConfig, errors.New("slot bytes must fit the arena and exceed the slot header"))
	}
	if s.arena != nil {
		// Pages of arena/16 (at least 64 KiB or the whole arena, at most 4 MiB).
		page := int(min(defaultPageBytes, max(s.arena.Size()/16, min(s.arena.Size(), 64<<10)))) / SlotAlign * SlotAlign
		if opt.SlotBytes > 0 {
			page = min((opt.SlotBytes+SlotAlign-1)/SlotAlign*SlotAlign, int(s.arena.Size())/SlotAlign*SlotAlign)
		}
		s.sl = newSlabs(s.arena.Size(), max(page, 2*SlotAlign))
		s.arenaLRU = make([][numRetentions]lruList, len(s.sl.classes))
	}
	if opt.Long != nil {
		s.longQ = make(chan string, opt.LongQueue)
		s.prefetchQ = make(chan prefetchItem, opt.PrefetchQueue)
		s.wg.Add(2)
		go s.longWriter()
		go s.prefetcher()
	}
	return s, nil
}

// Arena is the store's shared arena (nil without one).
func (s *Store) Arena() *Arena { return s.arena }

// defaultPageBytes is the largest arena page (and slot) when
// StoreOptions.SlotBytes is not set.
const defaultPageBytes = 4 << 20

// SlotSize is the arena's largest slot size (its page size; 0 without an
// arena). Each hit carries its own slot's size.
func (s *Store) SlotSize() int {
	if s.sl == nil {
		return 0
	}
	return s.sl.pageSize
}

// MaxArenaValue is the largest value an arena slot holds (0 without an
// arena).
func (s *Store) MaxArenaValue() int {
	if s.sl == nil {
		return 0
	}
	return s.sl.maxPayload()
}

// Close stops the workers after the pending long writes are written.
func (s *Store) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.stop)
	if s.longQ != nil {
		close(s.longQ)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Composite builds the store's key for (model, compat_key, key) into dst:
// each namespace part length-prefixed so no two namespaces collide. It is
// also the L3 key.
func Composite(dst, model, compat, key []byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst[:0], uint16(len(model)))
	dst = append(dst, model...)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(compat)))
	dst = append(dst, compat...)
	return append(dst, key...)
}

func (s *Store) nowNs() int64 { return s.opt.Now().UnixNano() }

// lookup finds the live entry for the composite key in s.kb, dropping it
// when its TTL passed. Caller holds mu.
func (s *Store) lookup(now int64) *entry {
	e := s.index[string(s.kb)]
	if e != nil && e.expires != 0 && now >= e.expires {
		s.removeLocked(e)
		s.c.Expired++
		return nil
	}
	return e
}

func (s *Store) list(e *entry) *lruList {
	if e.slot >= 0 {
		return &s.arenaLRU[s.sl.pages[e.slot/s.sl.pageSize].class][e.ret]
	}
	return &s.inlineLRU[e.ret]
}

// removeLocked drops e from the index and frees its memory.
func (s *Store) removeLocked(e *entry) {
	s.list(e).remove(e)
	delete(s.index, e.key)
	if e.slot >= 0 {
		s.sl.release(e.slot, e, false)
		s.arenaBytes -= int64(e.length)
		s.arenaEntries--
	} else {
		s.inlineBytes -= int64(len(e.inline))
		e.inline = nil
	}
}

// evictLocked evicts the least recently used entry of the lowest class up
// to maxRet from lists; false when there is none.
func (s *Store) evictLocked(lists *[numRetentions]lruList, maxRet Retention) bool {
	for r := range maxRet + 1 {
		if e := lists[r].tail; e != nil {
			s.removeLocked(e)
			s.c.Evictions++
			s.c.EvictionsByRetention[r]++
			return true
		}
	}
	return false
}

// allocSlot takes a free slot of class c: a free one, one of a free page,
// or one freed by evicting entries of retention ≤ maxRet, lowest
// retention first and least recently used first across classes: at each
// retention, the class's own least recently used entry, unless another
// class's least recently used entry is older and its page can be taken
// (no lease on it, no entry above that retention) — then every entry of
// that page is evicted and the page changes class. The slot comes back
// leased (see slabs.lease). Caller holds mu.
func (s *Store) allocSlot(c int, maxRet Retention) (int, bool) {
	for r := Retention(0); ; {
		if off, ok := s.sl.takeFree(c); ok {
			s.sl.lease(off)
			return off, true
		}
		if r > maxRet {
			return -1, false
		}
		own := s.arenaLRU[c][r].tail
		pg := -1
		if own != nil {
			// An older entry of another class whose page can go.
			oldest := own.used
			for oc := range s.arenaLRU {
				if e := s.arenaLRU[oc][r].tail; oc != c && e != nil && e.used < oldest && s.sl.canReclaim(e.slot/s.sl.pageSize, r) {
					pg, oldest = e.slot/s.sl.pageSize, e.used
				}
			}
			if pg < 0 {
				s.evictEntry(own)
				continue
			}
		} else if pg = s.sl.reclaimable(c, r); pg < 0 {
			r++
			continue
		}
		for _, e := range s.sl.pages[pg].owners {
			if e != nil {
				s.evictEntry(e)
			}
		}
		if s.sl.pages[pg].class >= 0 {
			r++ // a slot of the page is being written outside mu
		}
	}
}

func (s *Store) evictEntry(e *entry) {
	s.c.EvictionsByRetention[e.ret]++
	s.c.Evictions++
	s.removeLocked(e)
}

// SetArgs is one set.
type SetArgs struct {
	Model, CompatKey, Key, Value []byte
	Retention                    []byte // wire name; nil = short
	TTL                          float64
	HasTTL                       bool
	// Warmed marks a prefetched value (a kvd-to-kvd pull): its first get
	// counts as a useful prefetch, as an L3 prefetch's does.
	Warmed bool
}

// Set stores a value. A non-empty reason says why it was refused.
func (s *Store) Set(a *SetArgs) (bool, string) {
	ret := RetentionShort
	if a.Retention != nil {
		r, ok := ParseRetention(a.Retention)
		if !ok {
			return false, ReasonBadRetention
		}
		ret = r
	}
	if len(a.Key) == 0 {
		return false, ReasonEmptyKey
	}
	var expires int64
	if a.HasTTL {
		if a.TTL <= 0 {
			return true, "" // the reference acks and does not store
		}
		expires = s.nowNs() + int64(min(a.TTL, maxTTLSeconds)*1e9)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.c.Sets++
	ok, reason := s.putLocked(a.Model, a.CompatKey, a.Key, a.Value, ret, expires, false)
	if !ok {
		s.c.Rejected++
	} else if a.Warmed {
		if e := s.index[string(s.kb)]; e != nil {
			e.warmed = true
		}
	}
	return ok, reason
}

// unlockedCopyBytes: values at least this large are copied into their
// slot without holding the store's mutex (the slot is owned by the writer
// meanwhile: neither free, leased nor indexed).
const unlockedCopyBytes = 64 << 10

// putLocked inserts a value; fromL3 marks a promotion (no write-through).
// The caller holds mu; for a large arena value it is released during the
// copy and held again on return.
func (s *Store) putLocked(model, compat, key, value []byte, ret Retention, expires int64, fromL3 bool) (bool, string) {
	s.kb = Composite(s.kb, model, compat, key)
	if old := s.lookup(s.nowNs()); old != nil && ret < old.ret {
		return false, ReasonDowngrade
	}
	cls := -1
	if s.sl != nil {
		cls = s.sl.classFor(len(value))
	}
	toArena := cls >= 0
	if !toArena && int64(len(value)) > s.inlineBudget {
		return false, ReasonLargerThanStore
	}
	if toArena {
		base, ok := s.allocSlot(cls, ret)
		if !ok {
			return false, ReasonDisplaceHigher
		}
		beginWrite(s.arena.mem, base)
		if len(value) >= unlockedCopyBytes {
			s.mu.Unlock()
			copy(s.arena.mem[base+HeaderBytes:], value)
			s.mu.Lock()
			s.kb = Composite(s.kb, model, compat, key)
		} else {
			copy(s.arena.mem[base+HeaderBytes:], value)
		}
		endWrite(s.arena.mem, base, len(value))
		return s.publishLocked(model, compat, base, len(value), ret, expires, fromL3)
	}
	old := s.index[string(s.kb)] // the entry replaced, reused for the new value
	if old != nil {
		s.removeLocked(old)
	}
	for s.inlineBytes+int64(len(value)) > s.inlineBudget {
		if !s.evictLocked(&s.inlineLRU, ret) {
			return false, ReasonDisplaceHigher
		}
	}
	e := s.entryLocked(old, model, compat, -1, len(value), ret, expires)
	e.inline = append(make([]byte, 0, len(value)), value...)
	s.inlineBytes += int64(len(value))
	s.indexLocked(e, fromL3)
	return true, ""
}

// publishLocked indexes a written arena slot (leased by allocSlot, its
// version even again) under the composite key in s.kb, replacing the
// key's entry unless that has a higher retention (then the slot is freed
// and the set refused: another writer may have stored the key while the
// slot was written outside mu). Caller holds mu.
func (s *Store) publishLocked(model, compat []byte, slot, length int, ret Retention, expires int64, fromL3 bool) (bool, string) {
	old := s.lookup(s.nowNs())
	if old != nil {
		if ret < old.ret {
			s.sl.release(slot, nil, true)
			return false, ReasonDowngrade
		}
		s.removeLocked(old)
	}
	s.arenaBytes += int64(length)
	s.arenaEntries++
	e := s.entryLocked(old, model, compat, slot, length, ret, expires)
	s.sl.own(e, true)
	s.indexLocked(e, fromL3)
	return true, ""
}

// entryLocked makes the entry for the key in s.kb. An overwrite reuses the
// replaced entry and its key string (nothing outside mu keeps an *entry),
// so setting an existing key in the arena allocates nothing.
func (s *Store) entryLocked(old *entry, model, compat []byte, slot, length int, ret Retention, expires int64) *entry {
	e := old
	if e == nil {
		e = &entry{key: string(s.kb)}
	}
	*e = entry{key: e.key, nsLen: 4 + len(model) + len(compat), ret: ret, expires: expires, slot: slot, length: length}
	return e
}

// indexLocked makes e findable and recently used, and queues a long
// entry's write to L3 unless it came from there.
func (s *Store) indexLocked(e *entry, fromL3 bool) {
	s.index[e.key] = e
	s.touch(e)
	if e.ret == RetentionLong && !fromL3 {
		s.writeThroughLocked(e.key)
	}
}

func (s *Store) writeThroughLocked(key string) {
	if s.longQ == nil || s.closed {
		return
	}
	select {
	case s.longQ <- key:
	default:
		s.c.LongWritesDropped++
	}
}

// Scratch is a caller's reusable buffers for Get and Exists (one per
// connection): Value receives L3 reads, Key the L3 key. The zero value
// works; a nil *Scratch allocates.
type Scratch struct {
	Value, Key []byte
}

// Hit is where a get found its value: an arena slot (Offset, Length,
// Version) or inline bytes. Inline bytes are immutable and may be kept.
type Hit struct {
	Found     bool
	Arena     bool
	Offset    int
	Length    int
	Version   uint32
	SlotSize  int // the arena slot's size, header included
	Inline    []byte
	Retention Retention
}

// Get looks a key up in RAM, then in L3 (promoting a hit into RAM). An
// inline Hit from L3 aliases sc.Value until the next call with sc.
func (s *Store) Get(model, compat, key []byte, sc *Scratch) Hit {
	h, miss, gen := s.getRAM(model, compat, key)
	if !miss || s.opt.Long == nil {
		return h
	}
	if sc == nil {
		sc = &Scratch{}
	}
	sc.Key = Composite(sc.Key, model, compat, key)
	v, err := s.opt.Long.Get(sc.Key, sc.Value[:0])
	if cap(v) >= cap(sc.Value) {
		sc.Value = v
	}
	if err != nil {
		if !errors.Is(err, s.opt.LongNotFound) {
			s.log.Warn().Err(err).Msg("l3 read failed")
		}
		s.mu.Lock()
		s.c.Misses++
		s.mu.Unlock()
		return Hit{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.c.Hits++
	s.c.LongHits++
	if s.clears != gen { // cleared meanwhile: answer, do not promote
		return Hit{Found: true, Inline: v, Length: len(v), Retention: RetentionLong}
	}
	if ok, _ := s.putLocked(model, compat, key, v, RetentionLong, 0, true); ok {
		if e := s.index[string(s.kb)]; e != nil {
			return s.hitLocked(e)
		}
	}
	return Hit{Found: true, Inline: v, Length: len(v), Retention: RetentionLong}
}

// getRAM answers from RAM; miss is true when L3 should be asked.
func (s *Store) getRAM(model, compat, key []byte) (Hit, bool, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.c.Gets++
	s.kb = Composite(s.kb, model, compat, key)
	e := s.lookup(s.nowNs())
	if e == nil {
		if s.opt.Long == nil {
			s.c.Misses++
		}
		return Hit{}, true, s.clears
	}
	s.c.Hits++
	if e.warmed {
		e.warmed = false
		s.c.PrefetchUseful++
	}
	s.list(e).remove(e)
	s.touch(e)
	return s.hitLocked(e), false, s.clears
}

func (s *Store) hitLocked(e *entry) Hit {
	h := Hit{Found: true, Length: e.length, Retention: e.ret}
	if e.slot >= 0 {
		base := e.slot
		h.Arena, h.Offset, h.Version = true, base+HeaderBytes, slotVersion(s.arena.mem, base+HeaderBytes)
		h.SlotSize = s.sl.classes[s.sl.pages[base/s.sl.pageSize].class].size
	} else {
		h.Inline = e.inline
	}
	return h
}

// StillValid says whether an arena hit's slot still holds its value; a
// copy made from the slot is only good if it does afterwards. A false
// answer is counted as a torn read.
func (s *Store) StillValid(h Hit) bool {
	if slotVersion(s.arena.mem, h.Offset) == h.Version {
		return true
	}
	s.mu.Lock()
	s.c.TornReads++
	s.mu.Unlock()
	return false
}

// Resident reports presence in RAM only.
func (s *Store) Resident(model, compat, key []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kb = Composite(s.kb, model, compat, key)
	return s.lookup(s.nowNs()) != nil
}

// Exists reports presence in RAM or L3 without promoting.
func (s *Store) Exists(model, compat, key []byte, sc *Scratch) bool {
	s.mu.Lock()
	s.kb = Composite(s.kb, model, compat, key)
	if s.lookup(s.nowNs()) != nil {
		s.mu.Unlock()
		return true
	}
	s.mu.Unlock()
	if s.opt.Long == nil {
		return false
	}
	if sc == nil {
		sc = &Scratch{}
	}
	sc.Key = Composite(sc.Key, model, compat, key)
	return s.opt.Long.Exists(sc.Key)
}

// Reserve leases an arena slot for a zero-copy write of size bytes; the
// slot's version stays odd until commit. Without a retention to compare,
// it evicts the least recently used entry of the lowest class present.
func (s *Store) Reserve(size int, conn uint64) (token uint64, slot int32, payloadOff, maxSize int, reason string) {
	if s.arena == nil {
		return 0, -1, 0, 0, ReasonNoArena
	}
	if size <= 0 {
		return 0, -1, 0, 0, ReasonBadSize
	}
	if int64(size) > s.arena.Size() {
		return 0, -1, 0, 0, ReasonOversize
	}
	cls := s.sl.classFor(size)
	if cls < 0 {
		return 0, -1, 0, 0, ReasonOversize
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	base, ok := s.allocSlot(cls, RetentionLong)
	if !ok {
		return 0, -1, 0, 0, ReasonArenaFull
	}
	token = s.nextLease
	s.nextLease++
	s.leases[token] = lease{slot: base, size: size, conn: conn}
	beginWrite(s.arena.mem, base)
	return token, -1, base + HeaderBytes, s.sl.classes[cls].size - HeaderBytes, ""
}

// CommitArgs is one set_commit.
type CommitArgs struct {
	Token                 uint64
	Conn                  uint64
	Model, CompatKey, Key []byte
	Length                int
	Retention             []byte // "default" or "" = short
	TTLSeconds            int64
}

// Commit publishes a leased slot under a key.
func (s *Store) Commit(a *CommitArgs) (bool, string) {
	if s.arena == nil {
		return false, ReasonNoArena
	}
	ret := RetentionShort
	if len(a.Retention) != 0 && string(a.Retention) != "default" {
		r, ok := ParseRetention(a.Retention)
		if !ok {
			return false, ReasonBadRetention
		}
		ret = r
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.leases[a.Token]
	if !ok {
		return false, ReasonUnknownLease
	}
	if l.conn != a.Conn {
		return false, ReasonWrongOwner
	}
	if a.Length < 0 || a.Length > l.size {
		return false, ReasonOversizeCommit
	}
	if len(a.Key) == 0 {
		return false, ReasonEmptyKey
	}
	s.c.Sets++
	delete(s.leases, a.Token)
	base := l.slot
	now := s.nowNs()
	s.kb = Composite(s.kb, a.Model, a.CompatKey, a.Key)
	old := s.lookup(now)
	if old != nil && ret < old.ret {
		s.releaseLocked(l.slot)
		s.c.LeasesCancelled++
		s.c.Rejected++
		return false, ReasonDowngrade
	}
	if old != nil {
		s.removeLocked(old)
	}
	endWrite(s.arena.mem, base, a.Length)
	e := &entry{key: string(s.kb), nsLen: 4 + len(a.Model) + len(a.CompatKey), ret: ret, slot: l.slot, length: a.Length}
	if a.TTLSeconds > 0 {
		e.expires = now + min(a.TTLSeconds, maxTTLSeconds)*int64(time.Second)
	}
	s.index[e.key] = e
	s.sl.own(e, true)
	s.touch(e)
	s.arenaBytes += int64(a.Length)
	s.arenaEntries++
	s.c.LeasesCommitted++
	if ret == RetentionLong {
		s.writeThroughLocked(e.key)
	}
	return true, ""
}

// releaseLocked returns a leased slot with an even version again.
func (s *Store) releaseLocked(slot int) {
	endWrite(s.arena.mem, slot, 0)
	s.sl.release(slot, nil, true)
}

// Cancel drops a lease of conn; unknown or foreign tokens are ignored.
func (s *Store) Cancel(token, conn uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.leases[token]; ok && l.conn == conn {
		delete(s.leases, token)
		s.releaseLocked(l.slot)
		s.c.LeasesCancelled++
	}
}

// CancelConn drops every lease of a closed connection and returns how many.
func (s *Store) CancelConn(conn uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for t, l := range s.leases {
		if l.conn == conn {
			delete(s.leases, t)
			s.releaseLocked(l.slot)
			s.c.LeasesCancelled++
			n++
		}
	}
	return n
}

// Clear drops a namespace, in RAM and in L3, or with both names empty
// every entry of both. It returns the RAM entries dropped (clear_ack's
// cleared_entries). A namespace's L3 entries are removed through
// LongPrefixDeleter (its keys are the namespace's composite prefix
// followed by the key, and no other namespace's keys start with it).
func (s *Store) Clear(model, compat []byte) int {
	all := len(model) == 0 && len(compat) == 0
	s.mu.Lock()
	s.clears++
	s.kb = Composite(s.kb, model, compat, nil)
	prefix := string(s.kb)
	n := 0
	for _, e := range s.index {
		if all || (e.nsLen == len(prefix) && e.key[:e.nsLen] == prefix) {
			s.removeLocked(e)
			n++
		}
	}
	s.mu.Unlock()
	if s.opt.Long == nil {
		return n
	}
	s.longMu.Lock()
	defer s.longMu.Unlock()
	if all {
		if err := s.opt.Long.Clear(); err != nil {
			s.log.Error().Err(err).Msg("clear l3")
		}
		return n
	}
	pd, ok := s.opt.Long.(LongPrefixDeleter)
	if !ok {
		if !s.nsWarned {
			s.nsWarned = true
			s.log.Warn().Msg("l3 cannot remove by prefix: a namespace clear leaves its l3 entries")
		}
		return n
	}
	if dropped, err := pd.DeletePrefix([]byte(prefix)); err != nil {
		s.log.Error().Err(err).Int("l3_dropped", dropped).Msg("clear namespace in l3")
	}
	return n
}

// Counters returns a snapshot of the counters.
func (s *Store) Counters() Counters {
	s.mu.Lock()
	c := s.c
	c.Entries = int64(len(s.index))
	c.ArenaEntries = s.arenaEntries
	c.InlineEntries = c.Entries - s.arenaEntries
	c.HostBytes = s.arenaBytes + s.inlineBytes
	c.InlineBytes = s.inlineBytes
	if s.sl != nil {
		c.SlotSize, c.Pages, c.FreePages = int64(s.sl.pageSize), int64(len(s.sl.pages)), int64(len(s.sl.free))
		c.Classes = s.sl.stats(nil)
		for _, cs := range c.Classes {
			c.NumSlots += cs.Slots
			c.FreeSlots += cs.Slots - cs.UsedSlots
		}
	}
	c.LeasesActive = int64(len(s.leases))
	s.mu.Unlock()
	if s.opt.Long != nil {
		c.LongBytes = s.opt.Long.UsedBytes()
		c.LongEntries = int64(s.opt.Long.Len())
	}
	return c
}

// Prefetch queues keys for an L3 → RAM warm-up whose entries live for
// deadline; keys that do not fit the queue are dropped and counted.
func (s *Store) Prefetch(model, compat []byte, keys [][]byte, deadline time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.c.PrefetchHints++
	for _, k := range keys {
		if s.prefetchQ == nil || s.closed || len(k) == 0 {
			s.c.PrefetchDropped++
			continue
		}
		s.kb = Composite(s.kb, model, compat, k)
		if s.index[string(s.kb)] != nil {
			continue // already warm
		}
		select {
		case s.prefetchQ <- prefetchItem{key: string(s.kb), ttl: deadline}:
		default:
			s.c.PrefetchDropped++
		}
	}
}

func (s *Store) prefetcher() {
	defer s.wg.Done()
	var buf []byte
	for {
		var it prefetchItem
		select {
		case <-s.stop:
			return
		case it = <-s.prefetchQ:
		}
		s.mu.Lock()
		_, warm := s.index[it.key]
		gen := s.clears
		s.mu.Unlock()
		if warm {
			continue
		}
		v, err := s.opt.Long.Get([]byte(it.key), buf[:0])
		if err != nil {
			continue
		}
		buf = v
		model, compat, key, ok := splitComposite([]byte(it.key))
		if !ok {
			continue
		}
		s.mu.Lock()
		if s.clears != gen { // cleared meanwhile
			s.mu.Unlock()
			continue
		}
		if ok, _ := s.putLocked(model, compat, key, v, RetentionLong, s.nowNs()+int64(max(it.ttl, time.Millisecond)), true); ok {
			s.c.PrefetchFetched++
			if e := s.index[it.key]; e != nil {
				e.warmed = true
			}
		}
		s.mu.Unlock()
	}
}

func splitComposite(k []byte) (model, compat, key []byte, ok bool) {
	if len(k) < 2 {
		return nil, nil, nil, false
	}
	n := int(binary.BigEndian.Uint16(k))
	if len(k) < 2+n+2 {
		return nil, nil, nil, false
	}
	model, k = k[2:2+n], k[2+n:]
	n = int(binary.BigEndian.Uint16(k))
	if len(k) < 2+n {
		return nil, nil, nil, false
	}
	return model, k[2 : 2+n], k[2+n:], true
}

// longWriter writes long entries through to L3, reading their bytes from
// RAM when their turn comes (an entry gone by then is counted as dropped).
func (s *Store) longWriter() {
	defer s.wg.Done()
	var buf []byte
	for key := range s.longQ {
		s.longMu.Lock()
		s.mu.Lock()
		e := s.index[key]
		if e == nil || e.ret != RetentionLong {
			s.c.LongWritesDropped++
			s.mu.Unlock()
			s.longMu.Unlock()
			continue
		}
		if e.slot >= 0 {
			base := e.slot
			buf = append(buf[:0], s.arena.mem[base+HeaderBytes:base+HeaderBytes+e.length]...)
		} else {
			buf = append(buf[:0], e.inline...)
		}
		s.mu.Unlock()
		err := s.opt.Long.Put([]byte(key), buf)
		s.longMu.Unlock()
		s.mu.Lock()
		if err != nil {
			s.c.LongWriteErrors++
		} else {
			s.c.LongWrites++
		}
		s.mu.Unlock()
		if err != nil {
			s.log.Warn().Err(err).Msg("l3 write-through failed")
		}
		if cap(buf) > 64<<20 {
			buf = nil
		}
	}
}
