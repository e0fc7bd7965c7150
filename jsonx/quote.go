package jsonx

import "unicode/utf8"

const hexDigits = "0123456789abcdef"

// AppendQuoted appends s as a JSON string literal, as encoding/json writes
// it: control characters, quotes and backslashes are escaped, invalid
// UTF-8 becomes \ufffd and U+2028/U+2029 are escaped, so the output is
// valid JSON (and JavaScript) whatever s holds.
func AppendQuoted[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			dst = appendEscape(dst, c)
			i++
			start = i
			continue
		}
		r, size := decodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

func decodeRune[S ~string | ~[]byte](s S) (rune, int) {
	// The conversion of at most four bytes does not escape: no allocation.
	return utf8.DecodeRuneInString(string(s[:min(len(s), utf8.UTFMax)]))
}

// AppendQuotedRaw appends s as a JSON string literal escaping only what
// JSON requires (control characters, quotes, backslashes) and passing every
// other byte through, invalid UTF-8 included. The simulator streams single
// bytes of multi-byte characters this way (a client's decoder shows them
// as U+FFFD), keeping its one-byte tokens intact on the wire.
func AppendQuotedRaw[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	dst = AppendEscapedRaw(dst, s)
	return append(dst, '"')
}

// AppendEscapedRaw is AppendQuotedRaw without the quotes.
func AppendEscapedRaw[S ~string | ~[]byte](dst []byte, s S) []byte {
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		dst = appendEscape(dst, c)
		start = i + 1
	}
	return append(dst, s[start:]...)
}

func appendEscape(dst []byte, c byte) []byte {
	switch c {
	case '"', '\\':
		return append(dst, '\\', c)
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	return append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
}
