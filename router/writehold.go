package router

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"strconv"
	"sync"
)

// Streams in fewer writes (issue 36). fasthttp's chunked body writer
// flushes every chunk, and the response's closing chunk (0\r\n\r\n) waits
// in its buffer for the server's flush after the handler's stream ends: a
// stream whose last events and end arrive together (a short answer, or the
// tail of any answer when the engine is ahead of the relay) would leave in
// two writes to the client, the last events and then five bytes. A
// connection of the front door holds them instead, from the moment the
// relay has read the end of the stream (relay.atEnd). On the goroutine
// front door they wait for the connection's next read, which sends them
// and the closing chunk from inside its wait, and then runs the request's
// bookkeeping, put off until then (frontheld.go, putOff). Where that
// cannot be (the loop front door, whose loop waits for the next request),
// the relay sends them with a closing chunk of its own as soon as the last
// events are written (sendEnd), in one system call, and fasthttp's own
// closing chunk, written after the relay's Close, is dropped: the client
// has its answer before the request's bookkeeping (the relay's Close: the
// attempt's end, metrics, tracing) and fasthttp's work after the handler,
// not after them. (Sending at once on the goroutine door too would cost it
// a read that finds nothing after every stream, measured at 16 connections:
// +0.65–1.0 reads per stream.) Only writes that nothing can follow but the
// closing chunk are held, so nothing waits for anything but the same
// goroutine's next write.

// lastChunk is the closing chunk of a chunked body without trailers, as
// fasthttp writes it (writeChunkNoFlush of nothing, then an empty
// trailer).
const lastChunk = "0\r\n\r\n"

// errEndMismatch: after the relay sent a stream's closing chunk, fasthttp
// wrote something other than its own (a trailer?): the connection's
// framing cannot be trusted, it is closed.
var errEndMismatch = errors.New("router: write after a stream's end is not its closing chunk")

// writeHold is a frontConn's held writes; only the connection's serving
// goroutine touches it.
type writeHold struct {
	on  bool    // writes are held
	buf *[]byte // what was held (pooled); nil: nothing
	// endLeft: the bytes of fasthttp's closing chunk still to be dropped
	// (sendEnd sent the relay's own).
	endLeft int
	// head: what is held is a stream's headers (holdHead), waiting for
	// its first chunk.
	head bool
	// spare: the connection's own buffer for its next held write, given
	// back by every write that sent what was held (putHoldBuf).
	spare *[]byte
	// once: the next chunk is held alone, to go out with the write after
	// it (holdOnce).
	once bool
}

// holdBufs are the buffers of held writes. One holds a stream's last
// events and its headers at most (a few KiB: the pump's batch); larger
// ones are not kept.
var holdBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, 8<<10)
	return &b
}}

const maxKeptHold = 64 << 10

// A connection keeps the buffer of its held writes between answers
// (writeHold.spare) rather than take one from holdBufs and put it back
// each time: a sync.Pool Get and Put a unary answer (~140 instructions,
// callgrind, docs/performance.md). Every write that sends what was held
// gives the buffer back here; one that outgrew maxKeptHold is dropped.
// The pool serves a connection's first held write, a second buffer while
// the first is held, and takes the spare back when the connection ends
// (releaseHoldBuf).

// holdBuf returns an empty buffer for the connection's held writes.
func (c *frontConn) holdBuf() *[]byte {
	if bp := c.hold.spare; bp != nil {
		c.hold.spare = nil
		return bp
	}
	return holdBufs.Get().(*[]byte)
}

// putHoldBuf gives bp back, emptied, b its last contents, unless b grew
// past maxKeptHold.
func (c *frontConn) putHoldBuf(bp *[]byte, b []byte) {
	if cap(b) > maxKeptHold {
		return
	}
	*bp = b[:0]
	if c.hold.spare == nil {
		c.hold.spare = bp
		return
	}
	holdBufs.Put(bp)
}

// releaseHoldBuf gives the connection's spare buffer back to the pool, once
// its serving goroutine is done with it (the connection closed).
func (c *frontConn) releaseHoldBuf() {
	if bp := c.hold.spare; bp != nil {
		c.hold.spare = nil
		holdBufs.Put(bp)
	}
}

