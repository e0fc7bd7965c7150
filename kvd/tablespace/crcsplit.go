package tablespace

import (
	"sync"
	"sync/atomic"
)

// A 1 MiB slot's CRC-32C and its copy into the aligned write buffer are
// most of a Put's CPU, and its CRC most of a Get's, all of it serial in
// front of (or behind) the device wait. crcSplitter does the second half
// of each on a goroutine of its own, so a machine with a spare core
// halves that time; when the helper is busy with another caller's half the
// caller does the whole itself, so nobody waits on it.

// crcSplitMin is the size from which a buffer is split: below it the
// hand-off costs more than half the checksum.
const crcSplitMin = 256 << 10

// crcHalf is the half a helper works on: the CRC-32C of src, and src
// copied to dst when dst is not nil.
type crcHalf struct {
	dst, src []byte
	sum      uint32
	done     chan struct{}
}

// The helper works on one half at a time, so one crcHalf serves every
// caller: the one that claims it (busy) hands it over, the others sum
// alone.
type crcSplitter struct {
	work chan *crcHalf
	half crcHalf
	busy atomic.Bool
	stop chan struct{}
	wg   sync.WaitGroup
}

func newCRCSplitter() *crcSplitter {
	c := &crcSplitter{work: make(chan *crcHalf), stop: make(chan struct{})}
	c.half.done = make(chan struct{}, 1)
	c.wg.Add(1)
	go c.run()
	return c
}

func (c *crcSplitter) run() {
	defer c.wg.Done()
	for {
		select {
		case <-c.stop:
			return
		case h := <-c.work:
			if h.dst != nil {
				copy(h.dst, h.src)
			}
			h.sum = crc(h.src)
			h.done <- struct{}{}
		}
	}
}

func (c *crcSplitter) close() {
	close(c.stop)
	c.wg.Wait()
}

// copyCRC copies src to dst (when dst is not nil; len(dst) >= len(src))
// and returns the CRC-32C of src. A nil splitter does it all itself.
func (c *crcSplitter) copyCRC(dst, src []byte) uint32 {
	if c == nil || len(src) < crcSplitMin {
		if dst != nil {
			copy(dst, src)
		}
		return crc(src)
	}
	mid := len(src) / 2 &^ 4095              // whole pages on both sides
	if !c.busy.CompareAndSwap(false, true) { // another caller has the helper
		if dst != nil {
			copy(dst, src)
		}
		return crc(src)
	}
	h := &c.half
	h.src, h.dst = src[mid:], nil
	if dst != nil {
		h.dst = dst[mid:len(src)]
	}
	select {
	case c.work <- h:
	case <-c.stop: // closed: all of it here
		h.dst, h.src = nil, nil
		c.busy.Store(false)
		if dst != nil {
			copy(dst, src)
		}
		return crc(src)
	}
	if dst != nil {
		copy(dst, src[:mid])
	}
	first := crc(src[:mid])
	<-h.done
	second := h.sum
	h.dst, h.src = nil, nil
	c.busy.Store(false)
	return crc32Combine(first, second, len(src)-mid)
}

// readCRC reads buf from fd at off and returns the CRC-32C of its first
// vlen bytes, overlapping the read with the check: for a large value the
// first half is read, handed to the helper to sum while the second half is
// read here, and the second half is summed here when its read is done.
// Half boundaries are whole pages, so O_DIRECT reads stay aligned. When the
// helper is busy (or the value small) it reads, then sums, alone.
func (c *crcSplitter) readCRC(fd int, buf []byte, off int64, vlen int) (uint32, error) {
	mid := vlen / 2 &^ 4095
	if c == nil || vlen < crcSplitMin || !c.busy.CompareAndSwap(false, true) {
		if err := preadFull(fd, buf, off); err != nil {
			return 0, err
		}
		return c.copyCRC(nil, buf[:vlen]), nil
	}
	h := &c.half
	defer func() {
		h.dst, h.src = nil, nil
		c.busy.Store(false)
	}()
	if err := preadFull(fd, buf[:mid], off); err != nil {
		return 0, err
	}
	h.src, h.dst = buf[:mid], nil
	select {
	case c.work <- h:
	case <-c.stop: // closed: all of it here
		if err := preadFull(fd, buf[mid:], off+int64(mid)); err != nil {
			return 0, err
		}
		return crc(buf[:vlen]), nil
	}
	err := preadFull(fd, buf[mid:], off+int64(mid))
	var second uint32
	if err == nil {
		second = crc(buf[mid:vlen])
	}
	<-h.done // the helper reads buf until then
	if err != nil {
		return 0, err
	}
	return crc32Combine(h.sum, second, vlen-mid), nil
}

// crc32Combine returns the CRC-32C of A||B from crcA = CRC(A), crcB =
// CRC(B) and len(B): appending n bytes multiplies A's remainder by x^(8n)
// modulo the polynomial, and the initial and final inversions of the
// standard CRC cancel out in the sum.
func crc32Combine(crcA, crcB uint32, lenB int) uint32 {
	return gfMul(crcA, xPow8n(uint64(lenB))) ^ crcB
}

// castagnoliReflected is the Castagnoli polynomial, bit-reversed as the
// table-driven CRC uses it (x^0 in the top bit).
const castagnoliReflected = 0x82f63b78

// gfMul multiplies a and b modulo the polynomial, both in reflected form.
func gfMul(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ castagnoliReflected
		} else {
			b >>= 1
		}
	}
	return p
}

// xPow2k[k] is x^(2^k) modulo the polynomial (reflected).
var xPow2k = func() (t [64]uint32) {
	t[0] = 1 << 30 // x^1
	for k := 1; k < len(t); k++ {
		t[k] = gfMul(t[k-1], t[k-1])
	}
	return t
}()

// xPow8n is x^(8n) modulo the polynomial: the product of x^(2^k) over the
// set bits k of 8n.
func xPow8n(n uint64) uint32 {
	p := uint32(1) << 31 // x^0
	e := n << 3
	for k := 0; e != 0; k, e = k+1, e>>1 {
		if e&1 != 0 {
			p = gfMul(p, xPow2k[k])
		}
	}
	return p
}
