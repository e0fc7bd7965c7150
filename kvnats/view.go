package kvnats

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/infera/infera/msgpackx"
)

// ErrBadView reports a bucket value that is no msgpack array of hashes.
var ErrBadView = errors.New("kvnats: bad view")

// maxViewHashes bounds a decoded view (the reference writes a whole rank's
// cache: millions of blocks at most).
const maxViewHashes = 1 << 24

// AppendView appends the bucket value of hashes: a msgpack array of the
// hashes sorted ascending, each in its shortest unsigned form (as msgspec
// writes Python ints). hashes is sorted in place.
func AppendView(dst []byte, hashes []uint64) []byte {
	slices.Sort(hashes)
	n := len(hashes)
	switch {
	case n < 16:
		dst = append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		dst = append(dst, 0xdc)
		dst = binary.BigEndian.AppendUint16(dst, uint16(n))
	default:
		dst = append(dst, 0xdd)
		dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	}
	for _, h := range hashes {
		switch {
		case h < 128:
			dst = append(dst, byte(h))
		case h <= math.MaxUint8:
			dst = append(dst, 0xcc, byte(h))
		case h <= math.MaxUint16:
			dst = append(dst, 0xcd)
			dst = binary.BigEndian.AppendUint16(dst, uint16(h))
		case h <= math.MaxUint32:
			dst = append(dst, 0xce)
			dst = binary.BigEndian.AppendUint32(dst, uint32(h))
		default:
			dst = append(dst, 0xcf)
			dst = binary.BigEndian.AppendUint64(dst, h)
		}
	}
	return dst
}

// ParseView decodes a bucket value into dst: a msgpack array of integers
// (negative ones kept as two's complement, as the index keeps signed
// engine hashes).
func ParseView(dst []uint64, val []byte) ([]uint64, error) {
	r := msgpackx.NewReader()
	r.Reset(val)
	defer r.Release()
	n, err := r.ArrayLen()
	if err != nil {
		return dst, fmt.Errorf("%w: %w", ErrBadView, err)
	}
	if n < 0 || n > maxViewHashes || n > r.Len() {
		return dst, fmt.Errorf("%w: %d hashes in %d bytes", ErrBadView, n, len(val))
	}
	for range n {
		c, err := r.Peek()
		if err != nil {
			return dst, fmt.Errorf("%w: %w", ErrBadView, err)
		}
		if !msgpackx.IsInt(c) {
			return dst, fmt.Errorf("%w: element type 0x%02x is no integer", ErrBadView, c)
		}
		var v uint64
		if c == 0xcf {
			v, err = r.D.DecodeUint64()
		} else {
			var s int64
			s, err = r.D.DecodeInt64()
			v = uint64(s)
		}
		if err != nil {
			return dst, fmt.Errorf("%w: %w", ErrBadView, err)
		}
		dst = append(dst, v)
	}
	if r.Len() != 0 {
		return dst, fmt.Errorf("%w: %d bytes after the array", ErrBadView, r.Len())
	}
	return dst, nil
}
