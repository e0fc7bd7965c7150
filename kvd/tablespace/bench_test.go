package tablespace

import (
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Benchmarks for docs/performance.md; INFERA_TABLESPACE_BENCH_DIR picks the
// filesystem (default the test temp dir). Values fill a 1 MiB slot; up to
// 320 blocks fit without eviction.
func benchTablespace(b *testing.B, group bool) *Tablespace {
	dir := b.TempDir()
	if d := os.Getenv("INFERA_TABLESPACE_BENCH_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "bench-"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	ts, err := Open(Config{Paths: []string{dir}, Bytes: 320 << 20, SlotBytes: 1 << 20, ContainerBytes: 64 << 20,
		GroupCommit: group, Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ts.Close() })
	return ts
}

func benchValue(ts *Tablespace) []byte {
	v := make([]byte, ts.MaxValueBytes())
	for i := range v {
		v[i] = byte(i * 31)
	}
	return v
}

// BenchmarkPut: one writer, every Put durable (data fdatasync + journal fdatasync).
func BenchmarkPut(b *testing.B) {
	ts := benchTablespace(b, false)
	v := benchValue(ts)
	b.SetBytes(int64(len(v)))
	b.ResetTimer()
	for i := range b.N {
		if err := ts.Put(fmt.Appendf(nil, "k%d", i), v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPutGroupParallel: concurrent writers sharing syncs (GroupCommit).
func BenchmarkPutGroupParallel(b *testing.B) {
	ts := benchTablespace(b, true)
	v := benchValue(ts)
	var n atomic.Int64
	b.SetBytes(int64(len(v)))
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := ts.Put(fmt.Appendf(nil, "k%d", n.Add(1)), v); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkGet: one reader over 256 stored blocks, reading in place.
func BenchmarkGet(b *testing.B) {
	ts := benchTablespace(b, true)
	v := benchValue(ts)
	blocks := min(256, b.N) // 256 blocks for the recorded runs, few for smoke runs
	for i := range blocks {
		if err := ts.Put(fmt.Appendf(nil, "k%d", i), v); err != nil {
			b.Fatal(err)
		}
	}
	keys := make([][]byte, blocks)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "k%d", i)
	}
	dst := ts.ReadBuffer()
	b.SetBytes(int64(len(v)))
	b.ResetTimer()
	for i := range b.N {
		var err error
		if dst, err = ts.Get(keys[i%blocks], dst); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVsDD measures the tablespace against dd with the same flags on
// the same filesystem, finely interleaved: every iteration is one round of
// three pairs over vsDDBlocks 1 MiB blocks each, dd and the tablespace
// (and raw, for get) taking turns going first, and each pair's ratio is
// taken within its round, so load drift on a shared machine hits both
// sides alike.
//
//	put:   dd oflag=direct,dsync        vs Put, one writer (O_DIRECT|O_DSYNC slot + journal fdatasync)
//	group: dd oflag=direct conv=fsync   vs Put, 4 writers, GroupCommit
//	get:   dd iflag=direct              vs Get into a ReadBuffer (O_DIRECT, CRC-32C checked)
//	       dd reads a file holding the very bytes of the slots the gets
//	       read; a second baseline ("raw") preads those slots at their
//	       offsets (where the round's gets find them: the put pair moves
//	       the keys to other slots) with O_DIRECT, unchecked, in the same
//	       round; and the
//	       check's CPU cost is reported as µs per MiB (verify-us/MiB).
//
// dd's own rate (from its summary line) excludes its process start; the
// tablespace's excludes its open. dd overwrites files allocated before
// the rounds (conv=notrunc), as the tablespace overwrites its
// pre-allocated containers. Reported: the median over rounds of
// each side's MB/s and of the per-round ratio (tablespace/dd).
// scripts/bench-tablespace.sh runs it.
func BenchmarkVsDD(b *testing.B) {
	dd, err := exec.LookPath("dd")
	if err != nil {
		b.Skip("dd not installed")
	}
	single, group := benchTablespace(b, false), benchTablespace(b, true)
	dir := single.shards[0].dir // the same filesystem
	v := benchValue(single)
	keys := make([][]byte, vsDDBlocks)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "k%d", i)
		if err := single.Put(keys[i], v); err != nil {
			b.Fatal(err)
		}
	}
	wfile, rfile := filepath.Join(dir, "dd-write"), filepath.Join(dir, "dd-read")
	count := "count=" + strconv.Itoa(vsDDBlocks)
	for _, f := range []string{wfile, rfile} { // allocated once, like the containers
		if _, err := runDD(dd, "if=/dev/zero", "of="+f, "bs=1M", count, "oflag=direct", "conv=fsync"); err != nil {
			b.Fatal(err)
		}
	}
	// The slots the gets read: dd reads a file holding the same bytes (each
	// slot's 1 MiB, in key order), and "raw" preads the slots themselves
	// with O_DIRECT into one aligned buffer, unchecked.
	type slotAt struct {
		fd  int
		off int64
		n   int
	}
	slots := make([]slotAt, len(keys))
	// locateSlots finds where the keys' slots are now: every put pair
	// writes the keys again, into other slots, so raw looks them up
	// before each get pair and reads what the gets read.
	locateSlots := func() {
		for i, k := range keys {
			sh := single.shardFor(k)
			sh.mu.Lock()
			sl := sh.index[string(k)]
			sh.mu.Unlock()
			c, off := sh.locate(sl)
			slots[i] = slotAt{sh.fds[c], off, alignUp(len(v) + slotHeaderSize + len(k))}
		}
	}
	locateSlots()
	same := make([]byte, 0, vsDDBlocks<<20)
	raw := alignedBuf(1 << 20)
	for _, sa := range slots {
		if err := preadFull(sa.fd, raw[:sa.n], sa.off); err != nil {
			b.Fatal(err)
		}
		same = append(same, raw[:1<<20]...)
	}
	if err := os.WriteFile(rfile, same, 0o600); err != nil {
		b.Fatal(err)
	}
	// Verification CPU per MiB: the CRC-32C of the slots' values, on one
	// core (what the check adds to a read when it is not overlapped).
	t0 := time.Now()
	for range 4 {
		for i := range vsDDBlocks {
			_ = crc(same[i<<20 : i<<20+len(v)])
		}
	}
	verifyUs := float64(time.Since(t0).Microseconds()) / float64(4*vsDDBlocks) * float64(1<<20) / float64(len(v))
	dst := single.ReadBuffer()
	mb := float64(vsDDBlocks) * float64(len(v)) / 1e6
	timed := func(f func() error) float64 {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		return mb / time.Since(t0).Seconds()
	}
	type pair struct {
		name   string
		ddArgs []string
		ts     func() error
	}
	pairs := []pair{
		{"put", []string{"if=/dev/zero", "of=" + wfile, "bs=1M", count, "oflag=direct,dsync", "conv=notrunc"}, func() error {
			for _, k := range keys {
				if err := single.Put(k, v); err != nil {
					return err
				}
			}
			return nil
		}},
		{"group", []string{"if=/dev/zero", "of=" + wfile, "bs=1M", count, "oflag=direct", "conv=fsync,notrunc"}, func() error {
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < len(keys) && errs[w] == nil; i += 4 {
						errs[w] = group.Put(keys[i], v)
					}
				}()
			}
			wg.Wait()
			return errors.Join(errs...)
		}},
		{"get", []string{"if=" + rfile, "of=/dev/null", "bs=1M", count, "iflag=direct"}, func() error {
			for _, k := range keys {
				var err error
				if dst, err = single.Get(k, dst); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	rawRead := func() error {
		for _, sa := range slots {
			if err := preadFull(sa.fd, raw[:sa.n], sa.off); err != nil {
				return err
			}
		}
		return nil
	}
	var rawRates, rawRatios []float64
	res := make(map[string][3][]float64) // dd, tablespace, ratio
	b.ResetTimer()
	for round := 0; round < b.N; round++ {
		for _, p := range pairs {
			var d, t, rr float64
			steps := []func(){
				func() {
					if d, err = runDD(dd, p.ddArgs...); err != nil {
						b.Fatal(err)
					}
				},
				func() { t = timed(p.ts) },
			}
			if p.name == "get" { // the second baseline, in the same round
				locateSlots()
				steps = append(steps, func() { rr = timed(rawRead) })
			}
			// Who goes first rotates by round (dd, tablespace and, for
			// get, raw), so that none is always run on a warmer or
			// colder machine than the others.
			for i := range steps {
				steps[(round+i)%len(steps)]()
			}
			r := res[p.name]
			r[0], r[1], r[2] = append(r[0], d), append(r[1], t), append(r[2], t/d)
			res[p.name] = r
			if p.name == "get" {
				rawRates, rawRatios = append(rawRates, rr), append(rawRatios, t/rr)
			}
		}
	}
	b.StopTimer()
	for _, p := range pairs {
		r := res[p.name]
		b.ReportMetric(median(r[0]), p.name+"-dd-MB/s")
		b.ReportMetric(median(r[1]), p.name+"-ts-MB/s")
		b.ReportMetric(median(r[2]), p.name+"-ratio")
	}
	b.ReportMetric(median(rawRates), "get-raw-MB/s")
	b.ReportMetric(median(rawRatios), "get-raw-ratio")
	b.ReportMetric(verifyUs, "verify-us/MiB")
	b.ReportMetric(0, "ns/op")
}

// vsDDBlocks is how many 1 MiB blocks each side moves per round.
const vsDDBlocks = 32

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}

// runDD runs dd and returns the MB/s it reports (bytes / seconds of its
// summary line "N bytes ... copied, S s, ...").
func runDD(dd string, args ...string) (float64, error) {
	out, err := exec.Command(dd, args...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("dd %v: %w: %s", args, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, " copied, ") {
			continue
		}
		f := strings.Fields(line)
		var bytes, secs float64
		for i, w := range f {
			if i == 0 {
				bytes, _ = strconv.ParseFloat(w, 64)
			}
			if (w == "s," || w == "s") && i > 0 {
				secs, _ = strconv.ParseFloat(f[i-1], 64)
			}
		}
		if bytes > 0 && secs > 0 {
			return bytes / secs / 1e6, nil
		}
	}
	return 0, fmt.Errorf("dd %v: no rate in %q", args, out)
}

// BenchmarkGetPerOp compares one Get with the raw O_DIRECT pread of the
// same slot op by op: every iteration reads each of vsDDBlocks slots once
// per variant, the variants in a random order per slot, each into its own
// aligned buffer, and reports the median over all ops of raw's time over
// the variant's (1.00 = as fast as the raw read) and each variant's median
// µs. Variants: get (Tablespace.Get), pread+crc (one pread, then crcUpdate
// of the value: Get's check without AIO) and pread+crc32 (the same with
// hash/crc32, the checksum Get used before crcUpdate). Finer than
// BenchmarkVsDD's rounds of 32 reads when the load drifts within seconds.
//
//	INFERA_TABLESPACE_BENCH_DIR=/var/tmp go test -run '^$' -bench GetPerOp -benchtime 40x ./kvd/tablespace/
func BenchmarkGetPerOp(b *testing.B) {
	ts := benchTablespace(b, true)
	v := benchValue(ts)
	keys := make([][]byte, vsDDBlocks)
	type slotAt struct {
		fd  int
		off int64
		n   int
	}
	slots := make([]slotAt, len(keys))
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "k%d", i)
		if err := ts.Put(keys[i], v); err != nil {
			b.Fatal(err)
		}
		sh := ts.shardFor(keys[i])
		sh.mu.Lock()
		sl := sh.index[string(keys[i])]
		sh.mu.Unlock()
		c, off := sh.locate(sl)
		slots[i] = slotAt{sh.fds[c], off, alignUp(len(v) + slotHeaderSize + len(keys[i]))}
	}
	names := []string{"raw", "get", "pread+crc", "pread+crc32"}
	bufs := make([][]byte, len(names))
	for i := range bufs {
		bufs[i] = alignedBuf(int(ts.cfg.SlotBytes))
	}
	dst := bufs[1][:0]
	us := make([][]float64, len(names))
	rng := rand.New(rand.NewPCG(1, 2))
	b.ResetTimer()
	for range b.N {
		for i, sa := range slots {
			for _, vi := range rng.Perm(len(names)) {
				var err error
				t0 := time.Now()
				switch vi {
				case 0:
					err = preadFull(sa.fd, bufs[0][:sa.n], sa.off)
				case 1:
					dst, err = ts.Get(keys[i], dst)
				case 2:
					if err = preadFull(sa.fd, bufs[2][:sa.n], sa.off); err == nil {
						_ = crcUpdate(0, bufs[2][:len(v)])
					}
				case 3:
					if err = preadFull(sa.fd, bufs[3][:sa.n], sa.off); err == nil {
						_ = crc32.Checksum(bufs[3][:len(v)], castagnoli)
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				us[vi] = append(us[vi], float64(time.Since(t0).Nanoseconds())/1e3)
			}
		}
	}
	b.StopTimer()
	for vi, name := range names {
		b.ReportMetric(median(us[vi]), name+"-us")
		if vi == 0 {
			continue
		}
		r := make([]float64, len(us[vi]))
		for j := range r {
			r[j] = us[0][j] / us[vi][j]
		}
		b.ReportMetric(median(r), "raw/"+name)
	}
	b.ReportMetric(0, "ns/op")
}
