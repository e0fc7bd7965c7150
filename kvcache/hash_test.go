package kvcache

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// referenceHashes is the straightforward reading of DESIGN §5, kept apart
// from the optimised implementation on purpose.
func referenceHashes(tokens []uint32, blockSize int) []uint64 {
	var out []uint64
	var prev uint64
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		var buf bytes.Buffer
		_ = binary.Write(&buf, binary.LittleEndian, prev)
		for _, t := range tokens[i : i+blockSize] {
			_ = binary.Write(&buf, binary.LittleEndian, t)
		}
		prev = xxhash.Sum64(buf.Bytes())
		out = append(out, prev)
	}
	return out
}

func seqTokens(n int, f func(i int) uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

func TestAppendBlockHashesGolden(t *testing.T) {
	// Expected values were computed once with an independent pure-Python
	// XXH64 written from the xxHash spec (checked against the published
	// vectors for "", "a", "abc"), not with this package or cespare/xxhash.
	tests := []struct {
		name      string
		tokens    []uint32
		blockSize int
		want      []uint64
	}{
		{"1..10 block 4 (tail of 2 dropped)", seqTokens(10, func(i int) uint32 { return uint32(i + 1) }), 4,
			[]uint64{0x8752c74bc787fd40, 0x1ee3cf25ba75d83e}},
		{"0..31 block 16", seqTokens(32, func(i int) uint32 { return uint32(i) }), 16,
			[]uint64{0x3563e4acbc3b0421, 0x8dbaa712d5c0ca32}},
		{"extreme ids block 2", []uint32{0xFFFFFFFF, 0, 151643, 7}, 2,
			[]uint64{0x8414eed1b903052c, 0xbfd27d5150647eae}},
		{"block 300 (streamed digest path)", seqTokens(600, func(i int) uint32 { return uint32(uint64(i) * 2654435761) }), 300,
			[]uint64{0x12419ec3331ca750, 0x9ec58d0c3db95f09}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendBlockHashes(nil, tt.tokens, tt.blockSize)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got %#x, want %#x", got, tt.want)
			}
			if ref := referenceHashes(tt.tokens, tt.blockSize); !slices.Equal(ref, tt.want) {
				t.Fatalf("reference %#x disagrees with golden %#x", ref, tt.want)
			}
		})
	}
}

func TestAppendBlockHashesMatchesReference(t *testing.T) {
	tokens := seqTokens(5000, func(i int) uint32 { return uint32(i*7919) ^ uint32(i>>3) })
	for _, bs := range []int{1, 2, 3, 16, 32, 64, 255, 256, 257, 512, 1000} {
		for _, n := range []int{0, 1, bs - 1, bs, bs + 1, 3*bs + 2, len(tokens)} {
			if n < 0 || n > len(tokens) {
				continue
			}
			got := AppendBlockHashes(nil, tokens[:n], bs)
			want := referenceHashes(tokens[:n], bs)
			if !slices.Equal(got, want) {
				t.Fatalf("block %d, %d tokens: got %d hashes %#x…, want %d", bs, n, len(got), got[:min(2, len(got))], len(want))
			}
		}
	}
}

func TestAppendBlockHashesEdges(t *testing.T) {
	if got := AppendBlockHashes(nil, []uint32{1, 2, 3}, 0); len(got) != 0 {
		t.Fatalf("block size 0: %v", got)
	}
	if got := AppendBlockHashes(nil, []uint32{1, 2, 3}, -1); len(got) != 0 {
		t.Fatalf("negative block size: %v", got)
	}
	if got := AppendBlockHashes(nil, []uint32{1, 2, 3}, 4); len(got) != 0 {
		t.Fatalf("only a partial block: %v", got)
	}
	// Appends after what dst holds.
	dst := []uint64{42}
	dst = AppendBlockHashes(dst, []uint32{1, 2, 3, 4}, 2)
	if len(dst) != 3 || dst[0] != 42 {
		t.Fatalf("append: %v", dst)
	}
	// Prefix property: the hashes of a prefix are a prefix of the hashes.
	tokens := seqTokens(64, func(i int) uint32 { return uint32(i) })
	full := AppendBlockHashes(nil, tokens, 16)
	half := AppendBlockHashes(nil, tokens[:40], 16)
	if !slices.Equal(full[:2], half) {
		t.Fatalf("prefix property broken")
	}
	// Block 16 (chain16) appends after what dst holds too.
	if got := AppendBlockHashes([]uint64{42}, tokens[:40], 16); !slices.Equal(got, []uint64{42, full[0], full[1]}) {
		t.Fatalf("block 16 append: %#x, want 42 then %#x", got, full[:2])
	}
	// A change in block 0 changes every later hash (chaining).
	tokens2 := slices.Clone(tokens)
	tokens2[0] = 999
	full2 := AppendBlockHashes(nil, tokens2, 16)
	for i := range full {
		if full[i] == full2[i] {
			t.Fatalf("block %d hash did not change with block 0", i)
		}
	}
}

func TestAppendBlockHashesZeroAlloc(t *testing.T) {
	tokens := seqTokens(8192, func(i int) uint32 { return uint32(i) })
	dst := make([]uint64, 0, 8192)
	for _, bs := range []int{16, 1024} {
		allocs := testing.AllocsPerRun(20, func() {
			dst = AppendBlockHashes(dst[:0], tokens, bs)
		})
		if allocs != 0 {
			t.Fatalf("block %d: %v allocs per run", bs, allocs)
		}
	}
}

// TestBlockHashLengths: blockHash is XXH64 of prev and the tokens' bytes at
// every length around the algorithm's 8-, 32-byte and stripe boundaries.
func TestBlockHashLengths(t *testing.T) {
	for n := range 80 {
		toks := seqTokens(n, func(i int) uint32 { return uint32(i*2654435761) ^ 0x80000001 })
		for _, prev := range []uint64{0, 5, 1<<64 - 1} {
			checkBlockHash(t, prev, toks)
		}
	}
}

func checkBlockHash(t *testing.T, prev uint64, toks []uint32) {
	t.Helper()
	b := binary.LittleEndian.AppendUint64(nil, prev)
	for _, x := range toks {
		b = binary.LittleEndian.AppendUint32(b, x)
	}
	if got, want := blockHash(prev, toks), xxhash.Sum64(b); got != want {
		t.Fatalf("%d tokens, prev %#x: got %#x, want %#x", len(toks), prev, got, want)
	}
	if len(toks) >= 16 {
		// chain16, the 16-token block's straight-line form.
		var out [1]uint64
		if chain16(out[:], prev, toks); out[0] != xxhash.Sum64(b[:8+4*16]) {
			t.Fatalf("chain16 of the first 16 of %d tokens, prev %#x: got %#x, want %#x", len(toks), prev, out[0], xxhash.Sum64(b[:8+4*16]))
		}
	}
}

func FuzzBlockHash(f *testing.F) {
	f.Add(uint64(0), []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"))
	f.Fuzz(func(t *testing.T, prev uint64, raw []byte) {
		toks := make([]uint32, len(raw)/4)
		for i := range toks {
			toks[i] = binary.LittleEndian.Uint32(raw[4*i:])
		}
		checkBlockHash(t, prev, toks)
	})
}