// holdWrites holds the connection's writes until releaseHold; headers
// held by holdHead are held with them.
func (c *frontConn) holdWrites() {
	if c.hold.buf == nil {
		c.hold.buf = c.holdBuf()
	}
	c.hold.on, c.hold.head = true, false
}

// A stream's chunks are written by the relay straight into the client
// connection's write (writeChunk), framing and events in one buffer,
// rather than through fasthttp's chunked writer: that copies them into
// its 4 KiB writer and, for a held write, from there into the held
// buffer; a batch larger than the writer left it in two or three writes.
// The headers, which fasthttp writes into its writer, are flushed first
// (ImmediateHeaderFlush): when the engine's first bytes are already there
// the connection holds them (holdHead) and they leave with the first
// chunk, in one write, as they did in fasthttp's writer. The bytes the
// client receives are fasthttp's: the same framing (lower-case hex
// length, CRLFs), fasthttp's closing chunk and trailer after the relay's
// WriteTo (or the relay's own: sendEnd).

// streamDirect: streams are written by writeChunk (a test compares the
// bytes with fasthttp's chunked writer's, streamDirect off).
var streamDirect = true

// holdHead holds the stream headers fasthttp flushes next, for the
// stream's first chunk (writeChunk), or until sendHead.
func (c *frontConn) holdHead() {
	c.holdWrites()
	c.hold.head = true
}

// sendHead sends headers still held by holdHead (the stream wrote no
// chunk: a HEAD request, a client gone before its first event).
func (c *frontConn) sendHead() error {
	if !c.hold.head {
		return nil
	}
	c.hold.head = false
	c.releaseHold()
	return c.sendHeld()
}

// chunkWriter is a frontConn writing a stream's chunks (writeChunk): the
// relay's writer in place of fasthttp's chunked writer.
type chunkWriter frontConn

func (w *chunkWriter) Write(p []byte) (int, error) { return (*frontConn)(w).writeChunk(p) }

// writeChunk writes p as one chunk of a chunked body, its framing and
// bytes in one write: appended to what the connection holds, and held
// with it unless that is only the stream's headers (holdHead), or framed
// in a pooled buffer. The write goes the connection's usual way
// (writeAnswer: held for the next read while the goroutine door holds
// the stream's end, frontheld.go).
func (c *frontConn) writeChunk(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil // an empty chunk would end the body
	}
	h := &c.hold
	if h.once {
		h.once = false
		if !h.on || h.head {
			bp := h.buf
			if bp == nil {
				bp = c.holdBuf()
			}
			*bp = appendChunk(*bp, p)
			h.buf, h.on, h.head = bp, false, false
			return len(p), nil
		}
	}
	if c.ans.on && (h.buf == nil || h.head || !h.on) && c.heldChunk(p) {
		return len(p), nil
	}
	bp := h.buf
	if bp == nil {
		bp = c.holdBuf()
	}
	b := appendChunk(*bp, p)
	if h.buf != nil {
		if h.head {
			h.on, h.head = false, false
		}
		if h.on {
			*bp = b
			return len(p), nil
		}
		h.buf = nil
	}
	_, err := c.writeAnswer(b)
	c.putHoldBuf(bp, b)
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// A batch of events that ends where the engine's chunk does not (its
// data has not all arrived: upstream.Exchange.MidChunk) is held for the
// connection's next write (holdOnce), which sends it with its own bytes,
// the rest of the chunk's events, in one write (issue 36). A chunk's size
// is written before its data, so the engine had all of it when it began
// the chunk: the rest is in flight, not waiting for tokens. A zero-latency
// engine whose answer is larger than its 4 KiB writer sends it in two
// writes; a relay that reads between them wrote the client twice, and
// woke it for a part of the stream it cannot finish with. Nothing waits
// for long: every write sends what is held first, a heartbeat's too (a
// stream holds only where heartbeats are on), an error event's, the
// closing chunk's.

// holdOnce holds the connection's next chunk (writeChunk) for the write
// after it, unless writes are held already (holdWrites).
func (c *frontConn) holdOnce() { c.hold.once = true }

