package tablespace

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/infera/infera/internal/testkit"
)

// A Put's slot write and its journal append run concurrently, so a crash
// (a power loss) can leave a durable PUT record whose slot never got its
// bytes. Here Puts are held in flight (before the slot write, or with
// GroupCommit before the containers' sync) until their records are
// durable, and the files are copied then, with the containers as they were
// before those Puts, as a power loss leaves them. Replay must reject those
// records and keep each key's previous value (from the snapshot or an
// earlier journalled PUT), or miss a new key, never serve bytes of another
// block; without the rule the key points at a slot that fails
// verification (a corrupt miss: the acknowledged previous value lost).
func TestJournalledPutWithoutData(t *testing.T) {
	for _, group := range []bool{false, true} {
		t.Run(fmt.Sprint("group=", group), func(t *testing.T) {
			root := t.TempDir()
			dir, cp := filepath.Join(root, "live"), filepath.Join(root, "crashed")
			cfg := testConfig(dir, 12)
			cfg.GroupCommit = group
			ts := mustOpen(t, cfg)
			for _, k := range []string{"snap", "keep"} {
				if err := ts.Put([]byte(k), val(k, 1)); err != nil {
					t.Fatal(err)
				}
			}
			if err := ts.Snapshot(); err != nil { // "snap" and "keep" now live in the snapshot
				t.Fatal(err)
			}
			if err := ts.Put([]byte("jrnl"), val("jrnl", 1)); err != nil { // only in the journal
				t.Fatal(err)
			}
			containers := readContainers(t, dir)
			puts := []struct {
				key string
				n   int
			}{{"snap", 2}, {"new", 2}, {"jrnl", 2}, {"jrnl", 3}} // two unwritten versions of jrnl
			wantRej := uint64(3) // snap#2, new#2 and the later jrnl (the other is superseded)
			if group {
				// The first flush holds the containers' sync: only its
				// batch is durable in the journal. One overwrite.
				puts, wantRej = puts[:1], 1
			}
			release := make(chan struct{})
			hold := func() { <-release }
			if group {
				beforeDataSync = hold
			} else {
				beforeSlotWrite = hold
			}
			defer func() { beforeSlotWrite, beforeDataSync = nil, nil }()
			records := journalPuts(t, dir, cfg)
			errs := make(chan error, len(puts))
			for _, p := range puts {
				go func() { errs <- ts.Put([]byte(p.key), val(p.key, p.n)) }()
			}
			// The records are in the file (and synced, or about to be).
			testkit.Eventually(t, "the journal records", func() bool { return journalPuts(t, dir, cfg) >= records+len(puts) })
			copyDir(t, dir, cp)
			writeContainers(t, dir, cp, containers)
			close(release)
			for range puts {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if err := ts.Close(); err != nil {
				t.Fatal(err)
			}

			c := cfg
			c.Paths = []string{cp}
			for round := range 2 { // the second open reads the snapshot the first one wrote
				ts = mustOpen(t, c)
				for _, k := range []string{"snap", "keep", "jrnl"} {
					mustGet(t, ts, k, val(k, 1))
				}
				if _, err := ts.Get([]byte("new"), nil); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) {
					t.Fatalf("round %d: key whose only put lost its data: %v", round, err)
				}
				if round == 1 {
					wantRej = 0
				}
				if st := ts.Stats(); st.Corrupt != 0 || st.Entries != 3 || st.ReplayRejected != wantRej {
					t.Fatalf("round %d: stats %+v", round, st)
				}
				checkInvariants(t, ts)
				crash(ts)
			}
			ts = mustOpen(t, c) // still writable, the kept slots not handed out twice
			for i := range 9 {
				k := fmt.Sprint("w", i)
				if err := ts.Put([]byte(k), val(k, i)); err != nil {
					t.Fatal(err)
				}
			}
			for _, k := range []string{"snap", "keep", "jrnl"} {
				mustGet(t, ts, k, val(k, 1))
			}
			checkInvariants(t, ts)
			if err := ts.Close(); err != nil {
				t.Fatal(err)
			}
			ts = mustOpen(t, cfg) // the live copy has every acknowledged Put
			defer ts.Close()
			mustGet(t, ts, "snap", val("snap", 2))
			if !group {
				mustGet(t, ts, "new", val("new", 2))
				if v, err := ts.Get([]byte("jrnl"), nil); err != nil || (!bytes.Equal(v, val("jrnl", 2)) && !bytes.Equal(v, val("jrnl", 3))) {
					t.Fatalf("jrnl after both puts: %v", err)
				}
			}
		})
	}
}

