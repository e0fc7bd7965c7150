package kvcache

import (
	"encoding/binary"
	"math/bits"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// AppendBlockHashes appends to dst the chained hash of every full block of
// blockSize tokens (DESIGN §5):
//
//	h_i = xxh64(LE64(h_{i-1}) ‖ LE32(t_0) … LE32(t_{B-1})),  h_{-1} = 0
//
// A partial tail block is dropped: engines cache only full blocks, so it can
// never hit. blockSize <= 0 appends nothing. With a dst of enough capacity the
// call does not allocate.
func AppendBlockHashes(dst []uint64, tokens []uint32, blockSize int) []uint64 {
	return appendChainedHashes(dst, 0, tokens, blockSize)
}

// appendChainedHashes continues a hash chain from prev; the index uses it to
// turn an engine's BlockStored tokens into router hashes, seeded with the
// parent block's router hash.
func appendChainedHashes(dst []uint64, prev uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	if n == 0 {
		return dst
	}
	dst = slices.Grow(dst, n)
	if blockSize == 16 {
		// vLLM's and SGLang's default: no call a block (chain16).
		chain16(dst[len(dst):len(dst)+n], prev, tokens)
		return dst[:len(dst)+n]
	}
	for i := range n {
		prev = blockHash(prev, tokens[i*blockSize:(i+1)*blockSize])
		dst = append(dst, prev)
	}
	return dst
}

// The primes of XXH64.
const (
	xxPrime1 uint64 = 11400714785074694791
	xxPrime2 uint64 = 14029467366897019727
	xxPrime3 uint64 = 1609587929392839161
	xxPrime4 uint64 = 9650029242287828579
	xxPrime5 uint64 = 2870177450012600261
)

// blockHash is xxh64(LE64(prev) ‖ LE32(t_0) … LE32(t_{n-1})) with seed 0,
// computed from the words themselves rather than from a copy of them in a
// byte buffer: XXH64 reads its input as little-endian 64-bit lanes, and
// such a lane here is prev or a pair of tokens, low token first. The
// tests hold it to cespare/xxhash's Sum64 of the bytes, and to the
// algorithm's published vectors.
func blockHash(prev uint64, t []uint32) uint64 {
	size := uint64(8 + 4*len(t))
	var h uint64
	if size >= 32 {
		// The first 32-byte stripe is prev and t_0..t_5, each later one
		// 8 tokens.
		p1, p2 := xxPrime1, xxPrime2 // wrapping sums, not constants
		v1 := xxRound(p1+p2, prev)
		v2 := xxRound(xxPrime2, tokenPair(t[0], t[1]))
		v3 := xxRound(0, tokenPair(t[2], t[3]))
		v4 := xxRound(-p1, tokenPair(t[4], t[5]))
		t = t[6:]
		for len(t) >= 8 {
			v1 = xxRound(v1, tokenPair(t[0], t[1]))
			v2 = xxRound(v2, tokenPair(t[2], t[3]))
			v3 = xxRound(v3, tokenPair(t[4], t[5]))
			v4 = xxRound(v4, tokenPair(t[6], t[7]))
			t = t[8:]
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = xxMerge(h, v1)
		h = xxMerge(h, v2)
		h = xxMerge(h, v3)
		h = xxMerge(h, v4)
		h += size
	} else {
		h = xxPrime5 + size
		h ^= xxRound(0, prev)
		h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
	}
	for len(t) >= 2 {
		h ^= xxRound(0, tokenPair(t[0], t[1]))
		h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
		t = t[2:]
	}
	if len(t) == 1 {
		h ^= uint64(t[0]) * xxPrime1
		h = bits.RotateLeft64(h, 23)*xxPrime2 + xxPrime3
	}
	return xxAvalanche(h)
}

// chain16 writes out[i] = blockHash(out[i-1], the i-th 16 tokens), with
// out[-1] = prev: blockHash of 16 tokens (72 bytes: two stripes, one lane
// left) straight-line in one loop, so a block costs no call and no length
// tests. tokens holds at least 16·len(out).
func chain16(out []uint64, prev uint64, tokens []uint32) {
	tokens = tokens[:16*len(out)]
	for i := range out {
		t := (*[16]uint32)(tokens[16*i:])
		p1, p2 := xxPrime1, xxPrime2 // wrapping sums, not constants
		v1 := xxRound(xxRound(p1+p2, prev), tokenPair(t[6], t[7]))
		v2 := xxRound(xxRound(xxPrime2, tokenPair(t[0], t[1])), tokenPair(t[8], t[9]))
		v3 := xxRound(xxRound(0, tokenPair(t[2], t[3])), tokenPair(t[10], t[11]))
		v4 := xxRound(xxRound(-p1, tokenPair(t[4], t[5])), tokenPair(t[12], t[13]))
		h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = xxMerge(h, v1)
		h = xxMerge(h, v2)
		h = xxMerge(h, v3)
		h = xxMerge(h, v4)
		h += 72
		h ^= xxRound(0, tokenPair(t[14], t[15]))
		h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
		prev = xxAvalanche(h)
		out[i] = prev
	}
}

// xxAvalanche is XXH64's final mix.
func xxAvalanche(h uint64) uint64 {
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	h ^= h >> 32
	return h
}

func tokenPair(lo, hi uint32) uint64 { return uint64(lo) | uint64(hi)<<32 }

func xxRound(acc, lane uint64) uint64 {
	acc += lane * xxPrime2
	return bits.RotateLeft64(acc, 31) * xxPrime1
}

func xxMerge(acc, v uint64) uint64 {
	acc ^= xxRound(0, v)
	return acc*xxPrime1 + xxPrime4
}

// AppendByteHashes appends the chained hash of every full chunk of chunkSize
// bytes of data, h_i = xxh64(LE64(h_{i-1}) ‖ chunk_i) with h_{-1} = 0, the
// partial tail dropped. The router keys its approximate placements with it
// when it has no tokenizer: equal text prefixes give equal leading hashes,
// as equal token prefixes do for AppendBlockHashes. It does not allocate
// when dst has room.
func AppendByteHashes(dst []uint64, data []byte, chunkSize int) []uint64 {
	if chunkSize <= 0 || len(data) < chunkSize {
		return dst
	}
	n := len(data) / chunkSize
	dst = slices.Grow(dst, n)
	var prev uint64
	var d xxhash.Digest
	var seed [8]byte
	for i := range n {
		d.Reset()
		binary.LittleEndian.PutUint64(seed[:], prev)
		_, _ = d.Write(seed[:])
		_, _ = d.Write(data[i*chunkSize : (i+1)*chunkSize])
		prev = d.Sum64()
		dst = append(dst, prev)
	}
	return dst
}

// AppendChainHashes appends n hashes chained from seed, h_0 = seed,
// h_i = xxh64(LE64(h_{i-1})). A prompt the router keys by something other
// than its blocks (the images of a multimodal request) gets such a chain, as
// many hashes long as the prompt has blocks, so that prefix matching, load
// and placement accounting weigh it like a text prompt of its size.
func AppendChainHashes(dst []uint64, seed uint64, n int) []uint64 {
	if n <= 0 {
		return dst
	}
	dst = slices.Grow(dst, n)
	var b [8]byte
	h := seed
	for range n {
		dst = append(dst, h)
		binary.LittleEndian.PutUint64(b[:], h)
		h = xxhash.Sum64(b[:])
	}
	return dst
}
