package tablespace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// A Put's slot write and its journal append run concurrently, so a crash
// can leave a durable PUT record whose slot was never written. Replay must
// reject such a record and keep the key's previous value (from the
// snapshot or from an earlier journalled PUT), or report a miss for a new
// key, never bytes of another block; without the rule the index would point
// the key at a slot that fails verification (a corrupt miss, the acked
// previous value lost).
func TestJournalledPutWithoutData(t *testing.T) {
	for _, group := range []bool{false, true} {
		t.Run(fmt.Sprint("group=", group), func(t *testing.T) {
			dir := t.TempDir()
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
			saved := readContainers(t, dir)
			// Acknowledged here, but the test puts the containers back as
			// they were before: journal records durable, slot data lost.
			for _, k := range []string{"snap", "jrnl", "new"} {
				if err := ts.Put([]byte(k), val(k, 2)); err != nil {
					t.Fatal(err)
				}
			}
			if err := ts.Put([]byte("jrnl"), val("jrnl", 3)); err != nil { // two unwritten versions
				t.Fatal(err)
			}
			crash(ts)
			writeContainers(t, dir, saved)

			for round := range 2 { // the second open reads the snapshot the first one wrote
				ts = mustOpen(t, cfg)
				for _, k := range []string{"snap", "keep", "jrnl"} {
					mustGet(t, ts, k, val(k, 1))
				}
				if _, err := ts.Get([]byte("new"), nil); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) {
					t.Fatalf("round %d: key whose only put lost its data: %v", round, err)
				}
				wantRej := uint64(3) // snap#2, new#2, jrnl#3 (jrnl#2 is superseded, never read)
				if round == 1 {
					wantRej = 0
				}
				if st := ts.Stats(); st.Corrupt != 0 || st.Entries != 3 || st.ReplayRejected != wantRej {
					t.Fatalf("round %d: stats %+v", round, st)
				}
				checkInvariants(t, ts)
				crash(ts)
			}
			ts = mustOpen(t, cfg) // still writable, and the fallback slots are not handed out twice
			defer ts.Close()
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
		})
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

func writeContainers(t *testing.T, dir string, m map[string][]byte) {
	t.Helper()
	for n, b := range m {
		if err := os.WriteFile(n, b, 0o644); err != nil {
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
				body = appendRecord(body, &c.recs[i])
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
