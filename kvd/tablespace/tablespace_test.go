package tablespace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
)

func testConfig(dir string, slots int) Config {
	return Config{Paths: []string{dir}, Bytes: int64(slots) * 8192, SlotBytes: 8192, ContainerBytes: 4 * 8192,
		Logger: zerolog.Nop()}
}

func mustOpen(t *testing.T, cfg Config) *Tablespace {
	t.Helper()
	ts, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// crash drops the tablespace like a killed process: no snapshot, files closed.
func crash(ts *Tablespace) {
	ts.closed.Store(true)
	close(ts.stop)
	ts.wg.Wait()
	for _, s := range ts.shards {
		_ = s.close(false)
	}
	ts.sums.close()
	ts.closeAIO()
}

func val(key string, n int) []byte {
	b := []byte(fmt.Sprintf("%s#%d|", key, n))
	for len(b) < 100+n%3000 {
		b = append(b, byte(len(b)*7+n))
	}
	return b
}

func mustGet(t *testing.T, ts *Tablespace, key string, want []byte) {
	t.Helper()
	got, err := ts.Get([]byte(key), nil)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("get %s: wrong bytes", key)
	}
}

func TestPutGetModes(t *testing.T) {
	for _, mode := range []DirectIO{DirectAuto, DirectOff} {
		for _, group := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/group=%v", mode, group), func(t *testing.T) {
				cfg := testConfig(t.TempDir(), 16)
				cfg.DirectIO, cfg.GroupCommit = mode, group
				ts := mustOpen(t, cfg)
				defer ts.Close()
				if mode == DirectOff && ts.DirectIOActive() {
					t.Fatal("direct io with off")
				}
				for i := range 10 {
					if err := ts.Put([]byte(fmt.Sprint("k", i)), val("k", i)); err != nil {
						t.Fatal(err)
					}
				}
				for i := range 10 {
					mustGet(t, ts, fmt.Sprint("k", i), val("k", i))
				}
				if _, err := ts.Get([]byte("nope"), nil); !errors.Is(err, ErrNotFound) {
					t.Fatalf("miss: %v", err)
				}
				if ts.Len() != 10 || !ts.Exists([]byte("k3")) || ts.Exists([]byte("nope")) {
					t.Fatalf("len %d", ts.Len())
				}
				big := make([]byte, ts.MaxValueBytes())
				if err := ts.Put([]byte("big"), big); err != nil {
					t.Fatal(err)
				}
				mustGet(t, ts, "big", big)
				if err := ts.Put([]byte("big"), append(big, 1)); !errors.Is(err, ErrValueSize) {
					t.Fatalf("oversize: %v", err)
				}
				if err := ts.Put(nil, big); !errors.Is(err, ErrKeySize) {
					t.Fatalf("empty key: %v", err)
				}
			})
		}
	}
}

func TestOverwriteDeleteClear(t *testing.T) {
	ts := mustOpen(t, testConfig(t.TempDir(), 8))
	defer ts.Close()
	k := []byte("a")
	for i := range 20 { // more overwrites than slots: old slots are freed
		if err := ts.Put(k, val("a", i)); err != nil {
			t.Fatal(err)
		}
	}
	mustGet(t, ts, "a", val("a", 19))
	if ts.Len() != 1 || ts.UsedBytes() != int64(len(val("a", 19))) || ts.Stats().Evictions != 0 {
		t.Fatalf("len %d used %d stats %+v", ts.Len(), ts.UsedBytes(), ts.Stats())
	}
	if err := ts.Delete(k); err != nil || ts.Exists(k) || ts.Len() != 0 {
		t.Fatalf("delete: %v", err)
	}
	if err := ts.Delete(k); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		_ = ts.Put([]byte(fmt.Sprint(i)), val("x", i))
	}
	if err := ts.Clear(); err != nil || ts.Len() != 0 || ts.UsedBytes() != 0 {
		t.Fatalf("clear: %v len %d", err, ts.Len())
	}
	for i := range 8 {
		if err := ts.Put([]byte(fmt.Sprint(i)), val("y", i)); err != nil {
			t.Fatal(err)
		}
	}
	if ts.Stats().Evictions != 0 {
		t.Fatal("clear did not free slots")
	}
}

