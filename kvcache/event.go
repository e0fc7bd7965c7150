package kvcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/infera/infera/msgpackx"
)

// EventType is the kind of a KV-cache event.
type EventType uint8

// Event types an engine publishes (DESIGN §7).
const (
	EventUnknown EventType = iota // a tag this decoder does not know; ignored
	EventBlockStored
	EventBlockRemoved
	EventAllBlocksCleared
)

func (t EventType) String() string {
	switch t {
	case EventBlockStored:
		return "BlockStored"
	case EventBlockRemoved:
		return "BlockRemoved"
	case EventAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Ignore says why the index must not apply a well-formed event.
type Ignore uint8

const (
	IgnoreNone      Ignore = iota
	IgnoreKind             // kv_cache_spec_kind is not an attention kind (e.g. sliding_window, mamba)
	IgnoreLoRA             // stored under a LoRA adapter: router hashes do not include the adapter
	IgnoreExtraKeys        // multimodal hashes or a cache salt feed the engine hash but not ours
	IgnoreMedium           // not the GPU tier (e.g. "CPU" offload): not a prefix-cache hit
)

// maxBlockSize bounds block_size in events and in Register.
const maxBlockSize = 1 << 20

// maxDepth bounds nesting when skipping unknown values, so a hostile payload
// of nested arrays cannot exhaust the stack.
const maxDepth = 32

// maxRetainTokens caps the token arena a Batch keeps between decodes; one
// oversized batch must not pin its memory forever.
const maxRetainTokens = 1 << 20

// Event is one decoded KV-cache event. Slices alias the Batch's arenas and
// are valid until the Batch is decoded into again.
type Event struct {
	Type   EventType
	Hashes []uint64 // engine block hashes (bytes hashes: low 8 bytes, big-endian)
	// Parent is the engine hash of the block the first stored block extends.
	Parent    uint64
	HasParent bool
	Tokens    []uint32 // BlockStored: len(Hashes)*BlockSize token ids
	BlockSize int
	Group     int // group_idx, when HasGroup
	HasGroup  bool
	Ignore    Ignore

	hashOff, tokOff, nHash, nTok int
}

// Batch is one decoded event batch. Reuse a Batch across Decode calls: its
// arenas then stop allocating once they have grown to the usual batch size.
type Batch struct {
	TS        float64
	DPRank    int
	HasDPRank bool
	Events    []Event
	Unknown   int // events with a type tag this decoder does not know

	hashes []uint64
	tokens []uint32
}

// Reset empties b, keeping its arenas.
func (b *Batch) Reset() {
	b.TS, b.DPRank, b.HasDPRank, b.Unknown = 0, 0, false, 0
	b.Events = b.Events[:0]
	b.hashes = b.hashes[:0]
	if cap(b.tokens) > maxRetainTokens {
		b.tokens = nil
	}
	b.tokens = b.tokens[:0]
}

// Decoder decodes msgpack event batches (DESIGN §7) without reflection and,
// with a reused Batch, without allocating. A Decoder is not safe for
// concurrent use; each subscriber connection owns one.
//
// It reads through a msgpackx.Reader (shared with kvd's frame decoder):
// vmihailenco/msgpack's streaming primitives over a bytes.Reader it owns,
// so strings and bytes hashes are sliced from the payload instead of
// copied, and containers skipped with a depth bound.
type Decoder struct {
	x *msgpackx.Reader
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	return &Decoder{x: msgpackx.NewReader()}
}

// Decode decodes one payload into b (reset first). Accepted shapes:
//
//	batch: [ts, [event…], dp_rank?]  or  {"ts", "events", "data_parallel_rank"|"dp_rank"}
//	event: ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//	        lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind, …]
//	       ["BlockRemoved", block_hashes, medium, group_idx, …]
//	       ["AllBlocksCleared", …]
//	       or a map with the same field names plus "type": "<tag>"
//
// Trailing array fields may be omitted (msgspec omit_defaults) and unknown
// map fields or extra array fields are ignored. Errors wrap ErrBadEvent; on
// error b holds a partial batch that must not be applied.
func (d *Decoder) Decode(payload []byte, b *Batch) error {
	b.Reset()
	d.x.Reset(payload)
	err := d.batch(b)
	if err == nil && d.x.Len() != 0 {
		err = errors.New("trailing bytes after batch")
	}
	d.x.Release()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadEvent, err)
	}
	for i := range b.Events {
		ev := &b.Events[i]
		he, te := ev.hashOff+ev.nHash, ev.tokOff+ev.nTok
		ev.Hashes = b.hashes[ev.hashOff:he:he]
		ev.Tokens = b.tokens[ev.tokOff:te:te]
	}
	return nil
}

