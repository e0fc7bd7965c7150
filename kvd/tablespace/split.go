package tablespace

import (
	"hash/crc32"
	"sync"
)

// Large slots are moved in parts: a Get of a 1 MiB slot issues its part
// reads on helper goroutines at once (the device sees them together, as
// one request split across queues) and each part's CRC-32C is computed by
// whoever read it, as soon as it landed; a Put copies and checksums its
// value's parts in parallel the same way. The part checksums are joined
// with crcCombine, so the slot format is unchanged. A part no helper is
// free for (all busy with other calls) runs on the caller, so nothing
// waits for a helper, and after Close everything runs on the caller.

const maxParts = 4

// minPart is the smallest part; slots below two of it are moved whole. A
// variable for tests.
var minPart = 128 << 10

const (
	jobRead uint8 = iota // pread buf at off, checksum buf[:sumN]
	jobCopy              // copy src into buf, checksum buf
)

type ioJob struct {
	kind uint8
	fd   int
	off  int64
	buf  []byte
	src  []byte
	sumN int
	part *ioPart
	wg   *sync.WaitGroup
}

type ioPart struct {
	crc uint32
	err error
}

func (j *ioJob) run() {
	p := j.part
	p.crc, p.err = 0, nil
	switch j.kind {
	case jobRead:
		if p.err = preadFull(j.fd, j.buf, j.off); p.err == nil {
			p.crc = crc(j.buf[:j.sumN])
		}
	case jobCopy:
		copy(j.buf, j.src)
		p.crc = crc(j.buf)
	}
}

// split is one call's part results, pooled.
type split struct {
	parts [maxParts]ioPart
	wg    sync.WaitGroup
}

// startHelpers starts the maxParts-1 part helpers; they stop with t.stop.
func (t *Tablespace) startHelpers() {
	for range maxParts - 1 {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			for {
				select {
				case j := <-t.jobs:
					j.run()
					j.wg.Done()
				case <-t.stop:
					return
				}
			}
		}()
	}
}

// dispatch hands j to an idle helper or runs it on the caller.
func (t *Tablespace) dispatch(j ioJob) {
	select {
	case t.jobs <- j:
	default:
		j.run()
		j.wg.Done()
	}
}

func (t *Tablespace) getSplit() *split {
	if sp, ok := t.splits.Get().(*split); ok {
		return sp
	}
	return new(split)
}

// partition cuts n bytes into parts of size bytes (a multiple of ioAlign,
// the last part shorter); parts < 2 means whole.
func partition(n int) (parts, size int) {
	if n < 2*minPart {
		return 1, n
	}
	parts = min(maxParts, n/minPart)
	size = alignUp((n + parts - 1) / parts)
	return (n + size - 1) / size, size
}

// readSum reads len(buf) bytes at off of fd into buf and returns the
// CRC-32C of buf[:sumN].
func (t *Tablespace) readSum(fd int, buf []byte, off int64, sumN int) (uint32, error) {
	parts, size := partition(len(buf))
	if parts < 2 {
		if err := preadFull(fd, buf, off); err != nil {
			return 0, err
		}
		return crc(buf[:sumN]), nil
	}
	sp := t.getSplit()
	defer t.splits.Put(sp)
	job := func(i int) ioJob {
		a, b := i*size, min((i+1)*size, len(buf))
		return ioJob{kind: jobRead, fd: fd, off: off + int64(a), buf: buf[a:b], sumN: min(max(sumN-a, 0), b-a),
			part: &sp.parts[i], wg: &sp.wg}
	}
	return t.runParts(sp, parts, job, func(i int) int { return min(max(sumN-i*size, 0), size) })
}

// copySum copies src into dst (len(dst) == len(src)) and returns the
// CRC-32C of it.
func (t *Tablespace) copySum(dst, src []byte) uint32 {
	parts, size := partition(len(src))
	if parts < 2 {
		copy(dst, src)
		return crc(dst)
	}
	sp := t.getSplit()
	defer t.splits.Put(sp)
	job := func(i int) ioJob {
		a, b := i*size, min((i+1)*size, len(src))
		return ioJob{kind: jobCopy, buf: dst[a:b], src: src[a:b], part: &sp.parts[i], wg: &sp.wg}
	}
	sum, _ := t.runParts(sp, parts, job, func(i int) int { return min(size, len(src)-i*size) })
	return sum
}

// runParts runs parts 1.. on helpers and part 0 on the caller, waits, and
// joins the part checksums (sumLen(i): the bytes part i checksummed). The
// error is the first part's that failed.
func (t *Tablespace) runParts(sp *split, parts int, job func(int) ioJob, sumLen func(int) int) (uint32, error) {
	sp.wg.Add(parts)
	for i := 1; i < parts; i++ {
		t.dispatch(job(i))
	}
	j0 := job(0)
	j0.run()
	sp.wg.Done()
	sp.wg.Wait()
	sum, err := sp.parts[0].crc, sp.parts[0].err
	for i := 1; i < parts; i++ {
		p := &sp.parts[i]
		if p.err != nil && err == nil {
			err = p.err
		}
		sum = crcCombine(sum, p.crc, sumLen(i))
	}
	return sum, err
}

// crcShift[i] advances a raw (unconditioned) CRC-32C register over 2^i
// zero bytes: a 32×32 matrix over GF(2), stored by columns.
var crcShift = func() *[32][32]uint32 {
	var m [32][32]uint32
	for b := range 32 {
		m[0][b] = ^crc32.Update(^uint32(1<<b), castagnoli, []byte{0})
	}
	for i := 1; i < len(m); i++ {
		for b := range 32 {
			m[i][b] = gf2Apply(&m[i-1], gf2Apply(&m[i-1], 1<<b))
		}
	}
	return &m
}()

func gf2Apply(m *[32]uint32, x uint32) uint32 {
	var y uint32
	for b := 0; x != 0; b, x = b+1, x>>1 {
		if x&1 != 0 {
			y ^= m[b]
		}
	}
	return y
}

// crcCombine returns the CRC-32C of A‖B from a = crc(A), b = crc(B) and
// n = len(B): with the register linear in its state, crc(A‖B) is crc(A)
// advanced over n zero bytes, xor crc(B).
func crcCombine(a, b uint32, n int) uint32 {
	for i := 0; n > 0; i, n = i+1, n>>1 {
		if n&1 != 0 {
			a = gf2Apply(&crcShift[i], a)
		}
	}
	return a ^ b
}
