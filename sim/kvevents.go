package sim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/infera/infera/config"
)

// KV events (DESIGN §7). The prefix cache reports every block it stores,
// evicts or forgets to a kvEvents on the scheduler goroutine; at the end of
// each scheduler step that changed the cache (sched.publish), the step's
// events are encoded as one batch in the imitated engine's msgpack encoding
// and appended to the event ring, which numbers it, keeps it for replay and
// wakes the PUB connections (zmq.go). The scheduler never waits on a
// subscriber.
//
// Engine block hashes are the simulator's own chain (cache.go: xxhash seeded
// with rootHash), not the router's (seeded with 0), exactly as a real
// engine's hashes differ from the router's: the router must map them through
// the token ids each BlockStored carries. A sequence's first block has no
// parent (nil parent_block_hash).

// eventKind is the type of one pending event.
type eventKind uint8

const (
	evStored eventKind = iota
	evRemoved
	evCleared
)

// pendingEvent is one event of the step being recorded; its hashes and
// tokens live in the kvEvents arenas.
type pendingEvent struct {
	kind      eventKind
	hashOff   int
	nHash     int
	tokOff    int
	parent    uint64
	hasParent bool
}

// maxBatchTokens splits a step whose stored blocks carry more token ids than
// this into several batches, so that one zero-latency drain of thousands of
// requests does not build one giant message.
const maxBatchTokens = 1 << 16

// kvEvents is the cacheObserver that publishes KV events. Everything but the
// ring and dropNext is owned by the scheduler goroutine.
type kvEvents struct {
	format    string
	blockSize int
	dpRank    int
	ring      *eventRing
	log       zerolog.Logger

	pending []pendingEvent
	hashes  []uint64
	tokens  []uint32

	buf bytes.Buffer
	enc *msgpack.Encoder
	mp  mpWriter

	// dropNext makes the next batch go into the replay buffer without being
	// published, as if the network had lost it (tests of gap recovery).
	dropNext atomic.Bool
}

func newKVEvents(cfg *config.Sim, log zerolog.Logger) *kvEvents {
	e := &kvEvents{
		format:    cfg.KVEventsFormat,
		blockSize: cfg.BlockSize,
		dpRank:    cfg.DPRank,
		ring:      newEventRing(cfg.KVEventsBuffer),
		log:       log,
	}
	e.enc = msgpack.NewEncoder(&e.buf)
	e.mp.enc = e.enc
	return e
}

// sglang reports whether events carry one block each with int64 hashes, as
// SGLang's radix cache publishes them page by page.
func (e *kvEvents) sglang() bool { return e.format == config.KVFormatSGLang }

func (e *kvEvents) last() *pendingEvent {
	if len(e.pending) == 0 {
		return nil
	}
	return &e.pending[len(e.pending)-1]
}

// blockStored records a stored block. Blocks stored one after the other
// along one chain join the same BlockStored event (vLLM emits one per
// request per step); parent is rootHash for a sequence's first block.
func (e *kvEvents) blockStored(hash, parent uint64, tokens []uint32) {
	if l := e.last(); l != nil && l.kind == evStored && !e.sglang() && e.hashes[len(e.hashes)-1] == parent {
		l.nHash++
	} else {
		e.pending = append(e.pending, pendingEvent{
			kind: evStored, hashOff: len(e.hashes), nHash: 1, tokOff: len(e.tokens),
			parent: parent, hasParent: parent != rootHash,
		})
	}
	e.hashes = append(e.hashes, hash)
	e.tokens = append(e.tokens, tokens...)
	if len(e.tokens) >= maxBatchTokens {
		e.flush()
	}
}

// blockRemoved records an evicted block; consecutive evictions share one
// BlockRemoved event (one per block for SGLang).
func (e *kvEvents) blockRemoved(hash uint64) {
	if l := e.last(); l != nil && l.kind == evRemoved && !e.sglang() {
		l.nHash++
	} else {
		e.pending = append(e.pending, pendingEvent{kind: evRemoved, hashOff: len(e.hashes), nHash: 1})
	}
	e.hashes = append(e.hashes, hash)
}

// allCleared records a prefix-cache reset.
func (e *kvEvents) allCleared() {
	e.pending = append(e.pending, pendingEvent{kind: evCleared, hashOff: len(e.hashes)})
}

// flush encodes the recorded events as one batch and hands it to the ring.
// It does nothing when the step changed nothing.
func (e *kvEvents) flush() {
	if len(e.pending) == 0 {
		return
	}
	e.buf.Reset()
	e.mp.err = nil
	e.encodeBatch(float64(time.Now().UnixNano()) / 1e9)
	if e.mp.err != nil {
		// Encoding into a bytes.Buffer cannot fail; if it ever does, the
		// lost batch shows up downstream as a sequence gap.
		e.log.Error().Err(e.mp.err).Msg("kv events batch not encoded")
	} else {
		e.ring.push(e.buf.Bytes(), e.dropNext.Swap(false))
	}
	e.pending = e.pending[:0]
	e.hashes = e.hashes[:0]
	if cap(e.tokens) > 4*maxBatchTokens {
		e.tokens = nil // one huge step must not pin its arena
	}
	e.tokens = e.tokens[:0]
	if e.buf.Cap() > 1<<22 {
		e.buf = bytes.Buffer{}
		e.enc.Reset(&e.buf)
	}
}