// heldChunk is writeChunk for a chunk the connection will send with its
// held answer (frontheld.go: the stream's end has been read): what writeChunk
// would pass to writeAnswer — the stream's headers held by holdHead or
// writes held before, then the chunk — is framed straight into the
// answer's held bytes, where writeAnswer would have framed it in the hold
// buffer and copied it there: the chunk's bytes copied once, not twice
// (a batch's few KiB). false, having written nothing: they would not be
// held (too large), writeChunk goes its usual way.
func (c *frontConn) heldChunk(p []byte) bool {
	h := &c.hold
	var held []byte
	if h.buf != nil {
		held = *h.buf
	}
	dst, ok := c.ans.h.HoldSpace(len(held) + len(p) + maxChunkFraming)
	if !ok {
		return false
	}
	if h.buf != nil {
		dst = append(dst, held...)
		c.putHoldBuf(h.buf, held)
		h.buf, h.on, h.head = nil, false, false
	}
	c.ans.h.SetHeld(appendChunk(dst, p))
	c.ans.pending.Store(true)
	return true
}

// maxChunkFraming bounds appendChunk's bytes around p: sixteen hex digits
// and two CRLFs.
const maxChunkFraming = 16 + 4

// appendChunk appends p framed as a chunk of a chunked body, as fasthttp
// frames it: its length in lower-case hex, CRLF, p, CRLF.
func appendChunk(b, p []byte) []byte {
	b = appendHexLen(b, uint64(len(p)))
	b = append(b, '\r', '\n')
	b = append(b, p...)
	return append(b, '\r', '\n')
}

// appendHexLen appends n in lower-case hex without leading zeros, as
// strconv.AppendUint(b, n, 16) does, by words (hexWord) below 1<<32:
// strconv's digit loop costs ~140 instructions a chunk (callgrind,
// docs/performance.md).
func appendHexLen(b []byte, n uint64) []byte {
	if n>>32 != 0 {
		return strconv.AppendUint(b, n, 16)
	}
	// All eight digits appended, the leading zeros shifted out at the
	// end and cut: one append, no copy.
	zeros := bits.LeadingZeros32(uint32(n)|1) / 4
	b = binary.BigEndian.AppendUint64(b, hexWord(uint32(n))<<(8*zeros))
	return b[:len(b)-zeros]
}

// releaseHold ends holding: the next write sends what was held with its
// own bytes, in one write.
func (c *frontConn) releaseHold() { c.hold.on = false }

// writeHeld is Write while the connection holds writes or has held some:
// p is held too, or sent with what was held.
func (c *frontConn) writeHeld(p []byte) (int, error) {
	h := &c.hold
	b := append(*h.buf, p...)
	if h.on {
		*h.buf = b
		return len(p), nil
	}
	bp := h.buf
	h.buf = nil
	n, err := c.write(b)
	held := len(b) - len(p)
	c.putHoldBuf(bp, b)
	if n < held {
		return 0, err
	}
	return n - held, err
}

// sendHeld sends what is held now (holding must be off), in one write; with
// nothing held it writes nothing.
func (c *frontConn) sendHeld() error {
	h := &c.hold
	if h.buf == nil {
		return nil
	}
	if len(*h.buf) == 0 {
		c.putHoldBuf(h.buf, *h.buf)
		h.buf = nil
		return nil
	}
	_, err := c.writeHeld(nil)
	return err
}

// sendEnd ends a held stream now (holding must be on): what was held goes
// out with the response's closing chunk, in one write, and the closing
// chunk fasthttp writes next is dropped (writeAfterEnd).
func (c *frontConn) sendEnd() error {
	h := &c.hold
	bp := h.buf
	b := append(*bp, lastChunk...)
	h.on, h.buf, h.endLeft = false, nil, len(lastChunk)
	_, err := c.write(b)
	c.putHoldBuf(bp, b)
	return err
}

// writeAfterEnd is Write after sendEnd: p begins with (the rest of)
// fasthttp's closing chunk, which is dropped; what follows it (the next
// response, when the client sent its next request early) is written.
func (c *frontConn) writeAfterEnd(p []byte) (int, error) {
	h := &c.hold
	n := 0
	for h.endLeft > 0 && n < len(p) {
		if p[n] != lastChunk[len(lastChunk)-h.endLeft] {
			return n, errEndMismatch
		}
		n++
		h.endLeft--
	}
	if n == len(p) {
		return n, nil
	}
	k, err := c.Write(p[n:])
	return n + k, err
}
