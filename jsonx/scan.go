package jsonx

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

// Sentinel errors; a *SyntaxError wraps ErrSyntax, and ErrTooDeep as well
// when the nesting bound is what failed.
var (
	ErrSyntax  = errors.New("invalid JSON")
	ErrTooDeep = errors.New("JSON nested too deeply")
)

// SyntaxError reports malformed JSON at a byte offset.
type SyntaxError struct {
	Offset  int    // byte offset of the problem
	Msg     string // what is wrong there
	TooDeep bool   // the nesting bound was exceeded
}

func (e *SyntaxError) Error() string {
	return "invalid JSON at byte " + strconv.Itoa(e.Offset) + ": " + e.Msg
}

// Unwrap makes errors.Is(err, ErrSyntax) true, and ErrTooDeep for nesting
// errors.
func (e *SyntaxError) Unwrap() []error {
	if e.TooDeep {
		return []error{ErrSyntax, ErrTooDeep}
	}
	return []error{ErrSyntax}
}

// Scanner validates JSON values in B from offset I, moving I past them. It
// follows RFC 8259 exactly as encoding/json does. Depth counts the objects
// and arrays enclosing I; a container that would make it exceed MaxDepth
// is an error (MaxDepth 0 means no bound). Invalid UTF-8 inside strings is
// an error unless Lenient is set (then it is accepted, and AppendUnescaped
// turns it into U+FFFD as encoding/json's decoder does).
type Scanner struct {
	B        []byte
	I        int
	Depth    int
	MaxDepth int
	Lenient  bool
	// Deepest is the most containers that have enclosed I at once: a walk
	// that passed under one bound says whether another would have (a
	// Walk's Finish).
	Deepest int

	// Field's walk: the object at depth fieldDepth (0: none) compares its
	// keys with fieldKey and keeps the first match's value span. In the
	// Scanner, not in Object's parameters: the loop's registers are the
	// nested objects' as well (docs/performance.md, session 26).
	fieldDepth           int
	fieldKey             string
	fieldStart, fieldEnd int
}

// Fail returns a *SyntaxError at the current offset.
func (s *Scanner) Fail(msg string) error { return &SyntaxError{Offset: s.I, Msg: msg} }

// SkipWS moves past JSON white space.
func (s *Scanner) SkipWS() { s.I = SkipSpace(s.B, s.I) }

