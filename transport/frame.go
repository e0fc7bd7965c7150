package transport

import (
	"encoding/binary"
	"fmt"
)

// The TCP wire format. Every request is a fixed header, the region name and,
// for a write, Len payload bytes; every request gets one response: a fixed
// header and, for a successful read, Len payload bytes. Integers are
// little-endian. Both headers are validated before anything is read or
// written past them.
//
//	request  (32 B): magic "IFT1" | op u8 | flags u8 (0) | name_len u16 | seq u32 | reserved u32 (0) | offset u64 | length u64 | name
//	response (24 B): magic "IFR1" | status u8 | 3 B zero | seq u32 | reserved u32 (0) | length u64
const (
	reqHeaderLen  = 32
	respHeaderLen = 24
	reqMagic      = "IFT1"
	respMagic     = "IFR1"

	// MaxNameLen bounds a region name.
	MaxNameLen = 1024
	// MaxOpLen bounds one op's length (1 TiB).
	MaxOpLen = 1 << 40
)

// Response status codes.
const (
	statusOK uint8 = iota
	statusNotFound
	statusOutOfRange
	statusInvalid
	statusClosed
	statusMax = statusClosed
)

// reqHeader is a decoded request header.
type reqHeader struct {
	op      Kind
	nameLen uint16
	seq     uint32
	off     uint64
	n       uint64
}

// respHeader is a decoded response header.
type respHeader struct {
	status uint8
	seq    uint32
	n      uint64
}

func putReqHeader(b []byte, h *reqHeader) {
	_ = b[reqHeaderLen-1]
	copy(b[0:4], reqMagic)
	b[4] = byte(h.op)
	b[5] = 0
	binary.LittleEndian.PutUint16(b[6:8], h.nameLen)
	binary.LittleEndian.PutUint32(b[8:12], h.seq)
	binary.LittleEndian.PutUint32(b[12:16], 0)
	binary.LittleEndian.PutUint64(b[16:24], h.off)
	binary.LittleEndian.PutUint64(b[24:32], h.n)
}

// errFrame is the one error value decoders return, so a bad frame costs no
// allocation; callers add context.
var errFrame = fmt.Errorf("bad frame: %w", ErrProtocol)

func decodeReqHeader(b []byte, h *reqHeader) error {
	if len(b) < reqHeaderLen || string(b[0:4]) != reqMagic {
		return errFrame
	}
	h.op = Kind(b[4])
	h.nameLen = binary.LittleEndian.Uint16(b[6:8])
	h.seq = binary.LittleEndian.Uint32(b[8:12])
	h.off = binary.LittleEndian.Uint64(b[16:24])
	h.n = binary.LittleEndian.Uint64(b[24:32])
	switch {
	case h.op != Read && h.op != Write,
		b[5] != 0,
		binary.LittleEndian.Uint32(b[12:16]) != 0,
		h.nameLen == 0 || h.nameLen > MaxNameLen,
		h.n == 0 || h.n > MaxOpLen,
		h.off > MaxOpLen:
		return errFrame
	}
	return nil
}

func putRespHeader(b []byte, h *respHeader) {
	_ = b[respHeaderLen-1]
	copy(b[0:4], respMagic)
	b[4] = h.status
	b[5], b[6], b[7] = 0, 0, 0
	binary.LittleEndian.PutUint32(b[8:12], h.seq)
	binary.LittleEndian.PutUint32(b[12:16], 0)
	binary.LittleEndian.PutUint64(b[16:24], h.n)
}

func decodeRespHeader(b []byte, h *respHeader) error {
	if len(b) < respHeaderLen || string(b[0:4]) != respMagic {
		return errFrame
	}
	h.status = b[4]
	h.seq = binary.LittleEndian.Uint32(b[8:12])
	h.n = binary.LittleEndian.Uint64(b[16:24])
	switch {
	case h.status > statusMax,
		b[5] != 0 || b[6] != 0 || b[7] != 0,
		binary.LittleEndian.Uint32(b[12:16]) != 0,
		h.n > MaxOpLen,
		h.status != statusOK && h.n != 0:
		return errFrame
	}
	return nil
}

// statusErr maps a response status to its sentinel.
func statusErr(s uint8) error {
	switch s {
	case statusOK:
		return nil
	case statusNotFound:
		return ErrNotFound
	case statusOutOfRange:
		return ErrOutOfRange
	case statusInvalid:
		return ErrInvalid
	}
	return ErrClosed
}
