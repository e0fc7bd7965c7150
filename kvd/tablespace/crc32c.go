package tablespace

import (
	"hash/crc32"
	"math/bits"
)

// CRC-32C of a slot's value, at memory speed where the CPU allows it.
//
// hash/crc32 sums Castagnoli with the SSE 4.2 crc32 instruction, three
// streams at a time: about 9 GB/s on this project's machines, so a 1 MiB
// slot costs 110–200 µs of CPU (more when the bytes are not in cache),
// which is most of what an L3 Get adds to its read. With AVX-512 and
// VPCLMULQDQ, crcUpdate folds the buffer 256 bytes per step with
// carry-less multiplies (the method of Intel's "Fast CRC Computation for
// Generic Polynomials Using PCLMULQDQ Instruction": four 512-bit
// accumulators, each 128-bit lane moved forward by x^d mod P), reduces the
// accumulators to 16 bytes and finishes those, and the bytes the folding
// left, with hash/crc32. Elsewhere (no AVX-512, other architectures,
// purego) crcUpdate is crc32.Update.

// foldMin is the length from which crcUpdate folds: below it, the fold's
// set-up and the crc32 of its 16-byte result cost more than they save.
const foldMin = 1024

// foldKeys are the fold constants the assembly reads: for a distance of
// d bits, {lo, hi} = {x^(d+32), x^(d-32)} mod P, bit-reflected and shifted
// left by one (the reflected carry-less product is one bit short).
type foldKeys struct {
	k2048 [2]uint64 // one accumulator over the next four (256 bytes)
	k512  [2]uint64 // one accumulator into the next (64 bytes)
	lanes [8]uint64 // lanes 0, 1, 2 of the last accumulator into lane 3; lane 3 zero
}

var crcKeys = func() foldKeys {
	const poly = 0x1EDC6F41 // Castagnoli, normal form
	k := func(e int) uint64 {
		r := uint32(1)
		for range e {
			hi := r & 0x80000000
			r <<= 1
			if hi != 0 {
				r ^= poly
			}
		}
		return uint64(bits.Reverse32(r)) << 1
	}
	pair := func(d int) [2]uint64 { return [2]uint64{k(d + 32), k(d - 32)} }
	var fk foldKeys
	fk.k2048, fk.k512 = pair(2048), pair(512)
	for i, d := range []int{384, 256, 128} {
		p := pair(d)
		fk.lanes[2*i], fk.lanes[2*i+1] = p[0], p[1]
	}
	return fk
}()

// crcUpdate is crc32.Update(c, castagnoli, p).
func crcUpdate(c uint32, p []byte) uint32 {
	if !haveFold || len(p) < foldMin {
		return crc32.Update(c, castagnoli, p)
	}
	n := len(p) &^ 255
	var out [2]uint64
	fold(^c, &p[0], n, &crcKeys, &out)
	// The folded 16 bytes have the same remainder as p[:n] with the
	// register's start XORed into its first word: their CRC (register 0,
	// no final inversion) is p[:n]'s register, which the rest continues.
	var reg uint32
	for _, w := range out {
		for range 8 {
			reg = castagnoli[byte(reg)^byte(w)] ^ reg>>8
			w >>= 8
		}
	}
	return crc32.Update(^reg, castagnoli, p[n:])
}
