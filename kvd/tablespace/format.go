package tablespace

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc(b []byte) uint32 { return crcUpdate(0, b) }

// A slot holds the value first (so an aligned read lands it at offset 0 of
// the caller's buffer), then a 32-byte header, then the key. Header,
// little-endian:
//
//	[0:4] magic  [4:8] crc32c of value+[8:32]+key  [8:16] seq  [16:20] value len
//	[20:22] key len  [22:32] zero
const (
	slotHeaderSize = 32
	slotMagic      = 0x4c535449 // "ITSL"
)

func encodeSlot(sums *crcSplitter, buf []byte, seq uint64, key, val []byte) int {
	vl := len(val)
	n := vl + slotHeaderSize + len(key)
	valueCRC := sums.copyCRC(buf, val)
	h := buf[vl : vl+slotHeaderSize]
	binary.LittleEndian.PutUint32(h[0:], slotMagic)
	binary.LittleEndian.PutUint64(h[8:], seq)
	binary.LittleEndian.PutUint32(h[16:], uint32(vl))
	binary.LittleEndian.PutUint16(h[20:], uint16(len(key)))
	clear(h[22:32])
	copy(buf[vl+slotHeaderSize:], key)
	binary.LittleEndian.PutUint32(h[4:], crcUpdate(valueCRC, buf[vl+8:n]))
	return n
}

// verifySlot returns the value inside buf when buf is the slot written for
// (seq, key, vlen).
func verifySlot(sums *crcSplitter, buf []byte, seq uint64, key []byte, vlen int) ([]byte, bool) {
	if len(buf) < vlen {
		return nil, false
	}
	return verifySlotCRC(buf, seq, key, vlen, sums.copyCRC(nil, buf[:vlen]))
}

// verifySlotCRC is verifySlot with the CRC-32C of buf[:vlen] already known.
func verifySlotCRC(buf []byte, seq uint64, key []byte, vlen int, valueCRC uint32) ([]byte, bool) {
	n := vlen + slotHeaderSize + len(key)
	if len(buf) < n {
		return nil, false
	}
	h := buf[vlen:n]
	if binary.LittleEndian.Uint32(h[0:]) != slotMagic ||
		binary.LittleEndian.Uint64(h[8:]) != seq ||
		binary.LittleEndian.Uint32(h[16:]) != uint32(vlen) ||
		binary.LittleEndian.Uint16(h[20:]) != uint16(len(key)) ||
		string(h[slotHeaderSize:]) != string(key) ||
		binary.LittleEndian.Uint32(h[4:]) != crcUpdate(valueCRC, h[8:]) {
		return nil, false
	}
	return buf[:vlen], true
}

// Journal file: a 32-byte header then records.
//
//	header: [0:4] magic [4:8] version [8:16] epoch [16:24] slot bytes [24:28] slots
//	        [28:32] slots per container [32:36] zero [36:40] crc32c of [0:36]
//	record: [0:4] payload len [4:8] crc32c of payload, payload =
//	        epoch u64 | op u8 | seq u64 | slot u32 | value len u32 | key len u16 | key
//
// The file is reused across epochs: a snapshot rewrites only the header, and
// replay stops at the first record of another epoch, so leftovers of older
// epochs (and the zero fill of a new file) end the journal. Overwriting in
// place keeps the file size fixed, so a record's fdatasync is a pure data flush.
const (
	journalHeaderSize = 40
	journalMagic      = 0x4a535449 // "ITSJ"
	formatVersion     = 1
	recHeadSize       = 8
	recFixed          = 8 + 1 + 8 + 4 + 4 + 2
	maxRecPayload     = recFixed + MaxKeyBytes
)

type opKind uint8

const (
	opPut   opKind = 1
	opDel   opKind = 2 // removes key only if its entry still has seq
	opClear opKind = 3
	// opDelAny removes key whatever its version: an explicit Delete, which
	// must also win over an eviction that was unindexed but not yet journalled.
	opDelAny opKind = 4
	// opMark changes no entry: its seq field is a journal file offset such
	// that every PUT record ending at or before it had its slot data durable
	// when the mark was written, so replay need not read those slots. A
	// flush writes one in front of its batch once markEvery PUTs finished
	// since the last (a build without opMark stops replay at the first one,
	// as at a torn tail).
	opMark opKind = 5
)

type record struct {
	op   opKind
	seq  uint64
	slot int32
	vlen uint32
	key  string
}

