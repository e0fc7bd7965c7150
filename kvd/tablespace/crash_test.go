package tablespace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

const (
	envCrashDir   = "INFERA_TABLESPACE_CRASH_DIR"
	envCrashBase  = "INFERA_TABLESPACE_CRASH_BASE"
	envCrashGroup = "INFERA_TABLESPACE_CRASH_GROUP"
	crashKeys     = 64
	crashWriters  = 8
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(envCrashDir); dir != "" {
		crashChild(dir)
		return
	}
	goleak.VerifyTestMain(m)
}

func crashConfig(dir string, group bool) Config {
	return Config{Paths: []string{filepath.Join(dir, "p0"), filepath.Join(dir, "p1")}, Bytes: 48 * 8192,
		SlotBytes: 8192, ContainerBytes: 8 * 8192, GroupCommit: group, SnapshotInterval: 10 * time.Millisecond,
		Logger: zerolog.Nop()}
}

func crashKey(i int) string { return fmt.Sprintf("key-%02d", i) }

// crashVal is the only value ever written for (key, counter): it embeds
// both and its remaining bytes derive from them, so any wrong byte shows.
func crashVal(key string, c int) []byte {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	x := h.Sum64() ^ uint64(c)*0x9e3779b97f4a7c15 | 1
	b := []byte(key + "|" + strconv.Itoa(c) + "|")
	n := 64 + int(x%6000)
	for len(b) < n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b = append(b, byte(x))
	}
	return b
}

// parseCrashVal returns the counter of a value for key that is exactly
// crashVal(key, counter), or ok=false for any wrong byte.
func parseCrashVal(key string, v []byte) (int, bool) {
	rest, ok := bytes.CutPrefix(v, []byte(key+"|"))
	if !ok {
		return 0, false
	}
	i := bytes.IndexByte(rest, '|')
	if i < 0 {
		return 0, false
	}
	c, err := strconv.Atoi(string(rest[:i]))
	if err != nil || !bytes.Equal(v, crashVal(key, c)) {
		return 0, false
	}
	return c, true
}

type lineOut struct{ mu sync.Mutex }

func (o *lineOut) print(s string) {
	o.mu.Lock()
	_, _ = os.Stdout.WriteString(s) // one write per line, lines never interleave
	o.mu.Unlock()
}

// crashChild runs until SIGKILLed: writers own disjoint keys and log every
// operation's start and acknowledgement, evictions log their intent; every
// read is checked against the owner's last acknowledged value.
func crashChild(dir string) {
	out := &lineOut{}
	bad := func(msg string) {
		out.print("BAD " + msg + "\n")
		os.Exit(3)
	}
	base, _ := strconv.Atoi(os.Getenv(envCrashBase))
	cfg := crashConfig(dir, os.Getenv(envCrashGroup) == "1")
	cfg.OnEvict = func(k []byte) { out.print("E " + string(k) + "\n") }
	if base/1000000%4 == 1 { // every other single-commit iteration: records often durable before their data
		beforeSlotWrite = func() { time.Sleep(time.Millisecond) }
	}
	ts, err := Open(cfg)
	if err != nil {
		bad("open: " + err.Error())
	}
	cur := make([]int, crashKeys) // owner's view: last acked counter, -1 absent
	for i := range cur {
		cur[i] = -1
		if v, err := ts.Get([]byte(crashKey(i)), nil); err == nil {
			c, ok := parseCrashVal(crashKey(i), v)
			if !ok {
				bad("wrong bytes at start for " + crashKey(i))
			}
			cur[i] = c
		}
	}
	out.print("READY\n")
	for g := range crashWriters {
		go func() {
			rng := rand.New(rand.NewPCG(uint64(base), uint64(g)))
			n := 0
			var dst []byte
			for {
				i := g + crashWriters*rng.IntN(crashKeys/crashWriters)
				k := crashKey(i)
				switch r := rng.IntN(100); {
				case r < 60:
					c := base + g*100000 + n
					n++
					out.print("S " + k + " " + strconv.Itoa(c) + "\n")
					if err := ts.Put([]byte(k), crashVal(k, c)); err != nil {
						bad("put: " + err.Error())
					}
					cur[i] = c
					out.print("A " + k + " " + strconv.Itoa(c) + "\n")
				case r < 72:
					out.print("D " + k + "\n")
					if err := ts.Delete([]byte(k)); err != nil {
						bad("delete: " + err.Error())
					}
					cur[i] = -1
					out.print("d " + k + "\n")
				default:
					v, err := ts.Get([]byte(k), dst)
					dst = v
					if err == nil {
						c, ok := parseCrashVal(k, v)
						if !ok || c != cur[i] {
							bad(fmt.Sprintf("get %s: served counter %d ok=%v, owner acked %d", k, c, ok, cur[i]))
						}
					}
				}
			}
		}()
	}
	go func() { // a reader of every key, checking values are self-consistent
		var dst []byte
		for i := 0; ; i = (i + 1) % crashKeys {
			v, err := ts.Get([]byte(crashKey(i)), dst)
			dst = v
			if err == nil {
				if _, ok := parseCrashVal(crashKey(i), v); !ok {
					bad("reader: wrong bytes for " + crashKey(i))
				}
			}
		}
	}()
	select {}
}

