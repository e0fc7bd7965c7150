package chunkkey

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
)

// KeyLen is the length of a kvd key.
const KeyLen = 8

// FingerprintLen is the length of a compat_key's weight fingerprint: the
// first 16 hex characters of sha256 over the model directory's
// config.json and tokenizer.json.
const FingerprintLen = 16

// ErrLayout is returned for a parallel layout or chunk geometry that no
// engine runs.
var ErrLayout = errors.New("chunkkey: invalid layout")

// AppendIntHash appends the 8-byte form the connector gives a block hash
// that the engine's request holds as an integer: little-endian.
func AppendIntHash(dst []byte, h uint64) []byte {
	return binary.LittleEndian.AppendUint64(dst, h)
}

// Chunk returns the key of a chunk whose blocks' hashes are hashes, in
// the prompt's order: the first KeyLen bytes of sha256 over their
// concatenation.
func Chunk(hashes [][]byte) [KeyLen]byte {
	d := sha256.New()
	for _, h := range hashes {
		d.Write(h)
	}
	var sum [sha256.Size]byte
	var k [KeyLen]byte
	copy(k[:], d.Sum(sum[:0]))
	return k
}

// Group returns the key of KV-cache group gid's entry for chunk key k:
// k's first 7 bytes and gid's low byte.
func Group(k [KeyLen]byte, gid int) [KeyLen]byte {
	k[KeyLen-1] = byte(gid)
	return k
}

// BlocksPerChunk is N, the blocks in one chunk, for the connector's
// chunk_tokens and the engine's block size: chunk_tokens / block_size,
// at least 1.
func BlocksPerChunk(chunkTokens, blockSize int) (int, error) {
	if chunkTokens <= 0 || blockSize <= 0 {
		return 0, fmt.Errorf("%w: chunk_tokens %d, block_size %d: want both positive", ErrLayout, chunkTokens, blockSize)
	}
	return max(1, chunkTokens/blockSize), nil
}

// AppendKeys appends the keys a vLLM engine asks its kvd for when it holds
// the prompt's first from blocks itself and another engine holds its
// first to: every full chunk from the one that holds block from (a chunk
// the engine holds in part is still loaded whole) to the last that ends
// by block to, each as one key per group in groups (nil: group 0), chunk
// by chunk. hashes are the prompt's block hashes from its first block
// (at least to of them); n is BlocksPerChunk. Nothing is appended when no
// full chunk lies past from.
func AppendKeys(dst [][KeyLen]byte, hashes [][]byte, n, from, to int, groups []int) ([][KeyLen]byte, error) {
	if n <= 0 || from < 0 || to < from || to > len(hashes) {
		return dst, fmt.Errorf("%w: blocks per chunk %d, blocks [%d, %d) of %d", ErrLayout, n, from, to, len(hashes))
	}
	for c := from / n; (c+1)*n <= to; c++ {
		k := Chunk(hashes[c*n : (c+1)*n])
		if len(groups) == 0 {
			dst = append(dst, Group(k, 0))
			continue
		}
		for _, g := range groups {
			dst = append(dst, Group(k, g))
		}
	}
	return dst, nil
}

// Parallel is one engine process's place in its model's parallel layout,
// as the connector folds it into compat_key.
type Parallel struct {
	TPRank, TPSize int
	PPRank, PPSize int
	// MLA: the model caches one latent for all TP ranks (DeepSeek-style
	// multi-head latent attention); with TPSize > 1 every rank shares
	// rank 0's namespace.
	MLA bool
	// Fingerprint is the weight fingerprint (FingerprintLen lowercase hex
	// characters), or "" when the engine loaded its model by hub id.
	Fingerprint string
}

func (p Parallel) validate() error {
	switch {
	case p.TPSize < 1 || p.PPSize < 1:
		return fmt.Errorf("%w: tp size %d, pp size %d: want at least 1", ErrLayout, p.TPSize, p.PPSize)
	case p.TPRank < 0 || p.TPRank >= p.TPSize || p.PPRank < 0 || p.PPRank >= p.PPSize:
		return fmt.Errorf("%w: tp rank %d of %d, pp rank %d of %d", ErrLayout, p.TPRank, p.TPSize, p.PPRank, p.PPSize)
	case p.Fingerprint != "" && !isFingerprint(p.Fingerprint):
		return fmt.Errorf("%w: weight fingerprint %q: want %d lowercase hex characters", ErrLayout, p.Fingerprint, FingerprintLen)
	}
	return nil
}

func isFingerprint(s string) bool {
	if len(s) != FingerprintLen {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// CompatKey is the compat_key of p's process:
// "tp<rank>of<size>_pp<rank>of<size>", with "_w<fingerprint>" when p has
// one, the TP rank 0 for an MLA model with TPSize > 1.
func CompatKey(p Parallel) (string, error) {
	if err := p.validate(); err != nil {
		return "", err
	}
	tp := p.TPRank
	if p.MLA && p.TPSize > 1 {
		tp = 0
	}
	b := make([]byte, 0, 32+FingerprintLen)
	b = append(b, "tp"...)
	b = strconv.AppendInt(b, int64(tp), 10)
	b = append(b, "of"...)
	b = strconv.AppendInt(b, int64(p.TPSize), 10)
	b = append(b, "_pp"...)
	b = strconv.AppendInt(b, int64(p.PPRank), 10)
	b = append(b, "of"...)
	b = strconv.AppendInt(b, int64(p.PPSize), 10)
	if p.Fingerprint != "" {
		b = append(b, "_w"...)
		b = append(b, p.Fingerprint...)
	}
	return string(b), nil
}

// CompatKeys lists the distinct namespaces of every rank of a layout of
// p's sizes, MLA and fingerprint (p's ranks are ignored), PP rank major:
// the namespaces a chunk of the model is stored in, one slice of its KV
// in each.
func CompatKeys(p Parallel) ([]string, error) {
	p.TPRank, p.PPRank = 0, 0
	if err := p.validate(); err != nil {
		return nil, err
	}
	tps := p.TPSize
	if p.MLA {
		tps = 1
	}
	out := make([]string, 0, tps*p.PPSize)
	for pp := range p.PPSize {
		for tp := range tps {
			q := p
			q.TPRank, q.PPRank = tp, pp
			k, err := CompatKey(q)
			if err != nil {
				return nil, err
			}
			out = append(out, k)
		}
	}
	return out, nil
}
