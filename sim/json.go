package sim

import (
	"github.com/infera/infera/openai"
)

// scanner walks a JSON document in one pass without reflection and without
// allocating: it validates every value it skips and hands back byte spans of
// the values the caller wants. Strings are decoded only when needed, straight
// into the caller's buffer.
type scanner struct {
	b     []byte
	i     int
	depth int
}

// strStop marks the bytes that end a plain run inside a string: the closing
// quote, a backslash, and control characters (invalid unescaped).
var strStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// maxDepth bounds nesting so a hostile body cannot exhaust the stack.
const maxDepth = 64

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte without consuming it, or 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// expect consumes c after optional white space.
func (s *scanner) expect(c byte) bool {
	if s.peek() != c {
		return false
	}
	s.i++
	return true
}

// str consumes a string and returns the span of its raw contents (without
// quotes) and whether it contains escapes.
func (s *scanner) str() (start, end int, esc bool, ok bool) {
	if s.peek() != '"' {
		return 0, 0, false, false
	}
	s.i++
	start = s.i
	for s.i < len(s.b) {
		// Skip the plain run in a tight loop; most strings have no escapes.
		for s.i < len(s.b) && !strStop[s.b[s.i]] {
			s.i++
		}
		if s.i >= len(s.b) {
			break
		}
		c := s.b[s.i]
		switch {
		case c == '"':
			end = s.i
			s.i++
			return start, end, esc, true
		case c == '\\':
			esc = true
			if s.i+1 >= len(s.b) {
				return 0, 0, false, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return 0, 0, false, false
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if hexVal(h) < 0 {
						return 0, 0, false, false
					}
				}
				s.i += 6
			default:
				return 0, 0, false, false
			}
		case c < 0x20:
			return 0, 0, false, false
		default:
			s.i++
		}
	}
	return 0, 0, false, false
}

// num consumes a number per the JSON grammar and reports whether it is an
// integer (no fraction, no exponent).
func (s *scanner) num() (start, end int, integer bool, ok bool) {
	s.ws()
	start = s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	if s.i >= len(s.b) {
		return 0, 0, false, false
	}
	switch c := s.b[s.i]; {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		for s.i < len(s.b) && isDigit(s.b[s.i]) {
			s.i++
		}
	default:
		return 0, 0, false, false
	}
	integer = true
	if s.i < len(s.b) && s.b[s.i] == '.' {
		integer = false
		s.i++
		if !s.digits() {
			return 0, 0, false, false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		integer = false
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.digits() {
			return 0, 0, false, false
		}
	}
	return start, s.i, integer, true
}

func (s *scanner) digits() bool {
	n := 0
	for s.i < len(s.b) && isDigit(s.b[s.i]) {
		s.i++
		n++
	}
	return n > 0
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// lit consumes one of the literals true, false, null.
func (s *scanner) lit(word string) bool {
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return false
	}
	s.i += len(word)
	return true
}

// skip consumes and validates any value.
func (s *scanner) skip() bool {
	switch s.peek() {
	case '{':
		return s.object(func(int, int, bool) bool { return s.skip() })
	case '[':
		return s.array(func() bool { return s.skip() })
	case '"':
		_, _, _, ok := s.str()
		return ok
	case 't':
		return s.lit("true")
	case 'f':
		return s.lit("false")
	case 'n':
		return s.lit("null")
	default:
		_, _, _, ok := s.num()
		return ok
	}
}

// object consumes an object, calling member for each key with the scanner
// positioned at the value; member must consume the value.
func (s *scanner) object(member func(kStart, kEnd int, kEsc bool) bool) bool {
	if !s.expect('{') {
		return false
	}
	if s.depth++; s.depth > maxDepth {
		return false
	}
	if s.expect('}') {
		s.depth--
		return true
	}
	for {
		ks, ke, kesc, ok := s.str()
		if !ok || !s.expect(':') || !member(ks, ke, kesc) {
			return false
		}
		if s.expect(',') {
			continue
		}
		if !s.expect('}') {
			return false
		}
		s.depth--
		return true
	}
}

// array consumes an array, calling elem with the scanner at each element.
func (s *scanner) array(elem func() bool) bool {
	if !s.expect('[') {
		return false
	}
	if s.depth++; s.depth > maxDepth {
		return false
	}
	if s.expect(']') {
		s.depth--
		return true
	}
	for {
		if !elem() {
			return false
		}
		if s.expect(',') {
			continue
		}
		if !s.expect(']') {
			return false
		}
		s.depth--
		return true
	}
}

// keyIs compares a raw key span with name. Keys with escapes are compared
// after decoding into a small stack buffer, so "\u006dodel" is "model".
func keyIs(b []byte, start, end int, esc bool, name string) bool {
	if !esc {
		return string(b[start:end]) == name
	}
	if end-start > 64 {
		return false
	}
	var buf [64]byte
	return string(openai.AppendUnescaped(buf[:0], b[start:end])) == name
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// parseInt parses a validated integer span; ok is false when it overflows
// int64.
func parseInt(b []byte) (int64, bool) {
	neg := false
	if len(b) > 0 && b[0] == '-' {
		neg = true
		b = b[1:]
	}
	var v uint64
	for _, c := range b {
		if v > (1<<63)/10 {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	if neg {
		if v > 1<<63 {
			return 0, false
		}
		return -int64(v), true
	}
	if v > 1<<63-1 {
		return 0, false
	}
	return int64(v), true
}

// appendJSONString appends s as a JSON string literal (with quotes).
func appendJSONString(dst []byte, s []byte) []byte {
	dst = append(dst, '"')
	dst = appendJSONEscaped(dst, s)
	return append(dst, '"')
}

// appendJSONEscaped appends the escaped contents of a JSON string. Invalid
// UTF-8 is passed through byte by byte so that the bytes tokenizer's
// one-byte tokens survive; clients see U+FFFD for such bytes.
func appendJSONEscaped(dst []byte, s []byte) []byte {
	const hexDigits = "0123456789abcdef"
	start := 0
	for i, c := range s {
		if c >= 0x20 && c != '"' && c != '\\' {
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
		start = i + 1
	}
	return append(dst, s[start:]...)
}