// arrayLen reads an array header; nil reads as an empty array.
func (d *Decoder) arrayLen() (int, error) {
	n, err := d.x.ArrayLen()
	if err != nil {
		return 0, err
	}
	return max(n, 0), nil
}

func (d *Decoder) isNil() (bool, error) {
	c, err := d.x.Peek()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		_ = d.x.D.DecodeNil()
		return true, nil
	}
	return false, nil
}

func (d *Decoder) batch(b *Batch) error {
	c, err := d.x.Peek()
	if err != nil {
		return err
	}
	switch {
	case msgpackx.IsArray(c):
		n, err := d.arrayLen()
		if err != nil {
			return err
		}
		if n < 2 {
			return fmt.Errorf("batch array has %d elements, want [ts, events, dp_rank?]", n)
		}
		if b.TS, err = d.x.D.DecodeFloat64(); err != nil {
			return fmt.Errorf("ts: %w", err)
		}
		if err := d.events(b); err != nil {
			return err
		}
		if n >= 3 {
			if err := d.dpRank(b); err != nil {
				return err
			}
		}
		for i := 3; i < n; i++ {
			if err := d.x.Skip(1, maxDepth); err != nil {
				return err
			}
		}
		return nil
	case msgpackx.IsMap(c):
		n, err := d.x.D.DecodeMapLen()
		if err != nil {
			return err
		}
		sawEvents := false
		for range max(n, 0) {
			key, _, err := d.x.Raw()
			if err != nil {
				return fmt.Errorf("batch map key: %w", err)
			}
			switch string(key) {
			case "ts":
				if b.TS, err = d.x.D.DecodeFloat64(); err != nil {
					return fmt.Errorf("ts: %w", err)
				}
			case "events":
				if sawEvents {
					return errors.New("duplicate events field")
				}
				sawEvents = true
				if err := d.events(b); err != nil {
					return err
				}
			case "data_parallel_rank", "dp_rank":
				if err := d.dpRank(b); err != nil {
					return err
				}
			default:
				if err := d.x.Skip(1, maxDepth); err != nil {
					return err
				}
			}
		}
		if !sawEvents {
			return errors.New("batch map has no events")
		}
		return nil
	}
	return fmt.Errorf("batch is neither an array nor a map (code 0x%02x)", c)
}

func (d *Decoder) dpRank(b *Batch) error {
	if null, err := d.isNil(); err != nil || null {
		return err
	}
	r, err := d.x.D.DecodeInt64()
	if err != nil {
		return fmt.Errorf("dp_rank: %w", err)
	}
	if r < 0 || r > math.MaxInt32 {
		return fmt.Errorf("dp_rank %d out of range", r)
	}
	b.DPRank, b.HasDPRank = int(r), true
	return nil
}

