package tablespace

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

const (
	slotFree uint8 = iota
	slotReserved
	slotLive
)

const ioAlign = 4096

func alignUp(n int) int { return (n + ioAlign - 1) &^ (ioAlign - 1) }

type slotMeta struct {
	key        string
	seq        uint64
	vlen       uint32
	prev, next int32
	state      uint8
}

type pendingRec struct {
	rec record
	end int // end offset of its bytes in jbuf
}

type durableRec struct {
	rec record
	end int64 // end offset of its bytes in the journal file
}

// markEvery is how many finished PUTs a flush waits for before it writes a
// mark: recovery reads at most about that many slots (plus the PUTs in
// flight at the crash) to verify the journal's tail.
const markEvery = 8

// Per-ticket flags of an unfinished journal record (shard.pflags).
const (
	// flagAwaitData: a PUT whose slot write runs concurrently with its
	// journal append; it is applied only once the write is durable too.
	flagAwaitData uint8 = 1 << iota
	// flagSkip: that slot write failed; the record is never applied.
	flagSkip
)

// shard is one path: its containers, journal, snapshot and index.
type shard struct {
	t      *Tablespace
	dir    string
	g      geometry
	direct bool
	lock   *os.File
	files  []*os.File
	fds    []int

	// mu guards the index.
	mu        sync.Mutex
	index     map[string]int32
	slots     []slotMeta
	used      []uint64 // bit set = reserved or live
	cursor    int
	head      int32 // most recently used
	tail      int32 // least recently used
	live      int
	usedBytes int64
	nextSeq   uint64

	// jmu guards the journal and the apply queue; jmu is taken before mu,
	// never after. Records get tickets in journal order and are applied to
	// the index in that order (so replay, which applies the journal in file
	// order, rebuilds the same index).
	jmu      sync.Mutex
	jcond    *sync.Cond // waiters: a record finished, a flush ended
	fcond    *sync.Cond // the flusher: a record was enqueued, a snapshot ended
	jf       *os.File
	jsize    int64
	epoch    uint64
	jbuf     []byte
	jpend    []pendingRec // enqueued, not yet written (tickets done+len(applyQ)…)
	applyQ   []durableRec // durable in the journal, not yet applied (tickets done…)
	pflags   []uint8      // flags of every unfinished ticket, pflags[0] is ticket done
	dirty    []bool
	syncList []int
	flushing bool   // a flush or snapshot owns the journal file
	snapWant int    // snapshots waiting for the journal: no new flush starts
	enq      uint64 // records ever enqueued
	done     uint64 // records finished (applied, skipped or failed), in ticket order
	failFrom uint64 // tickets from here on failed with jerr
	jerr     error
	jclosed  bool
	fdone    chan struct{} // the flusher exited

	// Marks (see opMark): every PUT record ending at or before doneEnd is
	// finished; putsSinceMark PUTs finished since the last mark; a skipped
	// PUT (failed slot write) freezes marks until the next snapshot.
	doneEnd       int64
	putsSinceMark int
	markFrozen    bool
	wbuf          []byte // mark + batch, one pwrite

	// With GroupCommit, a flush syncs the dirty containers on this
	// goroutine while it appends and syncs the journal itself.
	syncReq chan []int
	syncRes chan error
}

