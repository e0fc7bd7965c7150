package tablespace

import (
	"bytes"
	"fmt"
	"testing"
)

var fuzzGeom = geometry{slotBytes: 8192, slotsPerContainer: 4, numSlots: 16, maxValue: 8192 - slotHeaderSize - MaxKeyBytes}

func fuzzShard() *shard {
	s := &shard{g: fuzzGeom, head: -1, tail: -1}
	s.initIndex()
	return s
}

// FuzzJournalReplay: any journal body replays without panicking into a
// consistent index, the accepted prefix re-parses identically, and with the
// replay rule on (slots that hold their block chosen by seq) every entry a
// journalled PUT left in the index holds its block, and the replay is the
// plain one when every slot holds its block.
func FuzzJournalReplay(f *testing.F) {
	var b []byte
	b = appendRecord(b, &record{op: opPut, seq: 1, slot: 3, vlen: 100, key: "a"})
	b = appendRecord(b, &record{op: opPut, seq: 2, slot: 3, vlen: 7, key: "b"})
	b = appendRecord(b, &record{op: opDel, seq: 1, key: "a"})
	b = appendRecord(b, &record{op: opPut, seq: 3, slot: 15, vlen: 0, key: "a"})
	b = appendRecord(b, &record{op: opDelAny, key: "b"})
	b = appendRecord(b, &record{op: opClear})
	sealRecords(b, 1)
	f.Add(b)
	f.Add(append(b[:len(b):len(b)], make([]byte, 64)...)) // zero fill after the tail
	f.Add(b[:len(b)-3])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := fuzzShard()
		n := 0
		end := parseRecords(data, fuzzGeom, 1, func(r *record) {
			s.applyLocked(r)
			n++
		})
		if end < 0 || end > len(data) {
			t.Fatalf("end %d of %d", end, len(data))
		}
		checkShard(t, s)
		m := 0
		if again := parseRecords(data[:end], fuzzGeom, 1, func(*record) { m++ }); again != end || m != n {
			t.Fatalf("prefix re-parse %d/%d records %d/%d", again, end, m, n)
		}

		all := fuzzShard()
		if rn, rend, rej, _ := all.replay(data, 1, func(string, *replayed) bool { return true }); rn != n || rend != end || rej != 0 {
			t.Fatalf("replay with every slot written: %d records %d bytes %d rejected", rn, rend, rej)
		}
		if fmt.Sprint(all.index) != fmt.Sprint(s.index) {
			t.Fatalf("replay with every slot written differs from plain apply")
		}
		written := func(_ string, p *replayed) bool { return p.seq%3 != 0 }
		v := fuzzShard()
		v.replay(data, 1, written)
		checkShard(t, v)
		journalled := map[uint64]bool{}
		parseRecords(data, fuzzGeom, 1, func(r *record) {
			if r.op == opPut {
				journalled[r.seq] = true
			}
		})
		for _, sl := range v.index {
			if seq := v.slots[sl].seq; journalled[seq] && seq%3 == 0 {
				t.Fatalf("entry of seq %d kept without its data", seq)
			}
		}
	})
}

// FuzzSnapshotParse: any snapshot bytes parse without panicking; an
// accepted snapshot loads into a consistent index and re-encodes to itself.
func FuzzSnapshotParse(f *testing.F) {
	s := fuzzShard()
	s.applyLocked(&record{op: opPut, seq: 4, slot: 2, vlen: 9, key: "x"})
	s.applyLocked(&record{op: opPut, seq: 5, slot: 7, vlen: 1, key: "yy"})
	f.Add(encodeSnap(s, 3))
	f.Add(encodeSnap(fuzzShard(), 1))
	f.Add([]byte("ITSS"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := parseSnapshot(data, fuzzGeom)
		if err != nil {
			return
		}
		s := fuzzShard()
		s.epoch, s.nextSeq = d.epoch, d.nextSeq
		for i := range d.entries {
			r := d.entries[i]
			r.op = opPut
			s.applyLocked(&r)
		}
		checkShard(t, s)
		if s.live != len(d.entries) {
			t.Fatalf("%d entries loaded of %d", s.live, len(d.entries))
		}
		if out := encodeSnap(s, d.epoch); !bytes.Equal(out, data) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func encodeSnap(s *shard, epoch uint64) []byte { return s.encodeSnapshotLocked(epoch) }
