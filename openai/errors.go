package openai

import "unicode/utf8"

// Error types used in the envelope's "type" field, as OpenAI names them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeNotFound       = "not_found_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable_error"
)

// AppendError appends the OpenAI error envelope
// {"error":{"message":…,"type":…,"code":…}} to dst. An empty code is
// written as null, as OpenAI does for errors without a code.
func AppendError(dst []byte, message, errType, code string) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = AppendQuoted(dst, message)
	dst = append(dst, `,"type":`...)
	dst = AppendQuoted(dst, errType)
	dst = append(dst, `,"code":`...)
	if code == "" {
		dst = append(dst, "null"...)
	} else {
		dst = AppendQuoted(dst, code)
	}
	return append(dst, "}}"...)
}

const hexDigits = "0123456789abcdef"

// AppendQuoted appends s as a JSON string literal. Control characters,
// quotes and backslashes are escaped; invalid UTF-8 becomes U+FFFD and
// U+2028/U+2029 are escaped, as encoding/json does, so the output is valid
// JSON (and JavaScript) whatever s holds.
func AppendQuoted(dst []byte, s string) []byte {
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
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
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