// A snapshot taken while an eviction's DEL is not journalled yet already
// omits the victim, so it makes the removal durable: OnEvict must have run
// by then, or a crash right after loses the entry unannounced.
func TestEvictionAnnouncedBeforeSnapshot(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 2)
	var evicted []string
	cfg.OnEvict = func(k []byte) { evicted = append(evicted, string(k)) }
	ts := mustOpen(t, cfg)
	for _, k := range []string{"a", "b"} {
		if err := ts.Put([]byte(k), val(k, 1)); err != nil {
			t.Fatal(err)
		}
	}
	var atSnapshot []string
	afterEvictReserve = func() {
		if err := ts.Snapshot(); err != nil {
			t.Error(err)
		}
		atSnapshot = append([]string(nil), evicted...)
		crash(ts) // killed right after the snapshot: the DEL never reaches the journal
	}
	defer func() { afterEvictReserve = nil }()
	if err := ts.Put([]byte("c"), val("c", 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("put after crash: %v", err)
	}
	afterEvictReserve = nil
	ts = mustOpen(t, cfg)
	defer ts.Close()
	for _, k := range []string{"a", "b"} {
		if !ts.Exists([]byte(k)) && !slices.Contains(atSnapshot, k) {
			t.Fatalf("%s lost by the crash but not announced by OnEvict before it (announced %v)", k, atSnapshot)
		}
	}
	if len(atSnapshot) != 1 || atSnapshot[0] != "a" || ts.Exists([]byte("a")) {
		t.Fatalf("announced %v, a present %v", atSnapshot, ts.Exists([]byte("a")))
	}
	mustGet(t, ts, "b", val("b", 1))
}

func TestEvictionLRU(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 4)
	var evicted []string
	cfg.OnEvict = func(k []byte) { evicted = append(evicted, string(k)) }
	ts := mustOpen(t, cfg)
	for _, k := range []string{"a", "b", "c", "d"} {
		_ = ts.Put([]byte(k), val(k, 1))
	}
	if _, err := ts.Get([]byte("a"), nil); err != nil { // a becomes most recent
		t.Fatal(err)
	}
	if err := ts.Put([]byte("e"), val("e", 1)); err != nil {
		t.Fatal(err)
	}
	if ts.Exists([]byte("b")) || !ts.Exists([]byte("a")) || ts.Len() != 4 || len(evicted) != 1 || evicted[0] != "b" {
		t.Fatalf("evicted %v", evicted)
	}
	// The eviction is journalled: after a crash b stays gone and e is served.
	crash(ts)
	ts = mustOpen(t, cfg)
	defer ts.Close()
	if ts.Exists([]byte("b")) {
		t.Fatal("evicted key came back after crash")
	}
	for _, k := range []string{"a", "c", "d", "e"} {
		mustGet(t, ts, k, val(k, 1))
	}
}

