package msgpackx

import (
	"bytes"
	"errors"
	"io"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Reader reads one msgpack payload at a time. D is the library decoder
// over R; Payload is the bytes being read (until Release).
type Reader struct {
	R       bytes.Reader
	D       *msgpack.Decoder
	Payload []byte
}

// NewReader returns a Reader.
func NewReader() *Reader {
	return &Reader{D: msgpack.NewDecoder(nil)}
}

// Reset starts reading payload.
func (x *Reader) Reset(payload []byte) {
	x.Payload = payload
	x.R.Reset(payload)
	x.D.Reset(&x.R)
}

// Release drops the reference to the payload.
func (x *Reader) Release() { x.Payload = nil }

// Len is the number of bytes not read yet.
func (x *Reader) Len() int { return x.R.Len() }

// Offset is the position of the next byte in Payload.
func (x *Reader) Offset() int { return len(x.Payload) - x.R.Len() }

// Advance skips n bytes the caller has consumed straight from Payload.
func (x *Reader) Advance(n int) { _, _ = x.R.Seek(int64(n), io.SeekCurrent) }

// Peek returns the next value's type code without consuming it; the end
// of the payload is io.ErrUnexpectedEOF.
func (x *Reader) Peek() (byte, error) {
	c, err := x.D.PeekCode()
	if err == io.EOF {
		return 0, io.ErrUnexpectedEOF
	}
	return c, err
}

// IsArray says whether c starts an array.
func IsArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

// IsMap says whether c starts a map.
func IsMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

// IsStr says whether c starts a str.
func IsStr(c byte) bool {
	return msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32
}

// IsBin says whether c starts a bin.
func IsBin(c byte) bool {
	return c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32
}

// IsInt says whether c starts an integer of any width or sign.
func IsInt(c byte) bool {
	if msgpcode.IsFixedNum(c) {
		return true
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64,
		msgpcode.Int8, msgpcode.Int16, msgpcode.Int32, msgpcode.Int64:
		return true
	}
	return false
}

// Raw reads a str or bin value aliased from the payload (capacity capped
// at its length); ok is false for nil. Any other type is an error.
func (x *Reader) Raw() (b []byte, ok bool, err error) {
	c, err := x.Peek()
	if err != nil {
		return nil, false, err
	}
	if c == msgpcode.Nil {
		return nil, false, x.D.DecodeNil()
	}
	if !IsStr(c) && !IsBin(c) {
		return nil, false, errors.New("want str or bin")
	}
	n, err := x.D.DecodeBytesLen()
	if err != nil {
		return nil, false, err
	}
	if n < 0 || n > x.R.Len() {
		return nil, false, io.ErrUnexpectedEOF
	}
	off := x.Offset()
	x.Advance(n)
	return x.Payload[off : off+n : off+n], true, nil
}

// ArrayLen reads an array header; nil reads as -1. A length above the
// bytes left (every element takes at least one) is io.ErrUnexpectedEOF.
func (x *Reader) ArrayLen() (int, error) {
	c, err := x.Peek()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil {
		return -1, x.D.DecodeNil()
	}
	if !IsArray(c) {
		return 0, errors.New("want array")
	}
	n, err := x.D.DecodeArrayLen()
	if err == nil && n > x.R.Len() {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// ErrTooDeep: Skip met containers nested deeper than its bound.
var ErrTooDeep = errors.New("values nested too deeply")

// Skip skips one value of any type; containers nested more than maxDepth
// deep (counting from depth) are ErrTooDeep.
func (x *Reader) Skip(depth, maxDepth int) error {
	if depth > maxDepth {
		return ErrTooDeep
	}
	c, err := x.Peek()
	if err != nil {
		return err
	}
	switch {
	case IsArray(c):
		n, err := x.ArrayLen()
		if err != nil {
			return err
		}
		for range n {
			if err := x.Skip(depth+1, maxDepth); err != nil {
				return err
			}
		}
		return nil
	case IsMap(c):
		n, err := x.D.DecodeMapLen()
		if err != nil {
			return err
		}
		if n > x.R.Len() {
			return io.ErrUnexpectedEOF
		}
		for range 2 * max(n, 0) {
			if err := x.Skip(depth+1, maxDepth); err != nil {
				return err
			}
		}
		return nil
	case IsStr(c) || IsBin(c):
		_, _, err := x.Raw()
		return err
	}
	return x.D.Skip()
}