// journalPuts counts the PUT records in dir's journal file.
func journalPuts(t *testing.T, dir string, cfg Config) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "journal.log"))
	if err != nil {
		t.Fatal(err)
	}
	g := geometry{slotBytes: cfg.SlotBytes, slotsPerContainer: int(cfg.ContainerBytes / cfg.SlotBytes),
		numSlots: int(cfg.Bytes / cfg.SlotBytes), maxValue: int(cfg.SlotBytes) - slotHeaderSize - MaxKeyBytes}
	epoch, err := parseJournalHeader(b, g)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	parseRecords(b[journalHeaderSize:], g, epoch, func(r *record) {
		if r.op == opPut {
			n++
		}
	})
	return n
}

// copyDir copies a shard's files (not LOCK) from src into a new dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	for _, name := range []string{"journal.log", "snapshot.bin"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dst, "containers"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func readContainers(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "containers", "*.bin"))
	if err != nil || len(names) == 0 {
		t.Fatalf("containers: %v %v", names, err)
	}
	m := map[string][]byte{}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		m[n] = b
	}
	return m
}

// writeContainers writes containers read from dir into dst.
func writeContainers(t *testing.T, dir, dst string, m map[string][]byte) {
	t.Helper()
	for n, b := range m {
		rel, err := filepath.Rel(dir, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, rel), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The replay rule on hand-made journals: which PUTs are read, which fall
// back, and that a PUT superseded later in the journal (here by the DEL of
// an eviction that names its seq) is never brought back by the fallback.
func TestReplayRejectsUnverifiedPut(t *testing.T) {
	type put struct {
		key string
		seq uint64
	}
	cases := []struct {
		name    string
		snap    []record // snapshot entries
		recs    []record // journal
		missing []put    // slots that do not hold their block
		want    map[string]uint64
		reads   int // holds calls
		rej     int
	}{{
		name:    "overwrite of a snapshot entry falls back to it",
		snap:    []record{{key: "a", seq: 1, slot: 0, vlen: 5}},
		recs:    []record{{op: opPut, key: "a", seq: 2, slot: 1, vlen: 6}},
		missing: []put{{"a", 2}},
		want:    map[string]uint64{"a": 1}, reads: 2, rej: 1,
	}, {
		name: "two unwritten overwrites fall back to the last written one",
		recs: []record{
			{op: opPut, key: "a", seq: 1, slot: 0, vlen: 5},
			{op: opPut, key: "a", seq: 2, slot: 1, vlen: 5},
			{op: opPut, key: "a", seq: 3, slot: 2, vlen: 5},
		},
		missing: []put{{"a", 2}, {"a", 3}},
		want:    map[string]uint64{"a": 1}, reads: 3, rej: 1,
	}, {
		name: "a new key without its data is a miss",
		recs: []record{
			{op: opPut, key: "a", seq: 1, slot: 0, vlen: 5},
			{op: opPut, key: "b", seq: 2, slot: 1, vlen: 5},
		},
		missing: []put{{"b", 2}},
		want:    map[string]uint64{"a": 1}, reads: 2, rej: 1,
	}, {
		name: "superseded puts are not read; an evicted overwrite does not resurrect the older value",
		recs: []record{
			{op: opPut, key: "a", seq: 1, slot: 0, vlen: 5},
			{op: opPut, key: "a", seq: 2, slot: 1, vlen: 5}, // frees slot 0, which keeps a#1's bytes
			{op: opDel, key: "a", seq: 2},                   // a#2 evicted ...
			{op: opPut, key: "b", seq: 3, slot: 1, vlen: 5}, // ... and its slot reused
			{op: opPut, key: "c", seq: 4, slot: 2, vlen: 5},
			{op: opDelAny, key: "c"},
		},
		want: map[string]uint64{"b": 3}, reads: 1,
	}, {
		name: "no fallback into a slot taken since: the put was durable, its slot damaged",
		recs: []record{
			{op: opPut, key: "a", seq: 1, slot: 0, vlen: 5},
			{op: opPut, key: "a", seq: 2, slot: 1, vlen: 5},
			{op: opPut, key: "b", seq: 3, slot: 0, vlen: 5},
		},
		missing: []put{{"a", 2}},
		want:    map[string]uint64{"b": 3}, reads: 2, rej: 1,
	}, {
		name: "no fallback into a version evicted while the overwrite was in flight",
		recs: []record{
			{op: opPut, key: "a", seq: 1, slot: 0, vlen: 5},
			{op: opPut, key: "a", seq: 2, slot: 1, vlen: 5}, // in flight: a#1 still indexed at run time ...
			{op: opDel, key: "a", seq: 1},                   // ... and evicted; slot 0 not rewritten yet
		},
		missing: []put{{"a", 2}},
		want:    map[string]uint64{}, reads: 1, rej: 1,
	}, {
		name: "puts before the last mark are trusted",
		recs: []record{
			{op: opPut, key: "a", seq: 1, slot: 0, vlen: 5},
			{op: opPut, key: "b", seq: 2, slot: 1, vlen: 5},
			{op: opMark}, // at its own offset: a and b had their data
			{op: opPut, key: "c", seq: 3, slot: 2, vlen: 5},
			{op: opMark, seq: 1 << 40}, // claims more than precedes it: capped at its offset
			{op: opPut, key: "d", seq: 4, slot: 3, vlen: 5},
		},
		missing: []put{{"a", 1}, {"d", 4}},
		want:    map[string]uint64{"a": 1, "b": 2, "c": 3}, reads: 1, rej: 1,
	}, {
		name: "a clear ends the history",
		recs: []record{
			{op: opPut, key: "a", seq: 1, slot: 0, vlen: 5},
			{op: opClear},
			{op: opPut, key: "a", seq: 2, slot: 1, vlen: 5},
		},
		missing: []put{{"a", 2}},
		want:    map[string]uint64{}, reads: 1, rej: 1,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := fuzzShard()
			for i := range c.snap {
				r := c.snap[i]
				r.op = opPut
				s.applyLocked(&r)
			}
			var body []byte
			for i := range c.recs {
				r := c.recs[i]
				if r.op == opMark && r.seq == 0 {
					r.seq = uint64(journalHeaderSize + len(body))
				}
				body = appendRecord(body, &r)
			}
			sealRecords(body, 1)
			reads := 0
			holds := func(key string, n *replayed) bool {
				reads++
				for _, m := range c.missing {
					if m.key == key && m.seq == n.seq {
						return false
					}
				}
				return true
			}
			n, end, rej, _ := s.replay(body, 1, holds)
			if n != len(c.recs) || end != len(body) {
				t.Fatalf("replayed %d/%d records, %d/%d bytes", n, len(c.recs), end, len(body))
			}
			got := map[string]uint64{}
			for k, sl := range s.index {
				got[k] = s.slots[sl].seq
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) || reads != c.reads || rej != c.rej {
				t.Fatalf("index %v (want %v), %d slot reads (want %d), %d rejected (want %d)", got, c.want, reads, c.reads, rej, c.rej)
			}
			checkShard(t, s)
		})
	}
}

// Marks bound recovery's reads: after many single Puts and a crash, only
// the PUTs since the last mark are read back, and every value is served.
func TestReplayReadsOnlyAfterLastMark(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 64)
	ts := mustOpen(t, cfg)
	const puts = 5*markEvery + 3
	for i := range puts {
		k := fmt.Sprint("k", i)
		if err := ts.Put([]byte(k), val(k, i)); err != nil {
			t.Fatal(err)
		}
	}
	crash(ts)
	ts = mustOpen(t, cfg)
	defer ts.Close()
	// Sequential Puts: a mark rides in the flush of every markEvery+1-th
	// PUT and covers the markEvery before it.
	if st := ts.Stats(); st.ReplayChecked == 0 || st.ReplayChecked > markEvery+3 || st.ReplayRejected != 0 || st.Entries != puts {
		t.Fatalf("stats %+v", st)
	}
	for i := range puts {
		k := fmt.Sprint("k", i)
		mustGet(t, ts, k, val(k, i))
	}
}