type crashKeyState struct {
	ack, ackStart      int // last acknowledged counter (-1 absent) and its start line
	pending            bool
	pendVal, pendStart int // pending op's outcome (-1 delete)
	lastEvict          int
}

// Acceptance 2: repeated SIGKILL during concurrent writes, overwrites,
// deletes, evictions and periodic snapshots; after each restart no wrong
// byte is served and every acknowledged write is present unless a later
// operation or a logged eviction may have removed it.
func TestCrashRecovery(t *testing.T) {
	dir := t.TempDir()
	iters := 20
	if testing.Short() {
		iters = 6
	}
	known := make([]int, crashKeys)
	for i := range known {
		known[i] = -1
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for it := range iters {
		group := it%2 == 1
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envCrashDir+"="+dir, envCrashBase+"="+strconv.Itoa((it+1)*1000000),
			envCrashGroup+"="+map[bool]string{true: "1", false: "0"}[group])
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		pipe, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var lines []string
		firstAck := make(chan struct{})
		readDone := make(chan struct{})
		go func() {
			defer close(readDone)
			sc := bufio.NewScanner(pipe)
			once := false
			for sc.Scan() {
				lines = append(lines, sc.Text())
				if !once && (strings.HasPrefix(sc.Text(), "A ") || strings.HasPrefix(sc.Text(), "BAD")) {
					once = true
					close(firstAck)
				}
			}
			_, _ = io.Copy(io.Discard, pipe)
			if !once {
				close(firstAck)
			}
		}()
		<-firstAck
		time.Sleep(time.Duration(5+rng.IntN(150)) * time.Millisecond) // a random kill point, not an assertion
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-readDone
		werr := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(werr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("iteration %d: child did not die by SIGKILL: %v\nstderr: %s\nlast lines: %v", it, werr, stderr.String(), tail(lines))
		}
		st := make([]crashKeyState, crashKeys)
		for i := range st {
			st[i] = crashKeyState{ack: known[i], ackStart: -1, lastEvict: -2}
		}
		keyIdx := func(k string) int {
			n, err := strconv.Atoi(strings.TrimPrefix(k, "key-"))
			if err != nil || n < 0 || n >= crashKeys {
				t.Fatalf("bad key in child output %q", k)
			}
			return n
		}
		acks := 0
		for pos, l := range lines {
			f := strings.Fields(l)
			if len(f) == 0 || f[0] == "READY" {
				continue
			}
			if f[0] == "BAD" {
				t.Fatalf("iteration %d: child: %s", it, l)
			}
			if len(f) < 2 {
				continue // the kill can cut nothing but whole lines; tolerate
			}
			s := &st[keyIdx(f[1])]
			switch f[0] {
			case "S":
				c, _ := strconv.Atoi(f[2])
				s.pending, s.pendVal, s.pendStart = true, c, pos
			case "A":
				c, _ := strconv.Atoi(f[2])
				s.ack, s.ackStart, s.pending = c, s.pendStart, false
				acks++
			case "D":
				s.pending, s.pendVal, s.pendStart = true, -1, pos
			case "d":
				s.ack, s.ackStart, s.pending = -1, s.pendStart, false
			case "E":
				s.lastEvict = pos
			}
		}
		ts, err := Open(crashConfig(dir, group))
		if err != nil {
			t.Fatalf("iteration %d: reopen: %v", it, err)
		}
		var dst []byte
		for i := range crashKeys {
			k := crashKey(i)
			got := -1
			v, err := ts.Get([]byte(k), dst)
			dst = v
			if err == nil {
				c, ok := parseCrashVal(k, v)
				if !ok {
					t.Fatalf("iteration %d: wrong bytes served for %s", it, k)
				}
				got = c
			}
			s := st[i]
			switch {
			case got == s.ack:
			case s.pending && got == s.pendVal:
			case got == -1 && s.lastEvict > s.ackStart:
			default:
				t.Fatalf("iteration %d: %s recovered as %d; acked %d (line %d), pending %v %d, last eviction line %d",
					it, k, got, s.ack, s.ackStart, s.pending, s.pendVal, s.lastEvict)
			}
			known[i] = got
		}
		checkInvariants(t, ts)
		if c := ts.Stats().Corrupt; c != 0 {
			t.Fatalf("iteration %d: %d slots failed verification", it, c)
		}
		t.Logf("iteration %d (group commit %v): %d lines, %d acked puts, %d entries recovered, %d journalled puts without data rejected",
			it, group, len(lines), acks, ts.Len(), ts.Stats().ReplayRejected)
		if err := ts.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func tail(l []string) []string { return l[max(0, len(l)-5):] }

// Every byte offset of the journal tail: reopening a journal cut there
// recovers exactly the state after the last whole operation, or (inside an
// operation's records, e.g. between an eviction's DEL and the PUT) a per-key
// mix of the states before and after it; never a wrong byte.
func TestJournalTruncationEveryOffset(t *testing.T) {
	root := scratchDir(t)
	src := filepath.Join(root, "src")
	cfg := testConfig(src, 6)
	ts := mustOpen(t, cfg)
	model := map[string][]byte{}
	type point struct {
		size       int64
		state      map[string][]byte
		containers [][]byte
	}
	containers := []string{"containers/0000.bin", "containers/0001.bin"}
	jpath := filepath.Join(src, "journal.log")
	snap := func() point {
		m := make(map[string][]byte, len(model))
		for k, v := range model {
			m[k] = v
		}
		p := point{size: ts.shards[0].journalBytes(), state: m}
		for _, f := range containers {
			b, err := os.ReadFile(filepath.Join(src, f))
			if err != nil {
				t.Fatal(err)
			}
			p.containers = append(p.containers, b)
		}
		return p
	}
	points := []point{snap()}
	lru := []string{} // to mirror the eviction order, oldest first
	touch := func(k string) {
		for i, x := range lru {
			if x == k {
				lru = append(lru[:i], lru[i+1:]...)
				break
			}
		}
		lru = append(lru, k)
	}
	drop := func(k string) {
		for i, x := range lru {
			if x == k {
				lru = append(lru[:i], lru[i+1:]...)
				return
			}
		}
	}
	put := func(k string, n int) {
		if err := ts.Put([]byte(k), val(k, n)); err != nil {
			t.Fatal(err)
		}
		if len(model) == 6 { // full: even an overwrite takes a fresh slot, evicting the LRU entry
			delete(model, lru[0])
			lru = lru[1:]
		}
		model[k] = val(k, n)
		touch(k)
		points = append(points, snap())
	}
	for i := range 8 {
		put(fmt.Sprint("k", i), i) // the last two evict
	}
	put("k7", 100) // overwrite
	put("k3", 101)
	if err := ts.Delete([]byte("k5")); err != nil {
		t.Fatal(err)
	}
	delete(model, "k5")
	drop("k5")
	points = append(points, snap())
	if err := ts.Clear(); err != nil {
		t.Fatal(err)
	}
	model, lru = map[string][]byte{}, nil
	points = append(points, snap())
	for i := range 9 {
		put(fmt.Sprint("m", i%7), i)
	}
	crash(ts)

	journal, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	last := points[len(points)-1].size
	if int64(len(journal)) < last || !bytes.Equal(journal[last:], make([]byte, len(journal)-int(last))) {
		t.Fatalf("journal %d bytes, last point %d, not zero filled after it", len(journal), last)
	}
	journal = journal[:last]
	type recSpan struct {
		start, end int64
		op         opKind
	}
	var recs []recSpan
	pos := int64(journalHeaderSize)
	parseRecords(journal[journalHeaderSize:], ts.shards[0].g, ts.shards[0].epoch, func(r *record) {
		end := pos + int64(recHeadSize+recFixed+len(r.key))
		recs = append(recs, recSpan{pos, end, r.op})
		pos = end
	})
	if pos != int64(len(journal)) {
		t.Fatalf("journal parses to %d of %d bytes", pos, len(journal))
	}
	snapshotBlob, err := os.ReadFile(filepath.Join(src, "snapshot.bin"))
	if err != nil {
		t.Fatal(err)
	}
	var dst []byte
	for off := int(points[0].size); off <= len(journal); off++ {
		dir := filepath.Join(root, fmt.Sprint("cut", off))
		if err := os.MkdirAll(filepath.Join(dir, "containers"), 0o755); err != nil {
			t.Fatal(err)
		}
		i := 0
		for i+1 < len(points) && points[i+1].size <= int64(off) {
			i++
		}
		// The containers as they were when the journal was cut here: a
		// PUT's data is written before its record, a DEL's or CLEAR's
		// record before any data that reuses the slot.
		ci := i
		for _, r := range recs {
			if int64(off) >= r.start && int64(off) < r.end && r.op == opPut {
				for ci < len(points)-1 && points[ci].size < r.end {
					ci++
				}
			}
		}
		next := points[min(i+1, len(points)-1)]
		cont := points[ci].containers
		if err := os.WriteFile(filepath.Join(dir, "snapshot.bin"), snapshotBlob, 0o644); err != nil {
			t.Fatal(err)
		}
		for j, f := range containers {
			if err := os.WriteFile(filepath.Join(dir, f), cont[j], 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "journal.log"), journal[:off], 0o644); err != nil {
			t.Fatal(err)
		}
		c := cfg
		c.Paths = []string{dir}
		ts, err := Open(c)
		if err != nil {
			t.Fatalf("offset %d: %v", off, err)
		}
		before, after := points[i].state, next.state
		exact := points[i].size == int64(off)
		seen := 0
		for _, m := range []map[string][]byte{before, after} {
			for k := range m {
				v, err := ts.Get([]byte(k), dst)
				dst = v
				present := err == nil
				matches := func(want []byte, ok bool) bool {
					return (!ok && !present) || (ok && present && bytes.Equal(v, want))
				}
				wb, okb := before[k]
				wa, oka := after[k]
				if !matches(wb, okb) && (exact || !matches(wa, oka)) {
					t.Fatalf("offset %d (op %d, exact %v): key %s inconsistent (present %v)", off, i, exact, k, present)
				}
			}
		}
		for k := range before {
			if ts.Exists([]byte(k)) {
				seen++
			}
		}
		for k := range after {
			if _, dup := before[k]; !dup && ts.Exists([]byte(k)) {
				seen++
			}
		}
		if ts.Len() != seen {
			t.Fatalf("offset %d: %d entries, %d expected keys present", off, ts.Len(), seen)
		}
		checkInvariants(t, ts)
		if ts.Stats().Corrupt != 0 {
			t.Fatalf("offset %d: corrupt slot", off)
		}
		crash(ts)
		_ = os.RemoveAll(dir)
	}
}

// scratchDir prefers tmpfs: the truncation test reopens the tablespace once
// per journal byte and each open fsyncs.
func scratchDir(t *testing.T) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "tablespace-test-"); err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}
