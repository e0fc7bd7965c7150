package kvcache

import (
	"encoding/binary"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// hashChunkTokens is how many tokens are staged per xxhash write. Blocks up
// to this size (every engine's default) are hashed with one Sum64 call over a
// stack buffer; larger blocks stream through a stack Digest.
const hashChunkTokens = 256

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
	var buf [8 + 4*hashChunkTokens]byte
	if blockSize <= hashChunkTokens {
		size := 8 + 4*blockSize
		for i := range n {
			binary.LittleEndian.PutUint64(buf[:8], prev)
			b := buf[8:size]
			for j, t := range tokens[i*blockSize : (i+1)*blockSize] {
				binary.LittleEndian.PutUint32(b[4*j:], t)
			}
			prev = xxhash.Sum64(buf[:size])
			dst = append(dst, prev)
		}
		return dst
	}
	var d xxhash.Digest
	for i := range n {
		d.Reset()
		binary.LittleEndian.PutUint64(buf[:8], prev)
		off := 8
		for _, t := range tokens[i*blockSize : (i+1)*blockSize] {
			if off == len(buf) {
				_, _ = d.Write(buf[:off])
				off = 0
			}
			binary.LittleEndian.PutUint32(buf[off:], t)
			off += 4
		}
		_, _ = d.Write(buf[:off])
		prev = d.Sum64()
		dst = append(dst, prev)
	}
	return dst
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