type geometry struct {
	slotBytes         int64
	slotsPerContainer int
	numSlots          int
	maxValue          int
}

var errBadHeader = errors.New("bad header")

// sameGeometry checks slot bytes u64 | slots u32 | slots per container u32.
func sameGeometry(b []byte, g geometry) bool {
	return binary.LittleEndian.Uint64(b) == uint64(g.slotBytes) && binary.LittleEndian.Uint32(b[8:]) == uint32(g.numSlots) &&
		binary.LittleEndian.Uint32(b[12:]) == uint32(g.slotsPerContainer)
}

func encodeJournalHeader(epoch uint64, g geometry) []byte {
	b := make([]byte, journalHeaderSize)
	binary.LittleEndian.PutUint32(b[0:], journalMagic)
	binary.LittleEndian.PutUint32(b[4:], formatVersion)
	binary.LittleEndian.PutUint64(b[8:], epoch)
	binary.LittleEndian.PutUint64(b[16:], uint64(g.slotBytes))
	binary.LittleEndian.PutUint32(b[24:], uint32(g.numSlots))
	binary.LittleEndian.PutUint32(b[28:], uint32(g.slotsPerContainer))
	binary.LittleEndian.PutUint32(b[36:], crc(b[:36]))
	return b
}

// parseJournalHeader returns the epoch, or errBadHeader, or ErrGeometry.
func parseJournalHeader(b []byte, g geometry) (uint64, error) {
	if len(b) < journalHeaderSize || binary.LittleEndian.Uint32(b[0:]) != journalMagic ||
		binary.LittleEndian.Uint32(b[4:]) != formatVersion ||
		binary.LittleEndian.Uint32(b[36:]) != crc(b[:36]) {
		return 0, errBadHeader
	}
	if !sameGeometry(b[16:], g) {
		return 0, ErrGeometry
	}
	return binary.LittleEndian.Uint64(b[8:]), nil
}

// appendRecord appends r unsealed: sealRecords sets epoch and checksum when
// the record is written.
func appendRecord(b []byte, r *record) []byte {
	plen := recFixed + len(r.key)
	b = binary.LittleEndian.AppendUint32(b, uint32(plen))
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, 0)
	b = append(b, byte(r.op))
	b = binary.LittleEndian.AppendUint64(b, r.seq)
	b = binary.LittleEndian.AppendUint32(b, uint32(r.slot))
	b = binary.LittleEndian.AppendUint32(b, r.vlen)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.key)))
	return append(b, r.key...)
}

// sealRecords stamps every record of b (whole records from appendRecord)
// with epoch and its checksum.
func sealRecords(b []byte, epoch uint64) {
	for len(b) > 0 {
		plen := int(binary.LittleEndian.Uint32(b))
		p := b[recHeadSize : recHeadSize+plen]
		binary.LittleEndian.PutUint64(p, epoch)
		binary.LittleEndian.PutUint32(b[4:], crc(p))
		b = b[recHeadSize+plen:]
	}
}

// parseRecords calls fn for every whole, valid record of epoch in body (the
// journal after its header) in order and returns the length of that valid
// prefix; parsing stops at the first torn, invalid or other-epoch record.
func parseRecords(body []byte, g geometry, epoch uint64, fn func(*record)) int {
	off := 0
	var r record
	for {
		rest := body[off:]
		if len(rest) < recHeadSize {
			return off
		}
		plen := int(binary.LittleEndian.Uint32(rest[0:]))
		if plen < recFixed || plen > maxRecPayload || len(rest) < recHeadSize+plen {
			return off
		}
		p := rest[recHeadSize : recHeadSize+plen]
		if binary.LittleEndian.Uint32(rest[4:]) != crc(p) || binary.LittleEndian.Uint64(p) != epoch {
			return off
		}
		p = p[8:]
		r.op = opKind(p[0])
		r.seq = binary.LittleEndian.Uint64(p[1:])
		slot := binary.LittleEndian.Uint32(p[9:])
		r.vlen = binary.LittleEndian.Uint32(p[13:])
		klen := int(binary.LittleEndian.Uint16(p[17:]))
		if klen != plen-recFixed {
			return off
		}
		key := p[recFixed-8:]
		switch r.op {
		case opPut:
			if klen == 0 || slot >= uint32(g.numSlots) || int64(r.vlen) > int64(g.maxValue) {
				return off
			}
		case opDel, opDelAny:
			if klen == 0 {
				return off
			}
		case opClear, opMark:
			if klen != 0 {
				return off
			}
		default:
			return off
		}
		r.slot = int32(slot)
		r.key = string(key)
		fn(&r)
		off += recHeadSize + plen
	}
}