// encodeBatch writes [ts, [event…], dp_rank]: vLLM's KVEventBatch and
// SGLang's KVEventBatch are msgspec array_like structs with those fields.
func (e *kvEvents) encodeBatch(ts float64) {
	m := &e.mp
	m.arr(3)
	m.f64(ts)
	m.arr(len(e.pending))
	for i := range e.pending {
		ev := &e.pending[i]
		switch e.format {
		case config.KVFormatVLLM:
			e.encodeMap(ev)
		default:
			e.encodeArray(ev)
		}
	}
	m.int(int64(e.dpRank))
}

// encodeMap writes one event as a tagged map, the msgspec encoding of
// vLLM's event classes without array_like.
func (e *kvEvents) encodeMap(ev *pendingEvent) {
	m := &e.mp
	switch ev.kind {
	case evStored:
		m.mapLen(9)
		m.str("type")
		m.str("BlockStored")
		m.str("block_hashes")
		e.encodeHashes(ev)
		m.str("parent_block_hash")
		e.encodeParent(ev)
		m.str("token_ids")
		e.encodeTokens(ev)
		m.str("block_size")
		m.int(int64(e.blockSize))
		m.str("lora_id")
		m.null()
		m.str("medium")
		m.str("GPU")
		m.str("lora_name")
		m.null()
		m.str("extra_keys")
		m.null()
	case evRemoved:
		m.mapLen(3)
		m.str("type")
		m.str("BlockRemoved")
		m.str("block_hashes")
		e.encodeHashes(ev)
		m.str("medium")
		m.str("GPU")
	case evCleared:
		m.mapLen(1)
		m.str("type")
		m.str("AllBlocksCleared")
	}
}

// encodeArray writes one event as a msgspec tagged array (array_like, tag
// first, trailing default fields omitted as omit_defaults does): vLLM's
// BlockStored(block_hashes, parent_block_hash, token_ids, block_size,
// lora_id, medium) and BlockRemoved(block_hashes, medium); SGLang's
// BlockStored(block_hashes, parent_block_hash, token_ids, block_size,
// lora_id) and BlockRemoved(block_hashes), whose medium defaults to None.
func (e *kvEvents) encodeArray(ev *pendingEvent) {
	m := &e.mp
	sg := e.sglang()
	switch ev.kind {
	case evStored:
		if sg {
			m.arr(6)
		} else {
			m.arr(7)
		}
		m.str("BlockStored")
		e.encodeHashes(ev)
		e.encodeParent(ev)
		e.encodeTokens(ev)
		m.int(int64(e.blockSize))
		m.null()
		if !sg {
			m.str("GPU")
		}
	case evRemoved:
		if sg {
			m.arr(2)
		} else {
			m.arr(3)
		}
		m.str("BlockRemoved")
		e.encodeHashes(ev)
		if !sg {
			m.str("GPU")
		}
	case evCleared:
		m.arr(1)
		m.str("AllBlocksCleared")
	}
}

// hash writes one engine block hash: vLLM publishes its hashes as unsigned
// 64-bit integers (the low 8 bytes of its digest), SGLang as signed int64.
func (e *kvEvents) hash(h uint64) {
	if e.sglang() {
		e.mp.int(int64(h))
	} else {
		e.mp.uint(h)
	}
}

func (e *kvEvents) encodeHashes(ev *pendingEvent) {
	e.mp.arr(ev.nHash)
	for _, h := range e.hashes[ev.hashOff : ev.hashOff+ev.nHash] {
		e.hash(h)
	}
}

func (e *kvEvents) encodeParent(ev *pendingEvent) {
	if ev.hasParent {
		e.hash(ev.parent)
	} else {
		e.mp.null()
	}
}

// encodeTokens writes token_ids. Token ids are most of a batch's bytes, so
// they are appended straight into the buffer in the compact unsigned
// encodings msgpack.Encoder.EncodeUint would choose, without its per-value
// writer calls.
func (e *kvEvents) encodeTokens(ev *pendingEvent) {
	n := ev.nHash * e.blockSize
	e.mp.arr(n)
	toks := e.tokens[ev.tokOff : ev.tokOff+n]
	e.buf.Grow(5 * len(toks))
	b := e.buf.AvailableBuffer()
	for _, t := range toks {
		switch {
		case t <= uint32(msgpcode.PosFixedNumHigh):
			b = append(b, byte(t))
		case t <= math.MaxUint8:
			b = append(b, msgpcode.Uint8, byte(t))
		case t <= math.MaxUint16:
			b = append(b, msgpcode.Uint16, byte(t>>8), byte(t))
		default:
			b = append(b, msgpcode.Uint32)
			b = binary.BigEndian.AppendUint32(b, t)
		}
	}
	e.buf.Write(b)
}

// mpWriter wraps a msgpack.Encoder and keeps its first error, so the event
// encoders read as the wire layout instead of error plumbing.
type mpWriter struct {
	enc *msgpack.Encoder
	err error
}

func (m *mpWriter) keep(err error) {
	if err != nil && m.err == nil {
		m.err = fmt.Errorf("encode kv event batch: %w", err)
	}
}

func (m *mpWriter) arr(n int)     { m.keep(m.enc.EncodeArrayLen(n)) }
func (m *mpWriter) mapLen(n int)  { m.keep(m.enc.EncodeMapLen(n)) }
func (m *mpWriter) str(s string)  { m.keep(m.enc.EncodeString(s)) }
func (m *mpWriter) uint(v uint64) { m.keep(m.enc.EncodeUint(v)) }
func (m *mpWriter) int(v int64)   { m.keep(m.enc.EncodeInt(v)) }
func (m *mpWriter) f64(v float64) { m.keep(m.enc.EncodeFloat64(v)) }
func (m *mpWriter) null()         { m.keep(m.enc.EncodeNil()) }
