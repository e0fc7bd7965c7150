package tablespace

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/rs/zerolog"
)

// Sentinel errors.
var (
	ErrNotFound      = errors.New("tablespace: not found")
	ErrCorrupt       = errors.New("tablespace: slot failed verification")
	ErrClosed        = errors.New("tablespace: closed")
	ErrInvalidConfig = errors.New("tablespace: invalid config")
	ErrGeometry      = errors.New("tablespace: on-disk geometry differs from config")
	ErrLocked        = errors.New("tablespace: path in use by another process")
	ErrKeySize       = errors.New("tablespace: key empty or too long")
	ErrValueSize     = errors.New("tablespace: value larger than a slot")
	ErrFull          = errors.New("tablespace: no slot free or evictable")
	ErrBroken        = errors.New("tablespace: journal write failed, shard is read-only")
)

// errCorruptMiss is what Get returns for a damaged slot: a miss (ErrNotFound)
// that also matches ErrCorrupt.
var errCorruptMiss = fmt.Errorf("%w: %w", ErrNotFound, ErrCorrupt)

// MaxKeyBytes is the longest key a slot reserves room for.
const MaxKeyBytes = 256

// DirectIO selects O_DIRECT use.
type DirectIO string

// DirectIO modes.
const (
	DirectAuto DirectIO = "auto" // try O_DIRECT, fall back to buffered IO (e.g. tmpfs)
	DirectOn   DirectIO = "on"   // O_DIRECT or fail Open
	DirectOff  DirectIO = "off"  // buffered IO + fdatasync
)

// Defaults.
const (
	DefaultSlotBytes      = 1 << 20
	DefaultContainerBytes = 1 << 30
	// DefaultJournalCompactBytes is Config.JournalCompactBytes's default.
	DefaultJournalCompactBytes = 64 << 20
	// DefaultSelfCheckBytes is Config.SelfCheckBytes's default.
	DefaultSelfCheckBytes = 64 << 20
)

// Config configures a Tablespace.
type Config struct {
	Paths            []string      // one shard per path, keys striped by hash
	Bytes            int64         // total capacity over all paths
	SlotBytes        int64         // fixed slot size, multiple of 4096 (default 1 MiB)
	ContainerBytes   int64         // container file size (default 1 GiB)
	DirectIO         DirectIO      // auto (default), on, off
	GroupCommit      bool          // share data/journal syncs between concurrent writers
	SnapshotInterval time.Duration // periodic snapshot; 0 = only on Close, after recovery and by journal size
	// JournalCompactBytes: a journal grown past this is compacted into a
	// snapshot in the background (default 64 MiB).
	JournalCompactBytes int64
	SelfCheckBytes      int64 // how much SelfCheck writes (default 64 MiB)
	Logger              zerolog.Logger
	// OnEvict, when set, is called with the key of an LRU victim just before
	// it is unindexed, so before its removal can become durable (by its
	// journal record or by a snapshot). It runs on the writer's goroutine
	// with the shard's index locked: it must be fast, must not call the
	// Tablespace, and must not retain the key.
	OnEvict func(key []byte)
}