// Snapshot file:
//
//	[0:4] magic [4:8] version [8:16] journal epoch [16:24] slot bytes [24:28] slots
//	[28:32] slots per container [32:36] count [36:44] next seq, then count entries (LRU order, oldest first):
//	seq u64 | slot u32 | value len u32 | key len u16 | key; then crc32c of everything before.
const (
	snapMagic      = 0x53535449 // "ITSS"
	snapHeaderSize = 44
	snapEntryFixed = 8 + 4 + 4 + 2
)

type snapshotData struct {
	epoch   uint64
	nextSeq uint64
	entries []record // op unused
}

var errBadSnapshot = errors.New("bad snapshot")

func encodeSnapshot(b []byte, epoch, nextSeq uint64, g geometry, count int, each func(func(*record))) []byte {
	b = binary.LittleEndian.AppendUint32(b, snapMagic)
	b = binary.LittleEndian.AppendUint32(b, formatVersion)
	b = binary.LittleEndian.AppendUint64(b, epoch)
	b = binary.LittleEndian.AppendUint64(b, uint64(g.slotBytes))
	b = binary.LittleEndian.AppendUint32(b, uint32(g.numSlots))
	b = binary.LittleEndian.AppendUint32(b, uint32(g.slotsPerContainer))
	b = binary.LittleEndian.AppendUint32(b, uint32(count))
	b = binary.LittleEndian.AppendUint64(b, nextSeq)
	each(func(r *record) {
		b = binary.LittleEndian.AppendUint64(b, r.seq)
		b = binary.LittleEndian.AppendUint32(b, uint32(r.slot))
		b = binary.LittleEndian.AppendUint32(b, r.vlen)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(r.key)))
		b = append(b, r.key...)
	})
	return binary.LittleEndian.AppendUint32(b, crc(b))
}

// parseSnapshot validates a whole snapshot: checksum, geometry, every entry
// in range, no key or slot twice.
func parseSnapshot(b []byte, g geometry) (*snapshotData, error) {
	if len(b) < snapHeaderSize+4 || binary.LittleEndian.Uint32(b[0:]) != snapMagic ||
		binary.LittleEndian.Uint32(b[4:]) != formatVersion {
		return nil, errBadSnapshot
	}
	body := b[:len(b)-4]
	if binary.LittleEndian.Uint32(b[len(b)-4:]) != crc(body) {
		return nil, errBadSnapshot
	}
	if !sameGeometry(b[16:], g) {
		return nil, ErrGeometry
	}
	count := int(binary.LittleEndian.Uint32(b[32:]))
	if count > g.numSlots {
		return nil, errBadSnapshot
	}
	d := &snapshotData{epoch: binary.LittleEndian.Uint64(b[8:]), nextSeq: binary.LittleEndian.Uint64(b[36:]),
		entries: make([]record, 0, count)}
	used := make(map[int32]bool, count)
	keys := make(map[string]bool, count)
	off := snapHeaderSize
	for range count {
		if len(body)-off < snapEntryFixed {
			return nil, errBadSnapshot
		}
		e := body[off:]
		r := record{seq: binary.LittleEndian.Uint64(e[0:]), vlen: binary.LittleEndian.Uint32(e[12:])}
		slot := binary.LittleEndian.Uint32(e[8:])
		klen := int(binary.LittleEndian.Uint16(e[16:]))
		if klen == 0 || klen > MaxKeyBytes || len(e) < snapEntryFixed+klen || slot >= uint32(g.numSlots) ||
			int64(r.vlen) > int64(g.maxValue) || r.seq >= d.nextSeq {
			return nil, errBadSnapshot
		}
		r.slot = int32(slot)
		r.key = string(e[snapEntryFixed : snapEntryFixed+klen])
		if used[r.slot] || keys[r.key] {
			return nil, errBadSnapshot
		}
		used[r.slot], keys[r.key] = true, true
		d.entries = append(d.entries, r)
		off += snapEntryFixed + klen
	}
	if off != len(body) {
		return nil, errBadSnapshot
	}
	return d, nil
}
