package chunkkey_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"testing"

	"go.uber.org/goleak"

	"github.com/infera/infera/kvd/chunkkey"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// digests are block hashes as vLLM's sha256 hashing makes them: 32 bytes,
// here sha256("block<i>").
func digests(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		s := sha256.Sum256(fmt.Appendf(nil, "block%d", i))
		out[i] = s[:]
	}
	return out
}

func hexKey(t *testing.T, s string) [chunkkey.KeyLen]byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != chunkkey.KeyLen {
		t.Fatalf("golden %q", s)
	}
	return [chunkkey.KeyLen]byte(b)
}

// The golden keys were computed apart from this package, with Python's
// hashlib the way the reference's connector computes them
// (sha256(b"".join(hashes)).digest()[:8], then [:7] + bytes([gid])).
func TestChunkGolden(t *testing.T) {
	h := digests(5)
	if got := hex.EncodeToString(h[0]); got != "3da2892d37823d9298e1d5011d7dcfaaf2d9d9a6d465e99be33af5be1d87c12b" {
		t.Fatalf("digest 0 %s", got)
	}
	for _, tc := range []struct {
		name   string
		hashes [][]byte
		gid    int
		want   string
	}{
		{"chunk 0 of 2 blocks", h[0:2], 0, "2e6a4a89b0b9f700"},
		{"chunk 0 group 1", h[0:2], 1, "2e6a4a89b0b9f701"},
		{"chunk 1 group 0", h[2:4], 0, "e552509f927b6a00"},
		{"chunk 1 group 2", h[2:4], 2, "e552509f927b6a02"},
		{"3 blocks", h[0:3], 0, "d0f42e2c0d58b600"},
		{"group id low byte", h[2:4], 0x102, "e552509f927b6a02"},
	} {
		if got := chunkkey.Group(chunkkey.Chunk(tc.hashes), tc.gid); got != hexKey(t, tc.want) {
			t.Errorf("%s: %x, want %s", tc.name, got, tc.want)
		}
	}
	if got := chunkkey.Chunk(h[2:4]); got != hexKey(t, "e552509f927b6a1e") {
		t.Errorf("chunk 1 key %x", got)
	}
}

// TestChunkIntHashes: integer block hashes enter as 8 bytes little-endian.
func TestChunkIntHashes(t *testing.T) {
	var hs [][]byte
	var flat []byte
	for _, v := range []uint64{1, 2, 0xdeadbeefcafebabe} {
		b := chunkkey.AppendIntHash(nil, v)
		if !bytes.Equal(b, binary.LittleEndian.AppendUint64(nil, v)) || b[0] != byte(v) {
			t.Fatalf("int hash %x of %#x", b, v)
		}
		hs = append(hs, b)
		flat = append(flat, b...)
	}
	got := chunkkey.Chunk(hs)
	if got != hexKey(t, "afd6a133018d4e6c") {
		t.Fatalf("int-hash chunk key %x", got)
	}
	if sum := sha256.Sum256(flat); !bytes.Equal(got[:], sum[:chunkkey.KeyLen]) {
		t.Fatalf("chunk key %x is not sha256 over the concatenation %x", got, sum[:8])
	}
}

func TestAppendKeys(t *testing.T) {
	h := digests(7)
	key := func(c, n, gid int) [chunkkey.KeyLen]byte {
		var cat []byte
		for _, b := range h[c*n : (c+1)*n] {
			cat = append(cat, b...)
		}
		sum := sha256.Sum256(cat)
		k := [chunkkey.KeyLen]byte(sum[:chunkkey.KeyLen])
		k[chunkkey.KeyLen-1] = byte(gid)
		return k
	}
	for _, tc := range []struct {
		name     string
		n, f, to int
		groups   []int
		want     [][chunkkey.KeyLen]byte
	}{
		{"all full chunks, partial tail left out", 2, 0, 7, nil, [][8]byte{key(0, 2, 0), key(1, 2, 0), key(2, 2, 0)}},
		{"a chunk held in part is loaded whole", 2, 3, 6, nil, [][8]byte{key(1, 2, 0), key(2, 2, 0)}},
		{"chunk-aligned start", 2, 4, 6, nil, [][8]byte{key(2, 2, 0)}},
		{"no full chunk past from", 2, 4, 5, nil, nil},
		{"nothing held elsewhere", 3, 0, 2, nil, nil},
		{"one key per group, chunk by chunk", 3, 0, 6, []int{0, 1, 2}, [][8]byte{
			key(0, 3, 0), key(0, 3, 1), key(0, 3, 2), key(1, 3, 0), key(1, 3, 1), key(1, 3, 2)}},
		{"one block per chunk", 1, 5, 7, nil, [][8]byte{key(5, 1, 0), key(6, 1, 0)}},
	} {
		got, err := chunkkey.AppendKeys(nil, h, tc.n, tc.f, tc.to, tc.groups)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %x %v, want %x", tc.name, got, err, tc.want)
		}
	}
	// The golden chunk 1 (blocks 2 and 3) of TestChunkGolden.
	if got, _ := chunkkey.AppendKeys(nil, h, 2, 2, 4, []int{2}); len(got) != 1 || got[0] != hexKey(t, "e552509f927b6a02") {
		t.Errorf("golden chunk 1 group 2: %x", got)
	}
	for _, bad := range [][3]int{{0, 0, 2}, {2, -1, 2}, {2, 3, 2}, {2, 0, 8}} {
		if _, err := chunkkey.AppendKeys(nil, h, bad[0], bad[1], bad[2], nil); !errors.Is(err, chunkkey.ErrLayout) {
			t.Errorf("n %d blocks [%d, %d): %v", bad[0], bad[1], bad[2], err)
		}
	}
}

