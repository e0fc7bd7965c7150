package peer

import (
	"encoding/binary"
	"errors"

	"github.com/infera/infera/transport"
)

// ErrProtocol: a malformed or oversized frame.
var ErrProtocol = errors.New("peer: protocol error")

// ErrDenied: the source refused the request (wrong secret).
var ErrDenied = errors.New("peer: denied")

// Limits of a locate exchange.
const (
	MaxKeys      = 4096
	MaxKeyBytes  = 1024
	MaxNameBytes = 1024
	// MaxFrame bounds one frame either way.
	MaxFrame = 8 << 20
)

var (
	reqMagic  = [4]byte{'I', 'K', 'P', 'L'}
	respMagic = [4]byte{'I', 'K', 'P', 'R'}
)

const wireVersion = 1

// Response statuses.
const (
	statusOK     = 0
	statusDenied = 1
	statusBad    = 2
)

// Request is a locate request.
type Request struct {
	Secret        []byte
	Model, Compat []byte
	Keys          [][]byte
}

// Entry is where one key's value lies in the source's arena.
type Entry struct {
	Found   bool
	Offset  uint64 // payload offset (the header is the 16 bytes before it)
	Length  uint32
	Version uint32
}

// Response is a locate response.
type Response struct {
	Status  uint8
	Region  transport.Desc
	Entries []Entry
}

// AppendRequest appends r as one frame: [u32 length][body].
func AppendRequest(dst []byte, r *Request) ([]byte, error) {
	if len(r.Keys) > MaxKeys || len(r.Secret) > MaxNameBytes || len(r.Model) > MaxNameBytes || len(r.Compat) > MaxNameBytes {
		return dst, ErrProtocol
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = append(dst, reqMagic[:]...)
	dst = append(dst, wireVersion)
	dst = appendBytes16(dst, r.Secret)
	dst = appendBytes16(dst, r.Model)
	dst = appendBytes16(dst, r.Compat)
	return appendKeysFrame(dst, start, r.Keys)
}

// appendKeysFrame ends a frame begun at start (its length still to write)
// with keys, counted then each length-prefixed, and writes its length.
func appendKeysFrame(dst []byte, start int, keys [][]byte) ([]byte, error) {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(keys)))
	for _, k := range keys {
		if len(k) == 0 || len(k) > MaxKeyBytes {
			return dst[:start], ErrProtocol
		}
		dst = appendBytes16(dst, k)
	}
	if len(dst)-start-4 > MaxFrame {
		return dst[:start], ErrProtocol
	}
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst, nil
}

// ParseRequest reads a request body (the frame without its length). The
// byte slices of r alias body.
func ParseRequest(body []byte, r *Request) error {
	d := decoder{b: body}
	if m := d.take(4); m == nil || [4]byte(m) != reqMagic || d.u8() != wireVersion {
		return ErrProtocol
	}
	r.Secret, r.Model, r.Compat = d.bytes16(MaxNameBytes), d.bytes16(MaxNameBytes), d.bytes16(MaxNameBytes)
	n := d.u32()
	if d.bad || n > MaxKeys {
		return ErrProtocol
	}
	var err error
	r.Keys, err = d.keys(r.Keys[:0], n)
	return err
}

// keys reads n non-empty keys, the end of the body (appended to dst).
func (d *decoder) keys(dst [][]byte, n uint32) ([][]byte, error) {
	for range n {
		k := d.bytes16(MaxKeyBytes)
		if d.bad || len(k) == 0 {
			return dst, ErrProtocol
		}
		dst = append(dst, k)
	}
	if d.bad || len(d.b) != 0 {
		return dst, ErrProtocol
	}
	return dst, nil
}

// AppendResponse appends r as one frame.
func AppendResponse(dst []byte, r *Response) ([]byte, error) {
	if len(r.Entries) > MaxKeys || len(r.Region.Peer) > MaxNameBytes || len(r.Region.Name) > MaxNameBytes {
		return dst, ErrProtocol
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = append(dst, respMagic[:]...)
	dst = append(dst, wireVersion, r.Status)
	dst = appendBytes16(dst, []byte(r.Region.Peer))
	dst = appendBytes16(dst, []byte(r.Region.Name))
	dst = binary.LittleEndian.AppendUint64(dst, r.Region.Addr)
	dst = binary.LittleEndian.AppendUint64(dst, r.Region.Len)
	dst = binary.LittleEndian.AppendUint32(dst, r.Region.ID)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(r.Region.Device))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(r.Entries)))
	for _, e := range r.Entries {
		found := byte(0)
		if e.Found {
			found = 1
		}
		dst = append(dst, found)
		dst = binary.LittleEndian.AppendUint64(dst, e.Offset)
		dst = binary.LittleEndian.AppendUint32(dst, e.Length)
		dst = binary.LittleEndian.AppendUint32(dst, e.Version)
	}
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst, nil
}

// ParseResponse reads a response body; entries beyond the region or not
// after a header are refused, so a source cannot steer reads outside its
// arena.
func ParseResponse(body []byte, r *Response) error {
	d := decoder{b: body}
	if m := d.take(4); m == nil || [4]byte(m) != respMagic || d.u8() != wireVersion {
		return ErrProtocol
	}
	r.Status = d.u8()
	r.Region.Peer = string(d.bytes16(MaxNameBytes))
	r.Region.Name = string(d.bytes16(MaxNameBytes))
	r.Region.Addr, r.Region.Len = d.u64(), d.u64()
	r.Region.ID, r.Region.Device = d.u32(), int32(d.u32())
	n := d.u32()
	if d.bad || n > MaxKeys {
		return ErrProtocol
	}
	r.Entries = r.Entries[:0]
	for range n {
		e := Entry{Found: d.u8() == 1, Offset: d.u64(), Length: d.u32(), Version: d.u32()}
		if d.bad {
			return ErrProtocol
		}
		if e.Found && (e.Offset < headerBytes || e.Offset+uint64(e.Length) > r.Region.Len || e.Version%2 != 0) {
			return ErrProtocol
		}
		r.Entries = append(r.Entries, e)
	}
	if d.bad || len(d.b) != 0 {
		return ErrProtocol
	}
	return nil
}

func appendBytes16(dst, b []byte) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(b)))
	return append(dst, b...)
}

// decoder reads little-endian fields; any short read sets bad.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) take(n int) []byte {
	if d.bad || n > len(d.b) {
		d.bad = true
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) bytes16(limit int) []byte {
	b := d.take(2)
	if b == nil {
		return nil
	}
	n := int(binary.LittleEndian.Uint16(b))
	if n > limit {
		d.bad = true
		return nil
	}
	return d.take(n)
}