func (d *Decoder) events(b *Batch) error {
	c, err := d.x.Peek()
	if err != nil {
		return err
	}
	if !msgpackx.IsArray(c) {
		return fmt.Errorf("events is not an array (code 0x%02x)", c)
	}
	n, err := d.arrayLen()
	if err != nil {
		return err
	}
	for i := range n {
		if err := d.event(b); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

// field numbers shared by the array and map forms.
const (
	fHashes = iota
	fParent
	fTokens
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroup
	fKind
	fSkip
)

// Positional layouts of the array form (after the tag), as msgspec
// array_like structs encode vLLM's and SGLang's event classes.
var (
	storedFields  = [...]int{fHashes, fParent, fTokens, fBlockSize, fLoRAID, fMedium, fLoRAName, fExtraKeys, fGroup, fKind}
	removedFields = [...]int{fHashes, fMedium, fGroup}
)

func mapField(key []byte) int {
	switch string(key) {
	case "block_hashes":
		return fHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokens
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroup
	case "kv_cache_spec_kind":
		return fKind
	}
	return fSkip
}

func eventType(tag []byte) EventType {
	switch string(tag) {
	case "BlockStored":
		return EventBlockStored
	case "BlockRemoved":
		return EventBlockRemoved
	case "AllBlocksCleared":
		return EventAllBlocksCleared
	}
	return EventUnknown
}

func (d *Decoder) event(b *Batch) error {
	c, err := d.x.Peek()
	if err != nil {
		return err
	}
	ev := Event{hashOff: len(b.hashes), tokOff: len(b.tokens)}
	switch {
	case msgpackx.IsArray(c):
		n, err := d.arrayLen()
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("empty event array")
		}
		tag, ok, err := d.x.Raw()
		if err != nil || !ok {
			return fmt.Errorf("event tag is not a string: %w", orNil(err))
		}
		ev.Type = eventType(tag)
		var layout []int
		switch ev.Type {
		case EventBlockStored:
			layout = storedFields[:]
		case EventBlockRemoved:
			layout = removedFields[:]
		}
		for i := 1; i < n; i++ {
			f := fSkip
			if i-1 < len(layout) {
				f = layout[i-1]
			}
			if err := d.field(b, &ev, f); err != nil {
				return err
			}
		}
	case msgpackx.IsMap(c):
		n, err := d.x.D.DecodeMapLen()
		if err != nil {
			return err
		}
		for range max(n, 0) {
			key, ok, err := d.x.Raw()
			if err != nil || !ok {
				return fmt.Errorf("event map key is not a string: %w", orNil(err))
			}
			if string(key) == "type" {
				tag, ok, err := d.x.Raw()
				if err != nil || !ok {
					return fmt.Errorf("event type is not a string: %w", orNil(err))
				}
				ev.Type = eventType(tag)
				continue
			}
			if err := d.field(b, &ev, mapField(key)); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("event is neither an array nor a map (code 0x%02x)", c)
	}
	return d.finish(b, &ev)
}

// finish validates a decoded event and appends it to the batch.
func (d *Decoder) finish(b *Batch, ev *Event) error {
	nh := len(b.hashes) - ev.hashOff
	nt := len(b.tokens) - ev.tokOff
	switch ev.Type {
	case EventUnknown:
		b.Unknown++
		b.hashes = b.hashes[:ev.hashOff]
		b.tokens = b.tokens[:ev.tokOff]
		return nil
	case EventBlockStored:
		if ev.Ignore == IgnoreNone && nh > 0 {
			if ev.BlockSize <= 0 {
				return errors.New("BlockStored without a valid block_size")
			}
			if nt != nh*ev.BlockSize {
				return fmt.Errorf("BlockStored has %d token ids for %d blocks of %d", nt, nh, ev.BlockSize)
			}
		}
	case EventAllBlocksCleared:
	case EventBlockRemoved:
		b.tokens = b.tokens[:ev.tokOff]
		nt = 0
	}
	// Only offsets and lengths for now: Decode points the slices into the
	// arenas once they have stopped growing.
	ev.nHash, ev.nTok = nh, nt
	b.Events = append(b.Events, *ev)
	return nil
}

func orNil(err error) error {
	if err == nil {
		return errors.New("nil")
	}
	return err
}

func (d *Decoder) field(b *Batch, ev *Event, f int) error {
	switch f {
	case fHashes:
		return d.hashes(b)
	case fParent:
		null, err := d.isNil()
		if err != nil || null {
			return err
		}
		// Engines that write 0 or an empty bytes hash for "no parent"
		// mean a root block, as nil does.
		if c, err := d.x.Peek(); err == nil && (msgpackx.IsBin(c) || msgpackx.IsStr(c)) {
			raw, _, err := d.x.Raw()
			if err != nil {
				return fmt.Errorf("parent_block_hash: %w", err)
			}
			if len(raw) == 0 {
				return nil
			}
			ev.Parent = bytesHash(raw)
			ev.HasParent = ev.Parent != 0
			return nil
		}
		h, err := d.hash()
		if err != nil {
			return fmt.Errorf("parent_block_hash: %w", err)
		}
		ev.Parent, ev.HasParent = h, h != 0
		return nil
	case fTokens:
		return d.tokens(b)
	case fBlockSize:
		v, err := d.x.D.DecodeInt64()
		if err != nil {
			return fmt.Errorf("block_size: %w", err)
		}
		if v < 0 || v > maxBlockSize {
			return fmt.Errorf("block_size %d out of range", v)
		}
		ev.BlockSize = int(v)
		return nil
	case fLoRAID:
		null, err := d.isNil()
		if err != nil || null {
			return err
		}
		v, err := d.x.D.DecodeInt64()
		if err != nil {
			return fmt.Errorf("lora_id: %w", err)
		}
		if v != 0 {
			ev.setIgnore(IgnoreLoRA)
		}
		return nil
	case fLoRAName:
		s, ok, err := d.x.Raw()
		if err != nil {
			return fmt.Errorf("lora_name: %w", err)
		}
		if ok && len(s) > 0 {
			ev.setIgnore(IgnoreLoRA)
		}
		return nil
	case fMedium:
		s, ok, err := d.x.Raw()
		if err != nil {
			return fmt.Errorf("medium: %w", err)
		}
		if ok && !bytes.EqualFold(s, []byte("GPU")) {
			ev.setIgnore(IgnoreMedium)
		}
		return nil
	case fExtraKeys:
		return d.extraKeys(ev)
	case fGroup:
		null, err := d.isNil()
		if err != nil || null {
			return err
		}
		v, err := d.x.D.DecodeInt64()
		if err != nil {
			return fmt.Errorf("group_idx: %w", err)
		}
		if v < 0 || v > math.MaxInt32 {
			return fmt.Errorf("group_idx %d out of range", v)
		}
		ev.Group, ev.HasGroup = int(v), true
		return nil
	case fKind:
		s, ok, err := d.x.Raw()
		if err != nil {
			return fmt.Errorf("kv_cache_spec_kind: %w", err)
		}
		if ok && !attentionKind(s) {
			ev.setIgnore(IgnoreKind)
		}
		return nil
	}
	return d.x.Skip(1, maxDepth)
}

// setIgnore keeps the first reason found; any reason means "do not index".
func (ev *Event) setIgnore(r Ignore) {
	if ev.Ignore == IgnoreNone {
		ev.Ignore = r
	}
}

func attentionKind(s []byte) bool {
	switch string(s) {
	case "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// extraKeys marks the event ignored when any block carries extra keys
// (multimodal feature hashes, cache salt): the engine hash then depends on
// inputs the router's token hash cannot see.
func (d *Decoder) extraKeys(ev *Event) error {
	if null, err := d.isNil(); err != nil || null {
		return err
	}
	c, err := d.x.Peek()
	if err != nil {
		return err
	}
	if !msgpackx.IsArray(c) {
		return fmt.Errorf("extra_keys is not an array (code 0x%02x)", c)
	}
	n, err := d.arrayLen()
	if err != nil {
		return err
	}
	for range n {
		null, err := d.isNil()
		if err != nil {
			return err
		}
		if null {
			continue
		}
		ev.setIgnore(IgnoreExtraKeys)
		if err := d.x.Skip(2, maxDepth); err != nil {
			return err
		}
	}
	return nil
}

// hash decodes one block hash: an unsigned or signed integer (two's
// complement kept), or bytes whose low 8 bytes are read big-endian.
func (d *Decoder) hash() (uint64, error) {
	c, err := d.x.Peek()
	if err != nil {
		return 0, err
	}
	switch {
	case msgpackx.IsInt(c):
		return d.x.D.DecodeUint64()
	case msgpackx.IsBin(c) || msgpackx.IsStr(c):
		raw, _, err := d.x.Raw()
		if err != nil {
			return 0, err
		}
		if len(raw) == 0 {
			return 0, errors.New("empty bytes hash")
		}
		return bytesHash(raw), nil
	}
	return 0, fmt.Errorf("hash has type code 0x%02x, want int or bytes", c)
}

func (d *Decoder) hashes(b *Batch) error {
	c, err := d.x.Peek()
	if err != nil {
		return err
	}
	if !msgpackx.IsArray(c) {
		return fmt.Errorf("block_hashes is not an array (code 0x%02x)", c)
	}
	n, err := d.arrayLen()
	if err != nil {
		return err
	}
	for i := range n {
		h, err := d.hash()
		if err != nil {
			return fmt.Errorf("block_hashes[%d]: %w", i, err)
		}
		b.hashes = append(b.hashes, h)
	}
	return nil
}

func (d *Decoder) token() (uint32, error) {
	c, err := d.x.Peek()
	if err != nil {
		return 0, err
	}
	if !msgpackx.IsInt(c) {
		return 0, fmt.Errorf("token id has type code 0x%02x", c)
	}
	v, err := d.x.D.DecodeInt64()
	if err != nil {
		return 0, err
	}
	if v < 0 || v > math.MaxUint32 {
		return 0, fmt.Errorf("token id %d out of range", v)
	}
	return uint32(v), nil
}

// tokens decodes token_ids: plain ids, or MTP bigram pairs [[a, b], …] of
// which the first element is the block's token. Runs of plain ids take the
// plainTokens fast path; anything else goes through the library.
func (d *Decoder) tokens(b *Batch) error {
	c, err := d.x.Peek()
	if err != nil {
		return err
	}
	if !msgpackx.IsArray(c) {
		return fmt.Errorf("token_ids is not an array (code 0x%02x)", c)
	}
	n, err := d.arrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		i += d.plainTokens(b, n-i)
		if i == n {
			break
		}
		c, err := d.x.Peek()
		if err != nil {
			return err
		}
		var t uint32
		if msgpackx.IsArray(c) {
			m, err := d.arrayLen()
			if err != nil {
				return err
			}
			if m == 0 {
				return fmt.Errorf("token_ids[%d]: empty token pair", i)
			}
			if t, err = d.token(); err != nil {
				return fmt.Errorf("token_ids[%d]: %w", i, err)
			}
			for range m - 1 {
				if err := d.x.Skip(2, maxDepth); err != nil {
					return err
				}
			}
		} else if t, err = d.token(); err != nil {
			return fmt.Errorf("token_ids[%d]: %w", i, err)
		}
		b.tokens = append(b.tokens, t)
	}
	return nil
}

// plainTokens appends up to max leading token ids encoded as msgpack
// positive fixint/uint8/uint16/uint32 straight from the payload and returns
// how many it consumed, stopping at the first other encoding (bigram pair,
// wider or negative int, garbage) for the general path to handle or reject.
// Token ids are nearly all of a batch's bytes, and the library's per-value
// cost through io.Reader (~50 ns) would dominate event throughput; this
// loop is a few ns per id.
func (d *Decoder) plainTokens(b *Batch, max int) int {
	start := len(d.x.Payload) - d.x.Len()
	p := d.x.Payload[start:]
	off, count := 0, 0
loop:
	for count < max && off < len(p) {
		c := p[off]
		switch {
		case c <= msgpcode.PosFixedNumHigh:
			b.tokens = append(b.tokens, uint32(c))
			off++
		case c == msgpcode.Uint8 && off+2 <= len(p):
			b.tokens = append(b.tokens, uint32(p[off+1]))
			off += 2
		case c == msgpcode.Uint16 && off+3 <= len(p):
			b.tokens = append(b.tokens, uint32(binary.BigEndian.Uint16(p[off+1:])))
			off += 3
		case c == msgpcode.Uint32 && off+5 <= len(p):
			b.tokens = append(b.tokens, binary.BigEndian.Uint32(p[off+1:]))
			off += 5
		default:
			break loop
		}
		count++
	}
	if off > 0 {
		d.x.Advance(off)
	}
	return count
}

// bytesHash reads a bytes hash: its low 8 bytes, big-endian.
func bytesHash(raw []byte) uint64 {
	if len(raw) > 8 {
		raw = raw[len(raw)-8:]
	}
	var h uint64
	for _, x := range raw {
		h = h<<8 | uint64(x)
	}
	return h
}
