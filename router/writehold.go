package router

import "sync"

// Streams in fewer writes (issue 36). fasthttp's chunked body writer
// flushes every chunk, and the response's closing chunk (0\r\n\r\n) waits
// in its buffer for the server's flush after the handler's stream ends: a
// stream whose last events and end arrive together (a short answer, or the
// tail of any answer when the engine is ahead of the relay) would leave in
// two writes to the client, the last events and then five bytes. A
// connection of the front door can hold its writes instead: the relay
// holds them from the moment it has read the end of the stream (relay.
// atEnd) until the stream's Close, and the next write, the server's flush
// of the closing chunk, sends what was held with it in one system call.
// Only writes that nothing can follow but the closing chunk are held, so
// nothing waits for anything but the same goroutine's next flush.

// writeHold is a frontConn's held writes; only the connection's serving
// goroutine touches it.
type writeHold struct {
	on  bool    // writes are held
	buf *[]byte // what was held (pooled); nil: nothing
}

// holdBufs are the buffers of held writes. One holds a stream's last
// events and its headers at most (a few KiB: the pump's batch); larger
// ones are not kept.
var holdBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, 8<<10)
	return &b
}}

const maxKeptHold = 64 << 10

// holdWrites holds the connection's writes until releaseHold.
func (c *frontConn) holdWrites() {
	if c.hold.buf == nil {
		c.hold.buf = holdBufs.Get().(*[]byte)
	}
	c.hold.on = true
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
	n, err := c.Conn.Write(b)
	held := len(b) - len(p)
	if cap(b) <= maxKeptHold {
		*bp = b[:0]
		holdBufs.Put(bp)
	}
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
		holdBufs.Put(h.buf)
		h.buf = nil
		return nil
	}
	_, err := c.writeHeld(nil)
	return err
}