func (c *Config) normalize() error {
	if c.SlotBytes == 0 {
		c.SlotBytes = DefaultSlotBytes
	}
	if c.ContainerBytes == 0 {
		c.ContainerBytes = DefaultContainerBytes
	}
	if c.DirectIO == "" {
		c.DirectIO = DirectAuto
	}
	if c.SelfCheckBytes <= 0 {
		c.SelfCheckBytes = DefaultSelfCheckBytes
	}
	if c.JournalCompactBytes == 0 {
		c.JournalCompactBytes = DefaultJournalCompactBytes
	}
	var errs []error
	if len(c.Paths) == 0 {
		errs = append(errs, errors.New("no path"))
	}
	seen := map[string]bool{}
	for _, p := range c.Paths {
		if p == "" || seen[p] {
			errs = append(errs, fmt.Errorf("empty or duplicate path %q", p))
		}
		seen[p] = true
	}
	if c.SlotBytes < 4096 || c.SlotBytes%4096 != 0 || c.SlotBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("slot bytes %d: want a multiple of 4096, at most 1 GiB", c.SlotBytes))
	}
	if c.ContainerBytes < c.SlotBytes {
		errs = append(errs, fmt.Errorf("container bytes %d smaller than slot bytes %d", c.ContainerBytes, c.SlotBytes))
	}
	if len(c.Paths) > 0 && c.SlotBytes > 0 && c.Bytes/int64(len(c.Paths)) < c.SlotBytes {
		errs = append(errs, fmt.Errorf("bytes %d: less than one slot per path", c.Bytes))
	}
	if c.Bytes/max(c.SlotBytes, 1) > 1<<31-1 {
		errs = append(errs, fmt.Errorf("bytes %d: too many slots", c.Bytes))
	}
	switch c.DirectIO {
	case DirectAuto, DirectOn, DirectOff:
	default:
		errs = append(errs, fmt.Errorf("direct io %q: want auto, on or off", c.DirectIO))
	}
	if c.SnapshotInterval < 0 || c.JournalCompactBytes < 0 {
		errs = append(errs, errors.New("negative snapshot interval or journal compact bytes"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// Stats are cumulative counters plus current occupancy.
type Stats struct {
	Puts, PutErrors, Gets, Hits, Misses, Corrupt uint64
	Evictions, Deletes, Clears, Snapshots        uint64
	JournalRecords, JournalSyncs, DataSyncs      uint64
	BytesWritten, BytesRead                      uint64
	// ReplayRejected counts journalled PUTs that recovery found without
	// their data (in flight at a crash) and dropped, keeping the key's
	// previous value.
	ReplayRejected uint64
	// ReplayChecked counts the slots recovery read to verify journalled
	// PUTs (those after the journal's last mark, and fallbacks).
	ReplayChecked            uint64
	Entries                  int
	UsedBytes, CapacityBytes int64
	Slots                    int
	DirectIO                 bool
}

type counters struct {
	puts, putErrors, gets, hits, misses, corrupt atomic.Uint64
	evictions, deletes, clears, snapshots        atomic.Uint64
	journalRecords, journalSyncs, dataSyncs      atomic.Uint64
	bytesWritten, bytesRead                      atomic.Uint64
	replayRejected, replayChecked                atomic.Uint64
}

// Tablespace is the L3 store. See the package documentation.
type Tablespace struct {
	cfg    Config
	log    zerolog.Logger
	shards []*shard
	st     counters
	direct bool

	closed  atomic.Bool
	bufs    sync.Pool
	sums    *crcSplitter    // large slots' copy and checksum on two cores
	aio     chan *aioReader // free AIO readers (aio.go), made on first need
	aioTry  atomic.Int32    // readers tried to make (at most aioReaders)
	aioLive atomic.Int32    // readers made
	stop    chan struct{}
	compact chan struct{} // a journal outgrew JournalCompactBytes
	wg      sync.WaitGroup
}

// Open creates or recovers the tablespace described by cfg.
func Open(cfg Config) (*Tablespace, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	t := &Tablespace{cfg: cfg, log: cfg.Logger, stop: make(chan struct{}), compact: make(chan struct{}, 1), sums: newCRCSplitter()}
	per := cfg.Bytes / int64(len(cfg.Paths))
	for i, p := range cfg.Paths {
		s, err := openShard(t, p, per)
		if err != nil {
			for _, o := range t.shards {
				o.close(false)
			}
			t.sums.close()
			return nil, fmt.Errorf("open tablespace shard %d %s: %w", i, p, err)
		}
		t.shards = append(t.shards, s)
	}
	t.direct = t.shards[0].direct
	if t.direct && t.MaxValueBytes() >= crcSplitMin { // only large values read with AIO
		t.aio = make(chan *aioReader, aioReaders)
	}
	t.wg.Add(1)
	go t.snapshotLoop(cfg.SnapshotInterval)
	return t, nil
}

func (t *Tablespace) snapshotLoop(every time.Duration) {
	defer t.wg.Done()
	var tick <-chan time.Time
	if every > 0 {
		tk := time.NewTicker(every)
		defer tk.Stop()
		tick = tk.C
	}
	for {
		var bySize bool
		select {
		case <-t.stop:
			return
		case <-tick:
		case <-t.compact:
			bySize = true
		}
		for _, s := range t.shards {
			if bySize && s.journalBytes() <= t.cfg.JournalCompactBytes {
				continue
			}
			if err := s.snapshot(false); err != nil {
				t.log.Error().Err(err).Str("path", s.dir).Msg("tablespace periodic snapshot failed")
			}
		}
	}
}

func (t *Tablespace) shardFor(key []byte) *shard {
	if len(t.shards) == 1 {
		return t.shards[0]
	}
	return t.shards[xxhash.Sum64(key)%uint64(len(t.shards))]
}

func checkKey(key []byte) error {
	if len(key) == 0 || len(key) > MaxKeyBytes {
		return ErrKeySize
	}
	return nil
}

// MaxValueBytes is the largest value a slot holds.
func (t *Tablespace) MaxValueBytes() int { return int(t.cfg.SlotBytes) - slotHeaderSize - MaxKeyBytes }

// ReadBuffer returns a buffer that Get fills in place: one slot long and
// aligned for O_DIRECT.
func (t *Tablespace) ReadBuffer() []byte { return alignedBuf(int(t.cfg.SlotBytes))[:0] }

// DirectIOActive reports whether O_DIRECT is in use.
func (t *Tablespace) DirectIOActive() bool { return t.direct }

// Put stores value under key, replacing any previous value; the block is
// durable (data and journal synced) when Put returns nil. The slot write
// and the journal append run concurrently (see the package documentation).
func (t *Tablespace) Put(key, value []byte) error {
	if t.closed.Load() {
		return ErrClosed
	}
	if err := checkKey(key); err != nil {
		return err
	}
	if len(value) > t.MaxValueBytes() {
		return ErrValueSize
	}
	err := t.shardFor(key).put(key, value)
	if err != nil {
		t.st.putErrors.Add(1)
		return fmt.Errorf("tablespace put: %w", err)
	}
	t.st.puts.Add(1)
	return nil
}

// Get appends the value of key to dst[:0]. A miss returns ErrNotFound; a
// slot that fails verification is dropped, counted in Stats.Corrupt and
// returns an error matching both ErrNotFound and ErrCorrupt, never its bytes. When dst is
// a ReadBuffer (any capacity beyond the value may be overwritten) the read
// lands in it directly, saving a copy.
func (t *Tablespace) Get(key, dst []byte) ([]byte, error) {
	if t.closed.Load() {
		return dst[:0], ErrClosed
	}
	t.st.gets.Add(1)
	if checkKey(key) != nil {
		t.st.misses.Add(1)
		return dst[:0], ErrNotFound
	}
	out, err := t.shardFor(key).get(key, dst)
	if err != nil {
		t.st.misses.Add(1)
		return out, err
	}
	t.st.hits.Add(1)
	return out, nil
}

// readCRC reads a slot and sums its value, overlapping the two: with an
// AIO reader when one is free for a large O_DIRECT read (aio.go), else
// with the CRC helper (crcsplit.go).
func (t *Tablespace) readCRC(fd int, buf []byte, off int64, vlen int) (uint32, error) {
	if t.aio != nil && vlen >= crcSplitMin {
		if r := t.takeAIO(); r != nil {
			sum, err := r.readCRC(fd, buf, off, vlen)
			t.aio <- r
			return sum, err
		}
	}
	return t.sums.readCRC(fd, buf, off, vlen)
}

// takeAIO takes a free AIO reader, making one while fewer than aioReaders
// were tried; nil when all are in use (or AIO is refused).
func (t *Tablespace) takeAIO() *aioReader {
	select {
	case r := <-t.aio:
		return r
	default:
	}
	if t.aioTry.Add(1) > aioReaders {
		return nil
	}
	r, err := newAIOReader()
	if err != nil {
		return nil
	}
	t.aioLive.Add(1)
	return r
}

// closeAIO destroys the AIO readers (all returned: Close does not race
// with Gets), in parallel: io_destroy waits tens of milliseconds.
func (t *Tablespace) closeAIO() {
	var wg sync.WaitGroup
	for range t.aioLive.Load() {
		wg.Go((<-t.aio).close)
	}
	wg.Wait()
}

// Exists reports whether key is indexed (no IO, no LRU refresh).
func (t *Tablespace) Exists(key []byte) bool {
	if t.closed.Load() || checkKey(key) != nil {
		return false
	}
	return t.shardFor(key).exists(key)
}

// Delete removes key (always journalled, so it also wins over an eviction
// in flight); deleting a missing key is not an error.
func (t *Tablespace) Delete(key []byte) error {
	if t.closed.Load() {
		return ErrClosed
	}
	if checkKey(key) != nil {
		return nil
	}
	if err := t.shardFor(key).delete(key); err != nil {
		return fmt.Errorf("tablespace delete: %w", err)
	}
	return nil
}

// Clear removes every entry (journalled).
func (t *Tablespace) Clear() error {
	if t.closed.Load() {
		return ErrClosed
	}
	var errs []error
	for _, s := range t.shards {
		if err := s.clear(); err != nil {
			errs = append(errs, fmt.Errorf("tablespace clear %s: %w", s.dir, err))
		}
	}
	t.st.clears.Add(1)
	return errors.Join(errs...)
}

// Len is the number of entries.
func (t *Tablespace) Len() int {
	n := 0
	for _, s := range t.shards {
		s.mu.Lock()
		n += s.live
		s.mu.Unlock()
	}
	return n
}

// UsedBytes is the sum of stored value lengths.
func (t *Tablespace) UsedBytes() int64 {
	var n int64
	for _, s := range t.shards {
		s.mu.Lock()
		n += s.usedBytes
		s.mu.Unlock()
	}
	return n
}

// Stats returns a copy of the counters.
func (t *Tablespace) Stats() Stats {
	st := Stats{
		Puts: t.st.puts.Load(), PutErrors: t.st.putErrors.Load(), Gets: t.st.gets.Load(),
		Hits: t.st.hits.Load(), Misses: t.st.misses.Load(), Corrupt: t.st.corrupt.Load(),
		Evictions: t.st.evictions.Load(), Deletes: t.st.deletes.Load(), Clears: t.st.clears.Load(),
		Snapshots: t.st.snapshots.Load(), JournalRecords: t.st.journalRecords.Load(),
		JournalSyncs: t.st.journalSyncs.Load(), DataSyncs: t.st.dataSyncs.Load(),
		BytesWritten: t.st.bytesWritten.Load(), BytesRead: t.st.bytesRead.Load(),
		ReplayRejected: t.st.replayRejected.Load(), ReplayChecked: t.st.replayChecked.Load(), DirectIO: t.direct,
	}
	for _, s := range t.shards {
		s.mu.Lock()
		st.Entries += s.live
		st.UsedBytes += s.usedBytes
		s.mu.Unlock()
		st.Slots += s.g.numSlots
		st.CapacityBytes += int64(s.g.numSlots) * s.g.slotBytes
	}
	return st
}

// Snapshot writes a snapshot of every shard now and compacts the journals.
func (t *Tablespace) Snapshot() error {
	if t.closed.Load() {
		return ErrClosed
	}
	var errs []error
	for _, s := range t.shards {
		if err := s.snapshot(true); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close writes a snapshot per shard and releases the files. Calls after
// Close return ErrClosed.
func (t *Tablespace) Close() error {
	if t.closed.Swap(true) {
		return ErrClosed
	}
	close(t.stop)
	t.wg.Wait()
	var errs []error
	for _, s := range t.shards {
		if err := s.close(true); err != nil {
			errs = append(errs, fmt.Errorf("tablespace close %s: %w", s.dir, err))
		}
	}
	t.sums.close() // a call still in flight finds no helper and sums alone
	t.closeAIO()
	return errors.Join(errs...)
}
