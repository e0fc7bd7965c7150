package kube

import (
	"unicode/utf8"
)

// pythonJSON rewrites compact JSON as Go's encoding/json writes it into the
// bytes Python's json.dumps (default arguments) writes for the same value:
// ", " and ": " separators, non-ASCII as \uXXXX (surrogate pairs above the
// BMP), and <, >, & unescaped. The reference's workers write their
// annotation with json.dumps, so a Go worker's annotation is byte for byte
// what a Python worker with the same record writes.
func pythonJSON(in []byte) []byte {
	out := make([]byte, 0, len(in)+len(in)/8)
	inStr := false
	for i := 0; i < len(in); {
		c := in[i]
		if !inStr {
			out = append(out, c)
			switch c {
			case '"':
				inStr = true
			case ',', ':':
				out = append(out, ' ')
			}
			i++
			continue
		}
		switch {
		case c == '"':
			inStr = false
			out = append(out, c)
			i++
		case c == '\\' && i+1 < len(in):
			if in[i+1] == 'u' && i+6 <= len(in) {
				switch string(in[i+2 : i+6]) {
				case "003c":
					out = append(out, '<')
				case "003e":
					out = append(out, '>')
				case "0026":
					out = append(out, '&')
				case "0008":
					out = append(out, '\\', 'b')
				case "000c":
					out = append(out, '\\', 'f')
				default:
					out = append(out, in[i:i+6]...)
				}
				i += 6
				continue
			}
			out = append(out, in[i], in[i+1])
			i += 2
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, n := utf8.DecodeRune(in[i:])
			i += n
			if r >= 0x10000 {
				r -= 0x10000
				out = appendU(out, 0xd800+(r>>10))
				out = appendU(out, 0xdc00+(r&0x3ff))
			} else {
				out = appendU(out, r)
			}
		}
	}
	return out
}

func appendU(b []byte, r rune) []byte {
	const hex = "0123456789abcdef"
	return append(b, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
}
