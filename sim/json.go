package sim

import "github.com/infera/infera/jsonx"

// scanner adapts jsonx's validating scanner to the simulator's readers: it
// skips white space before every construct and reports success as a bool
// (the caller turns a false into a 400). It does not allocate on valid
// input. Strings are decoded only when needed, straight into the caller's
// buffer.
type scanner struct {
	jsonx.Scanner
}

// maxDepth bounds nesting so a hostile body cannot exhaust the stack.
const maxDepth = 64

// newScanner scans b from offset i. Invalid UTF-8 inside strings is
// accepted (and decodes to U+FFFD), as engines' Python JSON decoders do.
func newScanner(b []byte, i int) scanner {
	return scanner{jsonx.Scanner{B: b, I: i, MaxDepth: maxDepth, Lenient: true}}
}

func (s *scanner) ws() { s.SkipWS() }

// peek returns the next non-space byte without consuming it, or 0 at the end.
func (s *scanner) peek() byte {
	s.SkipWS()
	if s.I < len(s.B) {
		return s.B[s.I]
	}
	return 0
}

func (s *scanner) peekPos() int {
	s.SkipWS()
	return s.I
}

// str consumes a string and returns the span of its raw contents (without
// quotes) and whether it needs decoding (escapes, non-ASCII).
func (s *scanner) str() (start, end int, esc bool, ok bool) {
	if s.peek() != '"' {
		return 0, 0, false, false
	}
	start, end, esc, err := s.String()
	return start, end, esc, err == nil
}

// num consumes a number and reports whether it is an integer (no fraction,
// no exponent).
func (s *scanner) num() (start, end int, integer bool, ok bool) {
	start = s.peekPos()
	if s.Number() != nil {
		return 0, 0, false, false
	}
	return start, s.I, jsonx.IsInteger(s.B[start:s.I]), true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// lit consumes one of the literals true, false, null.
func (s *scanner) lit(word string) bool { return s.Literal(word) == nil }

// skip consumes and validates any value.
func (s *scanner) skip() bool {
	s.SkipWS()
	return s.Value() == nil
}

// object consumes an object, calling member for each key with the scanner
// positioned at the value; member must consume the value.
func (s *scanner) object(member func(kStart, kEnd int, kEsc bool) bool) bool {
	s.SkipWS()
	return s.Members(member)
}

// array consumes an array, calling elem with the scanner at each element.
func (s *scanner) array(elem func() bool) bool {
	s.SkipWS()
	return s.Elements(elem)
}

// keyIs compares a raw key span with name after decoding, so "\u006dodel"
// is "model".
func keyIs(b []byte, start, end int, esc bool, name string) bool {
	return jsonx.Equal(b[start:end], esc, name)
}

// appendJSONString appends s as a JSON string literal (with quotes).
// Invalid UTF-8 is passed through byte by byte so that the bytes
// tokenizer's one-byte tokens survive; clients see U+FFFD for such bytes.
func appendJSONString(dst []byte, s []byte) []byte { return jsonx.AppendQuotedRaw(dst, s) }

// appendRaw appends a raw JSON string's contents, decoding them if esc.
func appendRaw(dst, raw []byte, esc bool) []byte {
	if esc {
		return jsonx.AppendUnescaped(dst, raw)
	}
	return append(dst, raw...)
}