// Acceptance 3: blocks written before a graceful Close are served after reopen.
func TestRestartDurability(t *testing.T) {
	base := t.TempDir()
	cfg := testConfig(filepath.Join(base, "a"), 64)
	cfg.Paths = append(cfg.Paths, filepath.Join(base, "b"))
	cfg.Bytes *= 2
	cfg.GroupCommit = true
	ts := mustOpen(t, cfg)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				k := fmt.Sprintf("g%d-%d", g, i)
				if err := ts.Put([]byte(k), val(k, i)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ts.Close(); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if err := ts.Put([]byte("x"), nil); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	ts = mustOpen(t, cfg)
	defer ts.Close()
	if ts.Len() != 100 {
		t.Fatalf("len %d", ts.Len())
	}
	for g := range 4 {
		for i := range 25 {
			k := fmt.Sprintf("g%d-%d", g, i)
			mustGet(t, ts, k, val(k, i))
		}
	}
	if st := ts.Stats(); st.Corrupt != 0 || st.Slots != 128 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCorruptSlotIsMiss(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 4)
	ts := mustOpen(t, cfg)
	_ = ts.Put([]byte("a"), val("a", 1))
	_ = ts.Put([]byte("b"), val("b", 1))
	// Flip one value byte of slot 0 ("a") behind the tablespace's back.
	f, err := os.OpenFile(filepath.Join(dir, "containers", "0000.bin"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	_, _ = f.ReadAt(b, 60)
	b[0] ^= 0xff
	_, _ = f.WriteAt(b, 60)
	_ = f.Close()
	if _, err := ts.Get([]byte("a"), nil); !errors.Is(err, ErrNotFound) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt slot served: %v", err)
	}
	if _, err := ts.Get([]byte("a"), nil); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("dropped slot: %v", err)
	}
	if ts.Stats().Corrupt != 1 || ts.Exists([]byte("a")) {
		t.Fatalf("stats %+v", ts.Stats())
	}
	mustGet(t, ts, "b", val("b", 1))
	crash(ts)
	ts = mustOpen(t, cfg)
	defer ts.Close()
	if ts.Exists([]byte("a")) {
		t.Fatal("dropped corrupt entry came back")
	}
}

func TestLockedAndGeometry(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 4)
	ts := mustOpen(t, cfg)
	if _, err := Open(cfg); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v", err)
	}
	_ = ts.Put([]byte("a"), val("a", 1))
	_ = ts.Close()
	for _, c := range []Config{{Bytes: 2 * cfg.Bytes}, {ContainerBytes: 2 * cfg.ContainerBytes}} {
		g := cfg
		g.Bytes, g.ContainerBytes = max(c.Bytes, cfg.Bytes), max(c.ContainerBytes, cfg.ContainerBytes)
		if _, err := Open(g); !errors.Is(err, ErrGeometry) {
			t.Fatalf("geometry %+v: %v", c, err)
		}
	}
	ts = mustOpen(t, cfg) // unchanged after the refusals
	mustGet(t, ts, "a", val("a", 1))
	_ = ts.Close()
	for _, bad := range []Config{{}, {Paths: []string{dir}, Bytes: 100}, {Paths: []string{dir, dir}, Bytes: 1 << 30},
		{Paths: []string{dir}, Bytes: 1 << 30, SlotBytes: 5000}, {Paths: []string{dir}, Bytes: 1 << 30, DirectIO: "maybe"}} {
		if _, err := Open(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("config %+v: %v", bad, err)
		}
	}
}

func TestGetAllocs(t *testing.T) {
	ts := mustOpen(t, testConfig(t.TempDir(), 4))
	defer ts.Close()
	_ = ts.Put([]byte("a"), val("a", 1))
	key := []byte("a")
	for _, dst := range [][]byte{make([]byte, 0, 8192), ts.ReadBuffer()} {
		if n := testing.AllocsPerRun(50, func() { dst, _ = ts.Get(key, dst) }); n != 0 {
			t.Fatalf("get allocates %v", n)
		}
		if !bytes.Equal(dst, val("a", 1)) {
			t.Fatal("wrong bytes")
		}
	}
	v := val("a", 1)
	if n := testing.AllocsPerRun(20, func() { _ = ts.Put(key, v) }); n != 0 && !raceEnabled {
		t.Fatalf("overwriting put allocates %v", n)
	}
	// An in-place read of a damaged slot is a miss too.
	small := ts.ReadBuffer()
	_ = ts.Put([]byte("b"), val("b", 2))
	s0 := ts.shards[0]
	c, off := s0.locate(s0.index["b"])
	f, err := os.OpenFile(filepath.Join(s0.dir, "containers", fmt.Sprintf("%04d.bin", c)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xee}, off+3); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if got, err := ts.Get([]byte("b"), small); !errors.Is(err, ErrNotFound) || len(got) != 0 || ts.Stats().Corrupt != 1 {
		t.Fatalf("damaged in-place read: %v %d", err, len(got))
	}
}

func TestConcurrentMixed(t *testing.T) {
	cfg := testConfig(t.TempDir(), 32)
	cfg.GroupCommit = true
	ts := mustOpen(t, cfg)
	defer ts.Close()
	for i := range 40 { // more keys than slots: evictions are certain
		if k := fmt.Sprintf("k%d", i); ts.Put([]byte(k), val(k, i)) != nil {
			t.Fatal("prefill put failed")
		}
	}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []byte
			for i := range 60 {
				k := fmt.Sprintf("k%d", (g*7+i)%48)
				switch i % 4 {
				case 0, 1:
					if err := ts.Put([]byte(k), val(k, i)); err != nil {
						t.Error(err)
					}
				case 2:
					got, err := ts.Get([]byte(k), dst)
					if err == nil && !bytes.HasPrefix(got, []byte(k+"#")) {
						t.Errorf("wrong bytes for %s", k)
					}
					dst = got
				default:
					_ = ts.Delete([]byte(k))
				}
			}
		}()
	}
	wg.Wait()
	if st := ts.Stats(); st.Corrupt != 0 || st.Evictions == 0 {
		t.Fatalf("stats %+v", st)
	}
	checkInvariants(t, ts)
}