// SkipSpace returns the offset of the first byte of b from i that is not
// JSON white space.
func SkipSpace(b []byte, i int) int {
	for i < len(b) {
		// Compact JSON has no white space: one compare settles most calls.
		if b[i] > ' ' {
			return i
		}
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// End checks that only white space follows.
func (s *Scanner) End() error {
	s.SkipWS()
	if s.I != len(s.B) {
		return s.Fail("unexpected data after the top-level value")
	}
	return nil
}

// Value validates the value at s.I (no leading white space) and moves past it.
func (s *Scanner) Value() error {
	if s.I >= len(s.B) {
		return s.Fail("unexpected end of input, expected a value")
	}
	switch c := s.B[s.I]; c {
	case '{':
		return s.Object(nil)
	case '[':
		return s.Array(nil)
	case '"':
		end, ok := shortString(s.B, s.I)
		if !ok && end == s.I+9 {
			end, ok = shortString(s.B, s.I+8) // see Object
		}
		if ok {
			s.I = end + 1
			return nil
		}
		_, _, _, err := s.String()
		return err
	case 't':
		return s.Literal("true")
	case 'f':
		return s.Literal("false")
	case 'n':
		return s.Literal("null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return s.Number()
		}
		return s.Fail("invalid character at start of value")
	}
}

// Literal consumes lit (true, false or null).
func (s *Scanner) Literal(lit string) error {
	if len(s.B)-s.I < len(lit) || string(s.B[s.I:s.I+len(lit)]) != lit {
		return s.Fail("invalid literal")
	}
	s.I += len(lit)
	return nil
}

func (s *Scanner) enter() error {
	s.Depth++
	s.Deepest = max(s.Deepest, s.Depth)
	if s.MaxDepth > 0 && s.Depth > s.MaxDepth {
		return &SyntaxError{Offset: s.I, Msg: "nested too deeply", TooDeep: true}
	}
	return nil
}

// Object validates the object at s.I. When member is not nil it is called
// for each key (the span of its raw content, and whether it has escapes)
// with s.I on the first byte of the value, which member must consume
// (with s.Value, or piece by piece); otherwise values are validated.
func (s *Scanner) Object(member func(kStart, kEnd int, kEsc bool) error) error {
	if err := s.enter(); err != nil {
		return err
	}
	// The walk keeps its offset in i and stores s.I only around what it
	// calls (String, member, Value, the errors): white space, the colon and
	// the separators between members are read from registers.
	b := s.B
	i := SkipSpace(b, s.I+1)
	if s.closes(i, '}') {
		return nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			// White space after a comma (compact JSON has none there:
			// one compare).
			if i = SkipSpace(b, i); i >= len(b) || b[i] != '"' {
				s.I = i
				return s.Fail("expected a string key")
			}
		}
		var ks, ke int
		var kesc bool
		end, ok := shortString(b, i)
		if !ok && end == i+9 {
			// Eight plain bytes and no quote after them: the next eight
			// read as the content of a string whose quote is eight bytes
			// on. Keys of up to sixteen bytes ("finish_reason",
			// "remote_block_ids") are found without String's call.
			end, ok = shortString(b, i+8)
		}
		if ok {
			ks, ke, i = i+1, end, end+1
		} else {
			s.I = i
			var err error
			if ks, ke, kesc, err = s.String(); err != nil {
				return err
			}
			i = s.I
		}
		// Compact JSON: the colon follows the key, one compare; SkipSpace
		// only where it does not.
		if i < len(b) && b[i] == ':' {
			i++
		} else {
			i = SkipSpace(b, i)
			if i >= len(b) || b[i] != ':' {
				s.I = i
				return s.Fail("expected ':' after object key")
			}
			i++
		}
		i = SkipSpace(b, i)
		s.I = i
		var err error
		if member != nil {
			if i >= len(b) {
				return s.Fail("unexpected end of input, expected a value")
			}
			err = member(ks, ke, kesc)
		} else if s.fieldDepth != s.Depth {
			err = s.Value()
		} else {
			// Field's object: the key is compared where it was read, its
			// length first (an escaped key's raw length is not its own).
			found := s.fieldStart < 0 && (kesc || ke-ks == len(s.fieldKey)) && Equal(b[ks:ke], kesc, s.fieldKey)
			if err = s.Value(); found {
				s.fieldStart, s.fieldEnd = i, s.I
			}
		}
		if err != nil {
			return err
		}
		var comma bool
		if i, comma = s.separator(); !comma {
			if s.closes(i, '}') {
				return nil
			}
			return s.sepError('}')
		}
	}
}

// Field validates the object at s.I (a *SyntaxError when there is none)
// as Object(nil) does, the same errors at the same offsets, and returns
// the span of the value of its first member named key, start -1 when it
// has none. The key is compared where it is read, without a callback (a
// closure call and an Equal a member cost the PD prefill answer's scan
// ~800 instructions; docs/performance.md, session 26).
func (s *Scanner) Field(key string) (start, end int, err error) {
	if s.I >= len(s.B) || s.B[s.I] != '{' {
		return -1, -1, s.Fail("expected an object")
	}
	s.fieldDepth, s.fieldKey, s.fieldStart, s.fieldEnd = s.Depth+1, key, -1, -1
	err = s.Object(nil)
	start, end = s.fieldStart, s.fieldEnd
	s.fieldDepth, s.fieldKey = 0, ""
	if err != nil {
		return -1, -1, err
	}
	return start, end, nil
}

// Array validates the array at s.I. When elem is not nil it is called with
// s.I on each element's first byte and must consume it; otherwise elements
// are validated.
func (s *Scanner) Array(elem func() error) error {
	if err := s.enter(); err != nil {
		return err
	}
	b := s.B // the offset in i between calls, as in Object
	i := SkipSpace(b, s.I+1)
	if s.closes(i, ']') {
		return nil
	}
	for {
		s.I = i
		var err error
		if elem != nil {
			if i >= len(b) {
				return s.Fail("unexpected end of input, expected a value")
			}
			err = elem()
		} else if j, ok := shortInteger(b, i); ok {
			// A run of integers (token ids, block ids), compact: read in
			// registers (intRun), s.I stored once.
			s.I = intRun(b, j)
		} else {
			err = s.Value()
		}
		if err != nil {
			return err
		}
		var comma bool
		if i, comma = s.separator(); !comma {
			if s.closes(i, ']') {
				return nil
			}
			return s.sepError(']')
		}
		i = SkipSpace(b, i)
	}
}

// shortInteger reads a non-negative integer without fraction or exponent
// at b[i] (Number's reading: a leading 0 ends it), ok when a byte follows
// it that is not part of a number; j is its end. Others are Number's.
func shortInteger(b []byte, i int) (j int, ok bool) {
	if i >= len(b) || b[i] < '0' || b[i] > '9' {
		return i, false
	}
	j = i + 1
	if b[i] != '0' {
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
	}
	if j >= len(b) || b[j] == '.' || b[j] == 'e' || b[j] == 'E' {
		return i, false
	}
	return j, true
}

// intRun returns the end of a compact run of integers, each after a comma,
// from j (the end of the run's first, which shortInteger read): before the
// first comma not followed by an integer shortInteger reads, or after the
// last integer. It reads the run 32 bytes at a time while they are in b
// (intRun32; a word an integer cost more than the byte loop for block ids
// of one or two digits, docs/performance.md), then one integer at a time.
func intRun(b []byte, j int) int {
	for j+32 <= len(b) && b[j] == ',' {
		m, whole := intRun32((*[32]byte)(b[j:]))
		j += m
		if !whole || m == 0 {
			break // the run ends in this block (or an integer fills it)
		}
	}
	return intRunBytewise(b, j)
}

// intRunBytewise is intRun one integer at a time: the rest of a run that
// no longer fills a block, and the reference intRun's tests hold it to.
func intRunBytewise(b []byte, j int) int {
	for j < len(b) && b[j] == ',' {
		k, ok := shortInteger(b, j+1)
		if !ok {
			break
		}
		j = k
	}
	return j
}

// intRun32 classifies p, 32 bytes from a comma that follows an integer of
// an array's compact run, as one block. Its first fault is a byte that is
// neither a digit nor a comma, a comma after a comma, or a 0 that starts
// an integer and is followed by a digit; m is the offset of the last comma
// before it (each integer before that comma is whole and one shortInteger
// reads, ended by a comma), and whole is true when p has no fault (the
// run may go on past it). After a fault the run ends in p: the caller
// reads on from m one integer at a time, as before.
func intRun32(p *[32]byte) (m int, whole bool) {
	var d, c, z uint32 // a bit a byte: digit, comma, '0'
	for k := 0; k < 32; k += 8 {
		dk, ck, zk := intClass8(binary.LittleEndian.Uint64(p[k:]))
		d |= gather8(dk) << k
		c |= gather8(ck) << k
		z |= gather8(zk) << k
	}
	fault := ^(d | c) | c<<1&(c|z&(d>>1))
	if fault != 0 {
		c &= 1<<bits.TrailingZeros32(fault) - 1
	}
	return 31 - bits.LeadingZeros32(c), fault == 0
}

// intClass8 marks (0x80 in its byte) x's digits, commas and '0's. A byte
// from 0x80 is none of them (for d, its first sum's high bit is clear from
// 0xb0 and its second's set below; | x for c and z), and the lowest of them
// gets no carry from below, so it is a fault before any wrong mark above.
func intClass8(x uint64) (d, c, z uint64) {
	d = (x + lsb*0x50) &^ (x + lsb*0x46) & msb // '0' (0x30) to '9' (0x39)
	c = ^((x ^ lsb*',') + lsb*0x7f | x) & msb
	z = ^((x ^ lsb*'0') + lsb*0x7f | x) & msb
	return d, c, z
}

// gather8 packs the marks of a (0x80 in a byte) into a byte, bit k for
// byte k: each mark's product lands on its own bit of the top byte, and no
// two products share a bit, so nothing carries.
func gather8(m uint64) uint32 { return uint32((m >> 7) * 0x0102040810204080 >> 56) }

// separator reads what follows a member or element at s.I, inline in
// Object and Array (a call of its own cost ~40 instructions a member):
// past a comma, comma is true and i is the offset after it; otherwise i is
// where closes ends the container.
func (s *Scanner) separator() (i int, comma bool) {
	i = s.I
	if i >= len(s.B) || s.B[i] <= ' ' {
		// White space (compact JSON has none): SkipSpace's loop only
		// here, out of the member's path (~2 instructions a member).
		i = SkipSpace(s.B, i)
	}
	if i < len(s.B) && s.B[i] == ',' {
		return i + 1, true
	}
	return i, false
}

// closes moves past the container's closing byte at B[i] (inline, as
// separator); false leaves s.I on what is there instead, for sepError.
func (s *Scanner) closes(i int, closing byte) bool {
	if i < len(s.B) && s.B[i] == closing {
		s.I = i + 1
		s.Depth--
		return true
	}
	s.I = i
	return false
}

// sepError is the error at s.I where a member or element must be followed
// by a comma or the closing byte and is not.
func (s *Scanner) sepError(closing byte) error {
	switch {
	case s.I >= len(s.B) && closing == '}':
		return s.Fail("unexpected end of input in object")
	case s.I >= len(s.B):
		return s.Fail("unexpected end of input in array")
	case closing == '}':
		return s.Fail("expected ',' or '}' in object")
	}
	return s.Fail("expected ',' or ']' in array")
}

// errStop ends a Members or Elements walk early; it never leaves the package.
var errStop = errors.New("stop")

// Members walks the object at s.I (false when there is none) like Object,
// calling fn with each key's raw content span; fn must consume the value
// and returns false to stop. It reports whether the walk completed.
func (s *Scanner) Members(fn func(kStart, kEnd int, kEsc bool) bool) bool {
	if s.I >= len(s.B) || s.B[s.I] != '{' {
		return false
	}
	return s.Object(func(ks, ke int, kesc bool) error {
		if !fn(ks, ke, kesc) {
			return errStop
		}
		return nil
	}) == nil
}

// Elements walks the array at s.I (false when there is none) like Array,
// calling fn on each element, which fn must consume; fn returns false to
// stop. It reports whether the walk completed.
func (s *Scanner) Elements(fn func() bool) bool {
	if s.I >= len(s.B) || s.B[s.I] != '[' {
		return false
	}
	return s.Array(func() error {
		if !fn() {
			return errStop
		}
		return nil
	}) == nil
}

// Number validates -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *Scanner) Number() error {
	b, i := s.B, s.I
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i++; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		}
	default:
		s.I = i
		return s.Fail("invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.I = i
			return s.Fail("invalid number: digit expected after '.'")
		}
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.I = i
			return s.Fail("invalid number: digit expected in exponent")
		}
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		}
	}
	s.I = i
	return nil
}

