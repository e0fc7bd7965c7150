package jsonx

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
)

// AppendUnescaped appends the decoded form of a validated JSON string's raw
// content (without its quotes) to dst, exactly as encoding/json decodes it:
// a \u escape of a surrogate that does not form a valid pair, and every
// invalid UTF-8 byte, become U+FFFD.
func AppendUnescaped(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, "\uFFFD"...)
			} else {
				dst = append(dst, raw[i:i+size]...)
			}
			i += size
			continue
		}
		if c != '\\' {
			j := plainEnd(raw, i+1)
			for j < len(raw) && raw[j] != '\\' && raw[j] < utf8.RuneSelf {
				j++
			}
			dst = append(dst, raw[i:j]...)
			i = j
			continue
		}
		switch raw[i+1] {
		case '"', '\\', '/':
			dst = append(dst, raw[i+1])
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(raw[i+2:])
			i += 6
			if r >= 0xD800 && r < 0xE000 {
				if r < 0xDC00 && i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if r2 := hex4(raw[i+2:]); r2 >= 0xDC00 && r2 < 0xE000 {
						dst = utf8.AppendRune(dst, (r-0xD800)<<10|(r2-0xDC00)+0x10000)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, r)
			continue
		}
		i += 2
	}
	return dst
}

func hex4(b []byte) rune {
	return rune(hexVal[b[0]])<<12 | rune(hexVal[b[1]])<<8 | rune(hexVal[b[2]])<<4 | rune(hexVal[b[3]])
}

// Equal reports whether a validated string's raw content decodes to s.
// It does not allocate: escaped content is decoded into a stack buffer
// (decoding never grows a string, so a raw form longer than 6*len(s)+6
// bytes cannot equal s).
func Equal(raw []byte, escaped bool, s string) bool {
	if !escaped {
		return string(raw) == s
	}
	if len(raw) > 6*len(s)+6 || len(raw) > 256 {
		return false
	}
	var buf [256]byte
	return string(AppendUnescaped(buf[:0], raw)) == s
}

// plainEnd skips the plain string content (String's sense) of b from i on,
// 32 bytes at a time where the CPU can and else eight, and returns where it
// stopped: at the first byte that is not plain or short of the last eight.
// A prompt's text is mostly plain: byte by byte, its copy was ~9
// instructions a byte of a kv-aware pick's chat rendering (issue 36,
// docs/performance.md).
func plainEnd(b []byte, i int) int {
	if haveStrScan && len(b)-i >= 32 {
		n := len(b) - i
		j := plainBlocks(&b[i], n)
		i += j
		if j != n&^31 {
			return i
		}
	}
	for i+8 <= len(b) {
		if m := nonPlain8(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	return i
}