func checkInvariants(t *testing.T, ts *Tablespace) {
	t.Helper()
	for _, s := range ts.shards {
		s.mu.Lock()
		checkShard(t, s)
		s.mu.Unlock()
	}
}

func checkShard(t testing.TB, s *shard) {
	t.Helper()
	{
		n, bytes := 0, int64(0)
		for sl := s.head; sl >= 0; sl = s.slots[sl].next {
			m := &s.slots[sl]
			if m.state != slotLive || s.index[m.key] != sl || s.used[sl/64]&(1<<(uint(sl)%64)) == 0 {
				t.Errorf("slot %d inconsistent", sl)
			}
			n++
			bytes += int64(m.vlen)
		}
		if n != s.live || n != len(s.index) || bytes != s.usedBytes {
			t.Errorf("lru %d live %d index %d", n, s.live, len(s.index))
		}
		for sl := range s.slots {
			bit := s.used[sl/64]&(1<<(uint(sl)%64)) != 0
			if bit != (s.slots[sl].state != slotFree) {
				t.Errorf("slot %d bitset %v state %d", sl, bit, s.slots[sl].state)
			}
		}
	}
}

func TestWriteBehind(t *testing.T) {
	ts := mustOpen(t, testConfig(t.TempDir(), 8))
	defer ts.Close()
	// A queue whose worker has not started yet fills deterministically.
	w := &WriteBehind{ts: ts, q: make(chan wbItem, 2)}
	k, v := []byte("a"), val("a", 1)
	if !w.Enqueue(k, v) || !w.Enqueue([]byte("b"), val("b", 1)) || w.Enqueue([]byte("c"), v) {
		t.Fatal("bounded queue")
	}
	k[0], v[0] = 'z', 'z' // the caller may reuse its buffers
	if w.Enqueue([]byte("d"), make([]byte, ts.MaxValueBytes()+1)) {
		t.Fatal("oversize queued")
	}
	w.wg.Add(1)
	go w.run()
	w.Close()
	w.Close()
	if w.Enqueue([]byte("e"), v) {
		t.Fatal("enqueue after close")
	}
	st := w.Stats()
	if st.Enqueued != 2 || st.Written != 2 || st.Dropped != 3 || st.Failed != 0 {
		t.Fatalf("stats %+v", st)
	}
	mustGet(t, ts, "a", val("a", 1))
	mustGet(t, ts, "b", val("b", 1))

	w = NewWriteBehind(ts, 16)
	for i := range 5 {
		w.Enqueue([]byte(fmt.Sprint("n", i)), val("n", i))
	}
	w.Close()
	if ts.Len() != 7 {
		t.Fatalf("len %d", ts.Len())
	}
}