// IsInteger reports whether a validated number has no fraction or exponent.
func IsInteger(num []byte) bool {
	for _, c := range num {
		if c == '.' || c == 'e' || c == 'E' {
			return false
		}
	}
	return true
}

// ParseUint parses a validated JSON number that must be a non-negative
// integer literal fitting in int64.
func ParseUint(num []byte) (int64, bool) {
	if len(num) == 0 || num[0] == '-' {
		return 0, false
	}
	var v int64
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false // fraction or exponent
		}
		d := int64(c - '0')
		if v > (1<<63-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// ParseInt parses a validated integer literal (optionally negative); ok is
// false for a fraction, an exponent or an int64 overflow.
func ParseInt(num []byte) (int64, bool) {
	if len(num) > 0 && num[0] == '-' {
		var v uint64
		for _, c := range num[1:] {
			if c < '0' || c > '9' || v > (1<<63)/10 {
				return 0, false
			}
			v = v*10 + uint64(c-'0')
		}
		if len(num) == 1 || v > 1<<63 {
			return 0, false
		}
		return -int64(v), true
	}
	return ParseUint(num)
}

// strSafe marks ASCII bytes that may appear unescaped inside a string and
// need no further look: everything from 0x20 except '"' and '\\'.
var strSafe = func() (t [128]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// hexVal maps a byte to its hex digit value, or 0xff.
var hexVal = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = byte(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = byte(c - 'a' + 10)
		t[c-'a'+'A'] = byte(c - 'a' + 10)
	}
	return t
}()

// String validates the string at s.I (on its opening quote) and returns
// the span of its raw content (without quotes) and whether the content
// contains escape sequences (in Lenient mode, also any non-ASCII byte:
// whether AppendUnescaped may differ from the raw bytes).
func (s *Scanner) String() (start, end int, escaped bool, err error) {
	b := s.B
	i := s.I + 1
	start = i
	lenient := s.Lenient
	for i < len(b) {
		// Skip plain bytes 32 at a time where the CPU can (its stop is
		// exact), else eight at a time, stopping exactly on the first byte
		// that is not plain. (Inline: a call of its own costs ~25
		// instructions a string.)
		tail := true // whether the eight-byte loop has bytes left to skip
		if haveStrScan && len(b)-i >= 32 {
			n := len(b) - i
			j := plainBlocks(&b[i], n)
			i += j
			tail = j == n&^31
		}
		for tail && i+8 <= len(b) {
			if m := nonPlain8(binary.LittleEndian.Uint64(b[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		if c < utf8.RuneSelf {
			if strSafe[c] {
				i++
				continue
			}
			switch c {
			case '"':
				s.I = i + 1
				return start, i, escaped, nil
			case '\\':
				escaped = true
				n, bad := escapeLen(b, i)
				if bad != "" {
					s.I = i
					return 0, 0, false, s.Fail(bad)
				}
				i += n
			default:
				s.I = i
				return 0, 0, false, s.Fail("control character in string")
			}
			continue
		}
		if lenient {
			escaped = true // needs decoding: invalid UTF-8 becomes U+FFFD
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			s.I = i
			return 0, 0, false, s.Fail("invalid UTF-8 in string")
		}
		i += size
	}
	s.I = i
	return 0, 0, false, s.Fail("unterminated string")
}

// shortString reads the string at b[q] (its opening quote) when it is at
// most eight plain bytes (no escape, control character or byte from 0x80)
// and the nine bytes after the quote are in b: end is the offset of its
// closing quote, and String would return (q+1, end, false, nil). Most keys
// and many short values are such strings; ok false leaves them to String,
// whose call costs more than their bytes (the callers inline this). When
// the eight bytes are plain and no quote follows, end is q+9: a caller
// may then call it at q+8 for a string of up to sixteen bytes (one
// function reading both words does not inline).
func shortString(b []byte, q int) (end int, ok bool) {
	if len(b)-q < 10 {
		return 0, false
	}
	// No mark (eight plain bytes): TrailingZeros64 is 64, end the ninth byte.
	end = q + 1 + bits.TrailingZeros64(nonPlain8(binary.LittleEndian.Uint64(b[q+1:])))>>3
	return end, b[end] == '"'
}

// escapeLen is the length of the escape sequence at b[i] (a backslash),
// or the reason it is not one.
func escapeLen(b []byte, i int) (n int, bad string) {
	if i+1 >= len(b) {
		return 0, "unterminated escape"
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, ""
	case 'u':
		if i+6 > len(b) || hexVal[b[i+2]]|hexVal[b[i+3]]|hexVal[b[i+4]]|hexVal[b[i+5]] == 0xff {
			return 0, "invalid \\u escape"
		}
		return 6, ""
	}
	return 0, "invalid escape character"
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// nonPlain8 marks (0x80 in its byte) each of the eight bytes in x (little
// endian: b[i] is the low byte) that needs a closer look: a control
// character, '"', '\\' or a byte from 0x80. Each zero-byte test (v-lsb)&^v
// has false positives only above a real match (a borrow runs upward), so
// the lowest mark is exact: bits.TrailingZeros64(m)>>3 is the offset of the
// first such byte, and m == 0 when there is none.
func nonPlain8(x uint64) uint64 {
	q := x ^ (lsb * '"')
	e := x ^ (lsb * '\\')
	return ((x-lsb*0x20)&^x | (q-lsb)&^q | (e-lsb)&^e | x) & msb
}

// Valid reports whether b holds exactly one JSON value (with surrounding
// white space), nested at most maxDepth deep (0: unbounded).
func Valid(b []byte, maxDepth int) error {
	s := Scanner{B: b, MaxDepth: maxDepth}
	s.SkipWS()
	if err := s.Value(); err != nil {
		return err
	}
	return s.End()
}