func openShard(t *Tablespace, dir string, bytes int64) (*shard, error) {
	cfg := &t.cfg
	g := geometry{slotBytes: cfg.SlotBytes, slotsPerContainer: int(cfg.ContainerBytes / cfg.SlotBytes),
		numSlots: int(bytes / cfg.SlotBytes), maxValue: int(cfg.SlotBytes) - slotHeaderSize - MaxKeyBytes}
	s := &shard{t: t, dir: dir, g: g, head: -1, tail: -1, failFrom: ^uint64(0)}
	s.jcond = sync.NewCond(&s.jmu)
	s.fcond = sync.NewCond(&s.jmu)
	if err := os.MkdirAll(filepath.Join(dir, "containers"), 0o755); err != nil {
		return nil, fmt.Errorf("create dir: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock: %w", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = lf.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("lock: %w", err)
	}
	s.lock = lf
	if err := s.openContainers(); err != nil {
		s.close(false)
		return nil, err
	}
	s.initIndex()
	if err := s.recover(); err != nil {
		s.close(false)
		return nil, err
	}
	s.fdone = make(chan struct{})
	go s.flusher()
	if t.cfg.GroupCommit {
		s.syncReq, s.syncRes = make(chan []int), make(chan error)
		go s.dataSyncer()
	}
	return s, nil
}

func (s *shard) openContainers() error {
	spc := s.g.slotsPerContainer
	n := (s.g.numSlots + spc - 1) / spc
	mode := s.t.cfg.DirectIO
	s.direct = mode != DirectOff
	for i := range n {
		slots := min(spc, s.g.numSlots-i*spc)
		size := int64(slots) * s.g.slotBytes
		path := filepath.Join(s.dir, "containers", fmt.Sprintf("%04d.bin", i))
		f, err := openContainer(path, size, s.direct, !s.t.cfg.GroupCommit)
		if err != nil && i == 0 && s.direct && mode == DirectAuto {
			s.t.log.Info().Str("path", s.dir).Err(err).Msg("tablespace O_DIRECT unavailable, using buffered io")
			s.direct = false
			f, err = openContainer(path, size, false, !s.t.cfg.GroupCommit)
		}
		if err != nil {
			return fmt.Errorf("container %s: %w", path, err)
		}
		s.files = append(s.files, f)
		s.fds = append(s.fds, int(f.Fd()))
	}
	s.dirty = make([]bool, n)
	return nil
}

// openContainer opens (creating and pre-allocating) a container; with
// direct it also proves that an aligned O_DIRECT read works.
func openContainer(path string, size int64, direct, dsync bool) (*os.File, error) {
	flags := os.O_RDWR | os.O_CREATE
	if direct {
		flags |= syscall.O_DIRECT
	}
	if dsync {
		flags |= syscall.O_DSYNC
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && st.Size() < size {
		err = syscall.Fallocate(int(f.Fd()), 0, 0, size)
		if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
			err = f.Truncate(size)
		}
	}
	if err == nil && direct {
		err = probeDirect(int(f.Fd()))
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// probeDirect proves that an aligned O_DIRECT read works on fd (some
// filesystems accept the flag at open and fail the IO); a variable for tests.
var probeDirect = func(fd int) error {
	_, err := syscall.Pread(fd, alignedBuf(ioAlign), 0)
	return err
}

func alignedBuf(n int) []byte {
	b := make([]byte, n+ioAlign)
	off := 0
	if r := int(uintptrOf(b) % ioAlign); r != 0 {
		off = ioAlign - r
	}
	return b[off : off+n : off+n]
}

func (s *shard) initIndex() {
	s.index = make(map[string]int32)
	s.slots = make([]slotMeta, s.g.numSlots)
	for i := range s.slots {
		s.slots[i].prev, s.slots[i].next = -1, -1
	}
	words := (s.g.numSlots + 63) / 64
	s.used = make([]uint64, words)
	if r := s.g.numSlots % 64; r != 0 {
		s.used[words-1] = ^uint64(0) << r // slots past the end are never free
	}
}

// recover loads snapshot + journal, then compacts them into a new snapshot
// and an empty journal of the next epoch.
func (s *shard) recover() error {
	log := s.t.log
	var snap *snapshotData
	b, err := os.ReadFile(filepath.Join(s.dir, "snapshot.bin"))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read snapshot: %w", err)
	default:
		snap, err = parseSnapshot(b, s.g)
		if errors.Is(err, ErrGeometry) {
			return err
		}
		if err != nil {
			log.Error().Str("path", s.dir).Err(err).Msg("tablespace snapshot unreadable, ignoring it")
			s.t.st.corrupt.Add(1)
			snap = nil
		}
	}
	if snap != nil {
		s.epoch, s.nextSeq = snap.epoch, snap.nextSeq
		for i := range snap.entries {
			r := &snap.entries[i]
			r.op = opPut
			s.applyLocked(r)
		}
	}
	jb, err := os.ReadFile(filepath.Join(s.dir, "journal.log"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read journal: %w", err)
	}
	if len(jb) > 0 {
		jepoch, herr := parseJournalHeader(jb, s.g)
		switch {
		case errors.Is(herr, ErrGeometry):
			return herr
		case herr != nil:
			log.Warn().Str("path", s.dir).Msg("tablespace journal header unreadable, ignoring journal")
			if snap == nil {
				// Nothing says which epochs the file's leftovers belong to:
				// start one that cannot have been used.
				s.epoch = uint64(time.Now().UnixNano())
			}
		case snap != nil && jepoch != snap.epoch:
			// A journal of an older epoch is already covered by the snapshot.
		default:
			if jepoch > s.epoch {
				s.epoch = jepoch
			}
			n, end, rejected, restored := s.replay(jb[journalHeaderSize:], jepoch, s.slotHolds)
			if cut := len(jb) - journalHeaderSize - end; cut > 0 {
				log.Warn().Str("path", s.dir).Int("bytes", cut).Msg("tablespace journal tail torn or corrupt, cut")
			}
			s.t.st.replayRejected.Add(uint64(rejected))
			if rejected > 0 {
				log.Warn().Str("path", s.dir).Int("rejected", rejected).Int("restored", restored).
					Msg("tablespace journalled puts without their data rejected, previous values kept")
			}
			log.Info().Str("path", s.dir).Int("records", n).Int("entries", s.live).Msg("tablespace journal replayed")
		}
	}
	// A seq that a PUT in flight at the crash wrote into a slot without a
	// durable record is never handed out again: each such PUT held its own
	// reserved slot, so at most numSlots of them.
	s.nextSeq += uint64(s.g.numSlots)
	return s.writeSnapshot()
}

type keySeq struct {
	key string
	seq uint64
}

// replayed is a journalled PUT applied during replay, with the mapping of
// its key that it displaced (a journalled PUT or a snapshot entry).
type replayed struct {
	seq     uint64
	slot    int32
	vlen    uint32
	journal bool  // from a journalled PUT, else a snapshot entry
	end     int64 // journalled: end offset of its record in the journal file
	prev    *replayed
}

// replay applies the journal body of epoch to the index (single-threaded
// recovery) and returns the records applied, the length of the valid
// prefix, and how many PUTs verifyReplayed rejected and how many of their
// keys got an older mapping back. holds reports whether a slot holds the
// block written for (key, seq, vlen).
func (s *shard) replay(body []byte, epoch uint64, holds func(key string, n *replayed) bool) (n, end, rejected, restored int) {
	hist := make(map[string]*replayed)
	dels := make(map[keySeq]bool) // versions an opDel removed (an eviction, a failed read)
	pos, mark := int64(journalHeaderSize), int64(0)
	end = parseRecords(body, s.g, epoch, func(r *record) {
		pos += int64(recHeadSize + recFixed + len(r.key))
		var node *replayed
		switch r.op {
		case opMark:
			mark = min(int64(r.seq), pos) // a mark speaks only of records before it
		case opDel:
			dels[keySeq{r.key, r.seq}] = true
		case opPut:
			node = &replayed{seq: r.seq, slot: r.slot, vlen: r.vlen, journal: true, end: pos}
			if sl, ok := s.index[r.key]; ok {
				m := &s.slots[sl]
				if h := hist[r.key]; h != nil && h.slot == sl && h.seq == m.seq {
					node.prev = h
				} else {
					node.prev = &replayed{seq: m.seq, slot: sl, vlen: m.vlen}
				}
			}
		}
		s.applyLocked(r)
		if node != nil {
			hist[r.key] = node
		}
		n++
	})
	rejected, restored = s.verifyReplayed(hist, dels, mark, holds)
	return n, end, rejected, restored
}

// verifyReplayed enforces the rule that makes Put's overlap of slot write
// and journal append safe: a PUT is in the journal before its slot write is
// known durable, so a crash can leave the record without the data. Every
// entry that a journalled PUT left in the index is checked against its
// slot (key, seq, length, CRC-32C); one that fails is dropped, and its key
// falls back to the mapping that PUT displaced (checked the same way):
// while a PUT is unapplied the slot of its key's previous value is not
// freed, so that value is still on disk. A displaced slot that something
// else took since is a sign the PUT was durable and its slot damaged: no
// fallback then, a miss; nor into a version that a DEL removed (the previous
// value evicted while the PUT was in flight). PUTs superseded later in the journal (overwritten,
// deleted, evicted, cleared) are not read at all; snapshot entries are
// trusted (only applied, so durable, entries are in a snapshot), and so
// are PUTs before the journal's last mark (see opMark); like every entry,
// they are verified again by each Get. So recovery reads about markEvery
// slots plus those of the PUTs in flight at the crash.
func (s *shard) verifyReplayed(hist map[string]*replayed, dels map[keySeq]bool, mark int64,
	holds func(key string, n *replayed) bool) (rejected, restored int) {
	type failure struct {
		key  string
		prev *replayed
	}
	var failed []failure
	for k, n := range hist {
		sl, ok := s.index[k]
		if !ok || sl != n.slot || s.slots[sl].seq != n.seq || n.end <= mark || holds(k, n) {
			continue
		}
		s.removeLocked(sl, true)
		failed = append(failed, failure{k, n.prev})
	}
	for _, f := range failed {
		for p := f.prev; p != nil; p = p.prev {
			if _, taken := s.index[f.key]; taken || s.slots[p.slot].state != slotFree || dels[keySeq{f.key, p.seq}] {
				break
			}
			if holds(f.key, p) {
				s.applyLocked(&record{op: opPut, seq: p.seq, slot: p.slot, vlen: p.vlen, key: f.key})
				restored++
				break
			}
		}
	}
	return len(failed), restored
}

// slotHolds reads slot n.slot and reports whether it holds the block
// written for (key, n.seq, n.vlen).
func (s *shard) slotHolds(key string, n *replayed) bool {
	size := int(n.vlen) + slotHeaderSize + len(key)
	if s.direct {
		size = alignUp(size)
	}
	s.t.st.replayChecked.Add(1)
	bp := s.t.getBuf()
	defer s.t.putBuf(bp)
	c, off := s.locate(n.slot)
	if preadFull(s.fds[c], (*bp)[:size], off) != nil {
		return false
	}
	_, ok := verifySlot(s.t.sums, (*bp)[:size], n.seq, []byte(key), int(n.vlen))
	return ok
}

// applyLocked applies one journal record to the index (s.mu held, or
// single-threaded recovery). Used identically at run time and on replay.
func (s *shard) applyLocked(r *record) {
	if r.op == opMark {
		return
	}
	if r.seq >= s.nextSeq {
		s.nextSeq = r.seq + 1
	}
	switch r.op {
	case opPut:
		if old, ok := s.index[r.key]; ok {
			s.removeLocked(old, true)
		}
		m := &s.slots[r.slot]
		if m.state == slotLive { // only reachable from a damaged journal
			s.removeLocked(r.slot, true)
		}
		s.used[r.slot/64] |= 1 << (uint(r.slot) % 64)
		m.state, m.key, m.seq, m.vlen = slotLive, r.key, r.seq, r.vlen
		s.index[r.key] = r.slot
		s.pushFrontLocked(r.slot)
		s.live++
		s.usedBytes += int64(r.vlen)
	case opDel:
		if sl, ok := s.index[r.key]; ok && s.slots[sl].seq == r.seq {
			s.removeLocked(sl, true)
		}
	case opDelAny:
		if sl, ok := s.index[r.key]; ok {
			s.removeLocked(sl, true)
		}
	case opClear:
		for _, sl := range s.index {
			s.removeLocked(sl, true)
		}
	}
}

// removeLocked drops a live entry; free returns the slot to the free set,
// otherwise it stays reserved for the caller.
func (s *shard) removeLocked(sl int32, free bool) {
	m := &s.slots[sl]
	delete(s.index, m.key)
	s.unlinkLocked(sl)
	s.live--
	s.usedBytes -= int64(m.vlen)
	m.key = ""
	if free {
		m.state = slotFree
		s.used[sl/64] &^= 1 << (uint(sl) % 64)
	} else {
		m.state = slotReserved
	}
}

func (s *shard) pushFrontLocked(sl int32) {
	m := &s.slots[sl]
	m.prev, m.next = -1, s.head
	if s.head >= 0 {
		s.slots[s.head].prev = sl
	}
	s.head = sl
	if s.tail < 0 {
		s.tail = sl
	}
}

func (s *shard) unlinkLocked(sl int32) {
	m := &s.slots[sl]
	if m.prev >= 0 {
		s.slots[m.prev].next = m.next
	} else {
		s.head = m.next
	}
	if m.next >= 0 {
		s.slots[m.next].prev = m.prev
	} else {
		s.tail = m.prev
	}
	m.prev, m.next = -1, -1
}

func (s *shard) touchLocked(sl int32) {
	if s.head != sl {
		s.unlinkLocked(sl)
		s.pushFrontLocked(sl)
	}
}

func (s *shard) allocFreeLocked() int32 {
	nw := len(s.used)
	start := s.cursor / 64
	for i := range nw {
		w := (start + i) % nw
		if s.used[w] != ^uint64(0) {
			sl := int32(w*64 + bits.TrailingZeros64(^s.used[w]))
			s.used[w] |= 1 << (uint(sl) % 64)
			s.cursor = int(sl) + 1
			return sl
		}
	}
	return -1
}

// reserveLocked takes a free slot or, when none is free, unindexes the LRU
// entry and returns its DEL record, which must be durable before the slot
// is written.
//
// OnEvict runs here, under mu and before the victim leaves the index: a
// snapshot encodes the index under mu, so it makes the removal durable only
// after the callback (called later, a snapshot taken in between could
// persist the removal before anyone was told, and a crash then loses the
// entry unannounced).
func (s *shard) reserveLocked() (int32, *record, error) {
	if sl := s.allocFreeLocked(); sl >= 0 {
		s.slots[sl].state = slotReserved
		return sl, nil, nil
	}
	sl := s.tail
	if sl < 0 {
		return -1, nil, ErrFull
	}
	m := &s.slots[sl]
	victim := &record{op: opDel, key: m.key, seq: m.seq, slot: sl}
	s.t.st.evictions.Add(1)
	if s.t.cfg.OnEvict != nil {
		s.t.cfg.OnEvict([]byte(m.key))
	}
	s.removeLocked(sl, false)
	return sl, victim, nil
}

// afterEvictReserve, when set (tests only), runs in put between unindexing
// an eviction victim and journalling its removal.
var afterEvictReserve func()

// beforeSlotWrite, when set (tests only), runs in put between queueing the
// PUT record and writing the slot: the crash test widens the window in
// which the record can be durable without its data.
var beforeSlotWrite func()

// beforeDataSync, when set (tests only), runs before a GroupCommit flush
// syncs the containers.
var beforeDataSync func()

func (s *shard) releaseLocked(sl int32) {
	s.slots[sl].state = slotFree
	s.used[sl/64] &^= 1 << (uint(sl) % 64)
}

func (s *shard) locate(sl int32) (int, int64) {
	c := int(sl) / s.g.slotsPerContainer
	return c, int64(int(sl)-c*s.g.slotsPerContainer) * s.g.slotBytes
}

func pwriteFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := syscall.Pwrite(fd, b, off)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return syscall.EIO
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func preadFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := syscall.Pread(fd, b, off)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return syscall.EIO
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func fdatasync(fd int) error {
	for {
		err := syscall.Fdatasync(fd)
		if err != syscall.EINTR {
			return err
		}
	}
}

// put reserves a slot, then writes the slot and appends its PUT record
// concurrently (without GroupCommit: an O_DSYNC slot write on this
// goroutine while the flusher appends and syncs the record; with it, the
// flush syncs the containers while it syncs the journal), and returns once
// both are durable and the record is applied. That costs about one device
// flush instead of two in series, and it is still crash safe: a journalled
// PUT whose slot does not verify is rejected on replay (see verifyReplayed)
// and its key keeps its previous mapping, whose slot is not freed before
// the new one is applied.
func (s *shard) put(key, val []byte) error {
	s.mu.Lock()
	sl, victim, err := s.reserveLocked()
	if err != nil {
		s.mu.Unlock()
		return err
	}
	seq := s.nextSeq
	s.nextSeq++
	ks, ok := "", false
	if old, found := s.index[string(key)]; found { // an overwrite reuses the key string
		ks, ok = s.slots[old].key, true
	}
	s.mu.Unlock()
	if !ok {
		ks = string(key)
	}
	if victim != nil {
		// The victim's slot still holds its data and a snapshot may still
		// list it: its DEL is durable before the slot is overwritten.
		if afterEvictReserve != nil {
			afterEvictReserve()
		}
		if err := s.commit(victim, -1); err != nil {
			return err // shard is broken; the slot stays reserved
		}
	}
	c, off := s.locate(sl)
	rec := record{op: opPut, seq: seq, slot: sl, vlen: uint32(len(val)), key: ks}
	if s.t.cfg.GroupCommit {
		bp := s.t.getBuf()
		n := s.encode(*bp, seq, key, val)
		err = pwriteFull(s.fds[c], (*bp)[:n], off)
		s.t.putBuf(bp)
		if err != nil {
			s.mu.Lock()
			s.releaseLocked(sl) // nothing indexed or journalled points at it
			s.mu.Unlock()
			return fmt.Errorf("write slot: %w", err)
		}
		s.t.st.bytesWritten.Add(uint64(n))
		return s.commit(&rec, c)
	}
	s.jmu.Lock()
	my, err := s.enqueueLocked(&rec, -1, flagAwaitData)
	s.jmu.Unlock()
	if err != nil {
		s.mu.Lock()
		s.releaseLocked(sl) // the record was refused: nothing points at it
		s.mu.Unlock()
		return err
	}
	// The record carries no checksum, so the flusher writes and syncs it
	// while this goroutine copies the value into its aligned buffer and
	// checksums it: the two devices' waits and the CPU work overlap.
	bp := s.t.getBuf()
	n := s.encode(*bp, seq, key, val)
	if beforeSlotWrite != nil {
		beforeSlotWrite()
	}
	werr := pwriteFull(s.fds[c], (*bp)[:n], off) // O_DSYNC: durable on return
	s.t.putBuf(bp)
	s.jmu.Lock()
	defer s.jmu.Unlock()
	if my >= s.done { // else the journal failed meanwhile
		f := &s.pflags[my-s.done]
		*f &^= flagAwaitData
		if werr != nil {
			// The record may be durable: the slot stays reserved (never
			// reused before a restart), so the record can never verify.
			*f |= flagSkip
		}
		s.applyReadyLocked()
	}
	if werr != nil {
		return fmt.Errorf("write slot: %w", werr)
	}
	s.t.st.dataSyncs.Add(1)
	s.t.st.bytesWritten.Add(uint64(n))
	return s.waitLocked(my)
}

// encode lays out the slot for (seq, key, val) in buf and returns the
// length to write (a whole number of blocks under O_DIRECT).
func (s *shard) encode(buf []byte, seq uint64, key, val []byte) int {
	n := encodeSlot(s.t.sums, buf, seq, key, val)
	if s.direct {
		n = alignUp(n)
	}
	return n
}

func (s *shard) get(key, dst []byte) ([]byte, error) {
	s.mu.Lock()
	sl, ok := s.index[string(key)]
	if !ok {
		s.mu.Unlock()
		return dst[:0], ErrNotFound
	}
	seq, vlen := s.slots[sl].seq, int(s.slots[sl].vlen)
	s.touchLocked(sl)
	s.mu.Unlock()
	n := vlen + slotHeaderSize + len(key)
	if s.direct {
		n = alignUp(n)
	}
	c, off := s.locate(sl)
	// In place when dst can take the aligned read (see ReadBuffer).
	if cap(dst) >= n && (!s.direct || uintptrOf(dst[:1])%ioAlign == 0) {
		buf := dst[:n]
		sum, err := s.t.readCRC(s.fds[c], buf, off, vlen)
		if err == nil {
			if v, ok := verifySlotCRC(buf, seq, key, vlen, sum); ok {
				s.t.st.bytesRead.Add(uint64(n))
				return v, nil
			}
		}
		return s.readFailed(key, sl, seq, err, dst)
	}
	bp := s.t.getBuf()
	sum, err := s.t.readCRC(s.fds[c], (*bp)[:n], off, vlen)
	if err == nil {
		if v, ok := verifySlotCRC((*bp)[:n], seq, key, vlen, sum); ok {
			dst = append(dst[:0], v...)
			s.t.putBuf(bp)
			s.t.st.bytesRead.Add(uint64(n))
			return dst, nil
		}
	}
	s.t.putBuf(bp)
	return s.readFailed(key, sl, seq, err, dst)
}

func (s *shard) readFailed(key []byte, sl int32, seq uint64, err error, dst []byte) ([]byte, error) {
	// Either the entry was removed (and the slot maybe reused) while we
	// read, or the slot is damaged: only the latter is corruption.
	s.mu.Lock()
	cur, still := s.index[string(key)]
	same := still && cur == sl && s.slots[sl].seq == seq
	s.mu.Unlock()
	if same {
		s.t.st.corrupt.Add(1)
		s.t.log.Warn().Str("path", s.dir).Int32("slot", sl).AnErr("io_error", err).Msg("tablespace slot failed verification, dropped")
		_ = s.commit(&record{op: opDel, seq: seq, key: string(key)}, -1)
		return dst[:0], errCorruptMiss
	}
	return dst[:0], ErrNotFound
}

func (s *shard) journalBytes() int64 {
	s.jmu.Lock()
	defer s.jmu.Unlock()
	return s.jsize
}

func (s *shard) exists(key []byte) bool {
	s.mu.Lock()
	_, ok := s.index[string(key)]
	s.mu.Unlock()
	return ok
}

// delete journals a removal even for a key that is not indexed: it may be
// an eviction victim whose own DEL is not durable yet, which a crash would
// otherwise bring back.
func (s *shard) delete(key []byte) error {
	s.t.st.deletes.Add(1)
	return s.commit(&record{op: opDelAny, key: string(key)}, -1)
}

func (s *shard) clear() error {
	return s.commit(&record{op: opClear}, -1)
}

// commit appends r to the journal, waits until it is durable (sharing the
// sync with concurrent records under GroupCommit) and applied to the index.
func (s *shard) commit(r *record, container int) error {
	s.jmu.Lock()
	defer s.jmu.Unlock()
	my, err := s.enqueueLocked(r, container, 0)
	if err != nil {
		return err
	}
	return s.waitLocked(my)
}

// enqueueLocked queues r for the flusher and returns its ticket.
func (s *shard) enqueueLocked(r *record, container int, flags uint8) (uint64, error) {
	if s.jclosed {
		return 0, ErrClosed
	}
	if s.jerr != nil {
		return 0, s.jerr
	}
	s.jbuf = appendRecord(s.jbuf, r)
	s.jpend = append(s.jpend, pendingRec{rec: *r, end: len(s.jbuf)})
	s.pflags = append(s.pflags, flags)
	if container >= 0 && s.t.cfg.GroupCommit {
		s.dirty[container] = true
	}
	my := s.enq
	s.enq++
	s.fcond.Signal()
	return my, nil
}

// waitLocked waits until ticket my is finished and returns its outcome.
func (s *shard) waitLocked(my uint64) error {
	for s.done <= my {
		s.jcond.Wait()
	}
	if my < s.failFrom {
		return nil
	}
	return s.jerr
}

// flusher writes the queued records, one batch at a time, until close.
func (s *shard) flusher() {
	defer close(s.fdone)
	s.jmu.Lock()
	defer s.jmu.Unlock()
	for {
		for !s.jclosed && (len(s.jpend) == 0 || s.flushing || s.snapWant > 0) {
			s.fcond.Wait()
		}
		if s.jclosed {
			return
		}
		s.flushLocked()
	}
}

// dataSyncer (GroupCommit only) fdatasyncs the containers of each request.
func (s *shard) dataSyncer() {
	for list := range s.syncReq {
		if beforeDataSync != nil {
			beforeDataSync()
		}
		var err error
		for _, c := range list {
			if err = fdatasync(s.fds[c]); err != nil {
				break
			}
			s.t.st.dataSyncs.Add(1)
		}
		s.syncRes <- err
	}
}

// applyReadyLocked applies, in ticket order, the durable records whose slot
// write (if any) is durable too, and wakes their waiters.
func (s *shard) applyReadyLocked() {
	n := 0
	for n < len(s.applyQ) && s.pflags[n]&flagAwaitData == 0 {
		n++
	}
	if n == 0 {
		return
	}
	s.mu.Lock()
	for i := range n {
		r := &s.applyQ[i].rec
		switch {
		case s.pflags[i]&flagSkip != 0:
			s.markFrozen = true
		case r.op == opPut:
			s.putsSinceMark++
			fallthrough
		default:
			s.applyLocked(r)
		}
	}
	s.mu.Unlock()
	s.doneEnd = s.applyQ[n-1].end
	s.done += uint64(n)
	rest := s.applyQ[:copy(s.applyQ, s.applyQ[n:])]
	clear(s.applyQ[len(rest):])
	s.applyQ = rest
	s.pflags = s.pflags[:copy(s.pflags, s.pflags[n:])]
	s.jcond.Broadcast()
}

// flushLocked writes and syncs a batch of pending records (one without
// GroupCommit), queues them for applying, and wakes the waiters. Called
// by the flusher with jmu held and !flushing; releases jmu while doing IO.
func (s *shard) flushLocked() {
	s.flushing = true
	take := len(s.jpend)
	if !s.t.cfg.GroupCommit {
		take = 1
	}
	ops := s.jpend[:take]
	data := s.jbuf[:ops[take-1].end]
	s.syncList = s.syncList[:0]
	for c, d := range s.dirty {
		if d {
			s.syncList = append(s.syncList, c)
			s.dirty[c] = false
		}
	}
	syncList := s.syncList
	off := s.jsize
	jfd := int(s.jf.Fd())
	sealRecords(data, s.epoch) // under jmu: appends may copy jbuf's prefix
	// A mark rides in the same write, before the batch: no extra flush.
	out, markLen := data, 0
	if !s.markFrozen && s.putsSinceMark >= markEvery {
		s.wbuf = appendRecord(s.wbuf[:0], &record{op: opMark, seq: uint64(s.doneEnd)})
		sealRecords(s.wbuf, s.epoch)
		markLen = len(s.wbuf)
		s.wbuf = append(s.wbuf, data...)
		out = s.wbuf
		s.putsSinceMark = 0
	}
	s.jmu.Unlock()

	// The containers' data and the journal records are synced concurrently:
	// a record that is durable without its data is rejected on replay.
	if len(syncList) > 0 {
		s.syncReq <- syncList
	}
	err := pwriteFull(jfd, out, off)
	if err == nil {
		err = fdatasync(jfd)
		s.t.st.journalSyncs.Add(1)
	}
	if len(syncList) > 0 {
		if derr := <-s.syncRes; err == nil {
			err = derr
		}
	}

	s.jmu.Lock()
	if err != nil {
		s.jerr = fmt.Errorf("%w: %w", ErrBroken, err)
		s.t.log.Error().Str("path", s.dir).Err(err).Msg("tablespace journal write failed, shard now refuses writes")
		s.failFrom = s.done
		s.done = s.enq
		s.jbuf, s.jpend = s.jbuf[:0], s.jpend[:0]
		clear(s.applyQ)
		s.applyQ, s.pflags = s.applyQ[:0], s.pflags[:0]
	} else {
		s.t.st.journalRecords.Add(uint64(take))
		s.jsize += int64(len(out))
		if s.jsize > s.t.cfg.JournalCompactBytes {
			select {
			case s.t.compact <- struct{}{}:
			default:
			}
		}
		for i := range ops {
			s.applyQ = append(s.applyQ, durableRec{rec: ops[i].rec, end: off + int64(markLen+ops[i].end)})
		}
		s.jbuf = s.jbuf[:copy(s.jbuf, s.jbuf[len(data):])]
		rest := s.jpend[:copy(s.jpend, s.jpend[take:])]
		for i := range rest {
			rest[i].end -= len(data)
		}
		clear(s.jpend[len(rest):])
		s.jpend = rest
		s.applyReadyLocked()
	}
	s.flushing = false
	s.jcond.Broadcast()
}

// snapshot compacts the index into a new snapshot and an empty journal;
// unless force, only when the journal holds records. It first waits until
// every durable record is applied (a PUT waiting for its slot write is in
// neither the index nor, after the snapshot, the journal); meanwhile the
// flusher starts no batch.
func (s *shard) snapshot(force bool) error {
	s.jmu.Lock()
	s.snapWant++
	for s.flushing || len(s.applyQ) > 0 {
		s.jcond.Wait()
	}
	s.snapWant--
	var err error
	switch {
	case s.jclosed || (!force && s.jsize <= journalHeaderSize):
	case s.jerr != nil:
		err = s.jerr
	default:
		s.flushing = true
		s.jmu.Unlock()
		err = s.writeSnapshot()
		s.jmu.Lock()
		if err != nil && s.jerr == nil {
			s.jerr = fmt.Errorf("%w: snapshot: %w", ErrBroken, err)
		}
		s.flushing = false
		s.jcond.Broadcast()
	}
	s.fcond.Signal()
	s.jmu.Unlock()
	return err
}

// writeSnapshot writes snapshot.bin of epoch+1 (write tmp → fsync → rename
// → fsync dir) and only then rewrites the journal header to that epoch in
// place (pwrite + fdatasync), which empties the journal: a crash between the
// two leaves an older-epoch journal that the new snapshot already covers.
// The caller owns the journal (flushing, or recovery).
func (s *shard) writeSnapshot() error {
	s.mu.Lock()
	epoch := s.epoch + 1
	buf := s.encodeSnapshotLocked(epoch)
	s.mu.Unlock()
	if err := writeFileAtomic(s.dir, "snapshot.bin", buf); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	if s.jf == nil {
		jf, err := openJournal(s.dir)
		if err != nil {
			return fmt.Errorf("open journal: %w", err)
		}
		s.jf = jf
	}
	// The old epoch's records stay behind the new header and are ignored.
	fd := int(s.jf.Fd())
	if err := pwriteFull(fd, encodeJournalHeader(epoch, s.g), 0); err != nil {
		return fmt.Errorf("reset journal: %w", err)
	}
	if err := fdatasync(fd); err != nil {
		return fmt.Errorf("reset journal: %w", err)
	}
	s.jsize, s.epoch = journalHeaderSize, epoch
	s.doneEnd, s.putsSinceMark, s.markFrozen = journalHeaderSize, 0, false
	s.t.st.snapshots.Add(1)
	return nil
}

// journalPrealloc is the zero fill of a new journal file: appends within it
// do not change the file size.
const journalPrealloc = 4 << 20

func openJournal(dir string) (*os.File, error) {
	path := filepath.Join(dir, "journal.log")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && st.Size() == 0 {
		zero := make([]byte, 1<<20)
		for off := int64(0); err == nil && off < journalPrealloc; off += int64(len(zero)) {
			_, err = f.WriteAt(zero, off)
		}
		if err == nil {
			err = f.Sync()
		}
		if err == nil {
			err = syncDir(dir)
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// encodeSnapshotLocked serializes the index, LRU order oldest first.
func (s *shard) encodeSnapshotLocked(epoch uint64) []byte {
	b := make([]byte, 0, snapHeaderSize+4+s.live*(snapEntryFixed+32))
	return encodeSnapshot(b, epoch, s.nextSeq, s.g, s.live, func(yield func(*record)) {
		var r record
		for sl := s.tail; sl >= 0; sl = s.slots[sl].prev {
			m := &s.slots[sl]
			r.seq, r.slot, r.vlen, r.key = m.seq, sl, m.vlen, m.key
			yield(&r)
		}
	})
}

func writeFileAtomic(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err == nil {
		err = syncDir(dir)
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// close optionally snapshots, then stops the flusher (once every queued
// record is finished) and releases every file and the lock.
func (s *shard) close(snapshot bool) error {
	var err error
	if snapshot && s.jf != nil {
		err = s.snapshot(true)
	}
	s.jmu.Lock()
	for s.flushing || len(s.jpend) > 0 || len(s.applyQ) > 0 {
		s.jcond.Wait()
	}
	s.jclosed = true
	s.fcond.Signal()
	s.jmu.Unlock()
	if s.fdone != nil {
		<-s.fdone
	}
	if s.syncReq != nil {
		close(s.syncReq)
	}
	for _, f := range s.files {
		_ = f.Close()
	}
	if s.jf != nil {
		_ = s.jf.Close()
	}
	if s.lock != nil {
		_ = s.lock.Close() // releases the flock
	}
	return err
}