func TestSelfCheck(t *testing.T) {
	cfg := testConfig(t.TempDir(), 4)
	cfg.SelfCheckBytes = 1 << 20
	ts := mustOpen(t, cfg)
	defer ts.Close()
	bps, err := ts.SelfCheck(context.Background())
	if err != nil || bps <= 0 {
		t.Fatalf("%v %v", bps, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ts.SelfCheck(ctx); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func TestPeriodicSnapshot(t *testing.T) {
	cfg := testConfig(t.TempDir(), 8)
	ts := mustOpen(t, cfg)
	_ = ts.Put([]byte("a"), val("a", 1))
	if err := ts.Snapshot(); err != nil {
		t.Fatal(err)
	}
	_ = ts.Put([]byte("b"), val("b", 1))
	crash(ts) // a from the snapshot, b from the journal
	ts = mustOpen(t, cfg)
	defer ts.Close()
	mustGet(t, ts, "a", val("a", 1))
	mustGet(t, ts, "b", val("b", 1))
}

func TestJournalCompactsBySize(t *testing.T) {
	cfg := testConfig(t.TempDir(), 8)
	cfg.JournalCompactBytes = 200 // a few records
	ts := mustOpen(t, cfg)
	for i := 0; ts.Stats().Snapshots < 2; i++ { // one snapshot is Open's; wait for a size-triggered one
		if err := ts.Put([]byte("a"), val("a", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ts.Put([]byte("b"), val("b", 1)); err != nil {
		t.Fatal(err)
	}
	crash(ts)
	ts = mustOpen(t, cfg)
	defer ts.Close()
	if ts.Len() != 2 || !ts.Exists([]byte("a")) {
		t.Fatalf("len %d", ts.Len())
	}
	mustGet(t, ts, "b", val("b", 1))
}

func TestDamagedSnapshotAndJournalHeader(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 8)
	ts := mustOpen(t, cfg)
	_ = ts.Put([]byte("a"), val("a", 1))
	_ = ts.Close() // a is in the snapshot only
	p := filepath.Join(dir, "snapshot.bin")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ts = mustOpen(t, cfg) // the snapshot is refused whole: a is lost, never misread
	if ts.Exists([]byte("a")) || ts.Stats().Corrupt != 1 {
		t.Fatalf("damaged snapshot used: %+v", ts.Stats())
	}
	if err := ts.Put([]byte("b"), val("b", 1)); err != nil {
		t.Fatal(err)
	}
	crash(ts)
	// A torn journal header: the journal is ignored, the snapshot stands.
	if err := os.Truncate(filepath.Join(dir, "journal.log"), 10); err != nil {
		t.Fatal(err)
	}
	ts = mustOpen(t, cfg)
	if ts.Exists([]byte("b")) {
		t.Fatal("record behind a torn header replayed")
	}
	if err := ts.Put([]byte("c"), val("c", 1)); err != nil {
		t.Fatal(err)
	}
	crash(ts)
	ts = mustOpen(t, cfg)
	defer ts.Close()
	mustGet(t, ts, "c", val("c", 1))
	checkInvariants(t, ts)
}

func TestDirectIOFallback(t *testing.T) {
	probe := probeDirect
	probeDirect = func(int) error { return syscall.EINVAL } // a filesystem without O_DIRECT
	defer func() { probeDirect = probe }()
	cfg := testConfig(t.TempDir(), 4)
	cfg.DirectIO = DirectOn
	if _, err := Open(cfg); err == nil || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("direct on without O_DIRECT: %v", err)
	}
	cfg.DirectIO = DirectAuto
	ts := mustOpen(t, cfg)
	defer ts.Close()
	if ts.DirectIOActive() {
		t.Fatal("auto kept O_DIRECT")
	}
	if err := ts.Put([]byte("a"), val("a", 1)); err != nil {
		t.Fatal(err)
	}
	mustGet(t, ts, "a", val("a", 1))
	buf := ts.ReadBuffer()
	got, err := ts.Get([]byte("a"), buf)
	if err != nil || !bytes.Equal(got, val("a", 1)) {
		t.Fatalf("buffered in-place read: %v", err)
	}
}

// TestLargeGetsAIO: large values read back whole and unchanged from many
// goroutines at once: with AIO (when O_DIRECT is on, every reader in use)
// and with the helper split for the Gets that find no reader free.
func TestLargeGetsAIO(t *testing.T) {
	ts := mustOpen(t, Config{Paths: []string{t.TempDir()}, Bytes: 8 << 20, SlotBytes: 1 << 20, ContainerBytes: 4 << 20,
		Logger: zerolog.Nop()})
	defer ts.Close()
	values := make([][]byte, 6)
	for i := range values {
		v := make([]byte, ts.MaxValueBytes()-i*70001)
		for j := range v {
			v[j] = byte(j*13 + i)
		}
		values[i] = v
		if err := ts.Put([]byte(fmt.Sprint("big", i)), v); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := ts.ReadBuffer()
			for i := range 12 {
				k := (g + i) % len(values)
				got, err := ts.Get([]byte(fmt.Sprint("big", k)), dst)
				if err != nil || !bytes.Equal(got, values[k]) {
					t.Errorf("get big%d: %v (%d bytes)", k, err, len(got))
					return
				}
				dst = got
			}
		}()
	}
	wg.Wait()
	if st := ts.Stats(); st.Corrupt != 0 {
		t.Fatalf("stats %+v", st)
	}
	if r, err := newAIOReader(); err == nil { // AIO is there
		r.close()
		if ts.direct && ts.aioLive.Load() == 0 {
			t.Fatal("large O_DIRECT Gets made no AIO reader")
		}
	}
	dst, key := ts.ReadBuffer(), []byte("big1")
	if n := testing.AllocsPerRun(10, func() { dst, _ = ts.Get(key, dst) }); n != 0 || !bytes.Equal(dst, values[1]) {
		t.Fatalf("large get: %v allocations, equal %v", n, bytes.Equal(dst, values[1]))
	}
}
