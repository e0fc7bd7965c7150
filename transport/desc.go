package transport

import (
	"bytes"
	"fmt"
	"strconv"
)

// A Desc travels between hosts as text (the PD hand-off carries it in
// kv_transfer_params): "ifx1|peer|name|addr|len|id|device", decimal
// numbers, peer and name printable ASCII without '|'.
const (
	descPrefix = "ifx1|"
	// MaxPeerLen bounds Desc.Peer.
	MaxPeerLen = 255
)

// checkText reports whether s is 1..max bytes of printable ASCII without
// the field separator.
func checkText(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '|' {
			return false
		}
	}
	return true
}

// AppendText appends d's text form to b.
func (d Desc) AppendText(b []byte) ([]byte, error) {
	if !checkText(d.Peer, MaxPeerLen) || !checkText(d.Name, MaxNameLen) || d.Len > MaxOpLen || d.Device < -1 {
		return b, fmt.Errorf("encode desc: %w", ErrInvalid)
	}
	b = append(b, descPrefix...)
	b = append(b, d.Peer...)
	b = append(b, '|')
	b = append(b, d.Name...)
	b = append(b, '|')
	b = strconv.AppendUint(b, d.Addr, 10)
	b = append(b, '|')
	b = strconv.AppendUint(b, d.Len, 10)
	b = append(b, '|')
	b = strconv.AppendUint(b, uint64(d.ID), 10)
	b = append(b, '|')
	b = strconv.AppendInt(b, int64(d.Device), 10)
	return b, nil
}

// MarshalText encodes d (so JSON carries a Desc as one string).
func (d Desc) MarshalText() ([]byte, error) { return d.AppendText(nil) }

// UnmarshalText decodes and validates a Desc from a peer.
func (d *Desc) UnmarshalText(b []byte) error {
	if !bytes.HasPrefix(b, []byte(descPrefix)) {
		return fmt.Errorf("decode desc: prefix: %w", ErrInvalid)
	}
	var f [6][]byte
	rest := b[len(descPrefix):]
	for i := range f {
		j := bytes.IndexByte(rest, '|')
		if i == len(f)-1 {
			if j >= 0 {
				return fmt.Errorf("decode desc: too many fields: %w", ErrInvalid)
			}
			f[i] = rest
			break
		}
		if j < 0 {
			return fmt.Errorf("decode desc: too few fields: %w", ErrInvalid)
		}
		f[i], rest = rest[:j], rest[j+1:]
	}
	var out Desc
	out.Peer, out.Name = string(f[0]), string(f[1])
	if !checkText(out.Peer, MaxPeerLen) || !checkText(out.Name, MaxNameLen) {
		return fmt.Errorf("decode desc: peer or name: %w", ErrInvalid)
	}
	var err error
	if out.Addr, err = strconv.ParseUint(string(f[2]), 10, 64); err != nil {
		return fmt.Errorf("decode desc: addr: %w", ErrInvalid)
	}
	if out.Len, err = strconv.ParseUint(string(f[3]), 10, 64); err != nil || out.Len > MaxOpLen {
		return fmt.Errorf("decode desc: len: %w", ErrInvalid)
	}
	id, err := strconv.ParseUint(string(f[4]), 10, 32)
	if err != nil {
		return fmt.Errorf("decode desc: id: %w", ErrInvalid)
	}
	dev, err := strconv.ParseInt(string(f[5]), 10, 32)
	if err != nil || dev < -1 {
		return fmt.Errorf("decode desc: device: %w", ErrInvalid)
	}
	out.ID, out.Device = uint32(id), int32(dev)
	*d = out
	return nil
}