func TestBlocksPerChunk(t *testing.T) {
	for _, tc := range []struct{ tokens, bs, want int }{{512, 16, 32}, {1024, 64, 16}, {100, 16, 6}, {8, 16, 1}} {
		if got, err := chunkkey.BlocksPerChunk(tc.tokens, tc.bs); err != nil || got != tc.want {
			t.Errorf("chunk_tokens %d block_size %d: %d %v, want %d", tc.tokens, tc.bs, got, err, tc.want)
		}
	}
	for _, bad := range [][2]int{{0, 16}, {512, 0}, {-1, 16}} {
		if _, err := chunkkey.BlocksPerChunk(bad[0], bad[1]); !errors.Is(err, chunkkey.ErrLayout) {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

// The compat keys match the reference connector's, including its tests'
// cases (rank 0 of TP 2; MLA collapsing TP ranks, not for TP 1).
func TestCompatKey(t *testing.T) {
	const fp = "0123456789abcdef"
	for _, tc := range []struct {
		p    chunkkey.Parallel
		want string
	}{
		{chunkkey.Parallel{TPRank: 0, TPSize: 2, PPSize: 1}, "tp0of2_pp0of1"},
		{chunkkey.Parallel{TPRank: 3, TPSize: 8, PPRank: 1, PPSize: 2}, "tp3of8_pp1of2"},
		{chunkkey.Parallel{TPRank: 3, TPSize: 8, PPSize: 1, MLA: true}, "tp0of8_pp0of1"},
		{chunkkey.Parallel{TPSize: 1, PPSize: 1, MLA: true}, "tp0of1_pp0of1"},
		{chunkkey.Parallel{TPRank: 1, TPSize: 4, PPSize: 1, Fingerprint: fp}, "tp1of4_pp0of1_w" + fp},
	} {
		if got, err := chunkkey.CompatKey(tc.p); err != nil || got != tc.want {
			t.Errorf("%+v: %q %v, want %q", tc.p, got, err, tc.want)
		}
	}
	for _, bad := range []chunkkey.Parallel{
		{TPSize: 0, PPSize: 1}, {TPSize: 1, PPSize: 0}, {TPRank: 2, TPSize: 2, PPSize: 1},
		{TPSize: 1, PPRank: -1, PPSize: 1}, {TPSize: 1, PPSize: 1, Fingerprint: "0123456789ABCDEF"},
		{TPSize: 1, PPSize: 1, Fingerprint: "abc"}, {TPSize: 1, PPSize: 1, Fingerprint: "0123456789abcdeg"},
	} {
		if k, err := chunkkey.CompatKey(bad); !errors.Is(err, chunkkey.ErrLayout) {
			t.Errorf("%+v: %q %v", bad, k, err)
		}
	}
}

func TestCompatKeys(t *testing.T) {
	for _, tc := range []struct {
		p    chunkkey.Parallel
		want []string
	}{
		{chunkkey.Parallel{TPSize: 1, PPSize: 1}, []string{"tp0of1_pp0of1"}},
		{chunkkey.Parallel{TPRank: 1, TPSize: 2, PPSize: 2}, []string{"tp0of2_pp0of2", "tp1of2_pp0of2", "tp0of2_pp1of2", "tp1of2_pp1of2"}},
		{chunkkey.Parallel{TPSize: 8, PPSize: 1, MLA: true}, []string{"tp0of8_pp0of1"}},
		{chunkkey.Parallel{TPSize: 2, PPSize: 1, Fingerprint: "ffffffffffffffff"}, []string{"tp0of2_pp0of1_wffffffffffffffff", "tp1of2_pp0of1_wffffffffffffffff"}},
	} {
		if got, err := chunkkey.CompatKeys(tc.p); err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%+v: %q %v, want %q", tc.p, got, err, tc.want)
		}
	}
	if _, err := chunkkey.CompatKeys(chunkkey.Parallel{TPSize: 0, PPSize: 1}); !errors.Is(err, chunkkey.ErrLayout) {
		t.Errorf("tp size 0: %v", err)
	}
}
