package jsonx

import (
	"bytes"
	"errors"
	"testing"
	"unicode/utf8"
)

// stringByteLoop is String before the block and eight-byte skips: every
// byte read on its own. It is the oracle String's skips must agree with.
func stringByteLoop(s *Scanner) (start, end int, escaped bool, err error) {
	b := s.B
	i := s.I + 1
	start = i
	for i < len(b) {
		c := b[i]
		if c >= utf8.RuneSelf {
			if s.Lenient {
				escaped = true
				i++
				continue
			}
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				s.I = i
				return 0, 0, false, s.Fail("invalid UTF-8 in string")
			}
			i += size
			continue
		}
		switch {
		case strSafe[c]:
			i++
		case c == '"':
			s.I = i + 1
			return start, i, escaped, nil
		case c == '\\':
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
	}
	s.I = i
	return 0, 0, false, s.Fail("unterminated string")
}

// stringsAgree scans the string at b[0] with String and with the oracle,
// strict and lenient, and reports the first difference.
func stringsAgree(t *testing.T, b []byte) {
	t.Helper()
	for _, lenient := range []bool{false, true} {
		got, want := Scanner{B: b, Lenient: lenient}, Scanner{B: b, Lenient: lenient}
		s1, e1, esc1, err1 := got.String()
		s2, e2, esc2, err2 := stringByteLoop(&want)
		var se1, se2 *SyntaxError
		errors.As(err1, &se1)
		errors.As(err2, &se2)
		if s1 != s2 || e1 != e2 || esc1 != esc2 || got.I != want.I || (err1 == nil) != (err2 == nil) ||
			(se1 != nil && se2 != nil && *se1 != *se2) {
			t.Fatalf("lenient %v, %q: (%d, %d, %v, I %d, %v), want (%d, %d, %v, I %d, %v)",
				lenient, b, s1, e1, esc1, got.I, err1, s2, e2, esc2, want.I, err2)
		}
		// Object and Value read a short plain string with shortString
		// instead: where it says ok it must be what String returns.
		if end, ok := shortString(b, 0); ok && (err2 != nil || s2 != 1 || e2 != end || esc2) {
			t.Fatalf("lenient %v, %q: shortString ends at %d, want (%d, %d, %v, %v)",
				lenient, b, end, s2, e2, esc2, err2)
		}
		// Their second step, for a string of up to sixteen bytes.
		if end, ok := shortString(b, 0); !ok && end == 9 {
			if end, ok := shortString(b, 8); ok && (err2 != nil || s2 != 1 || e2 != end || esc2) {
				t.Fatalf("lenient %v, %q: shortString at 8 ends at %d, want (%d, %d, %v, %v)",
					lenient, b, end, s2, e2, esc2, err2)
			}
		}
	}
}

// notPlain holds a byte of each kind the skips must stop at: control
// characters at both ends, the quote, the backslash (with a valid escape
// after it), a UTF-8 lead byte (valid with its continuation after it),
// bytes from 0x80 that are not valid alone; DEL is plain.
var notPlain = []byte{0x00, 0x1f, '"', '\\', 0xc3, 0x80, 0xff, 0x7f}

// TestStringSkipAgrees puts each byte String's skips stop at at every
// offset of a string of every length across two blocks, with and without
// room after it for a block read past the closing quote, so that the
// blocks, the eight-byte words, the bytes after them and the edges between
// them are all read.
func TestStringSkipAgrees(t *testing.T) {
	for n := 0; n <= 100; n++ {
		for _, pad := range []int{0, 1, 40} {
			body := func() []byte {
				b := append([]byte{'"'}, bytes.Repeat([]byte("ab cd-9"), n)[:n]...)
				return append(append(b, '"'), bytes.Repeat([]byte{' '}, pad)...)
			}
			stringsAgree(t, body())
			for at := 1; at <= n; at++ {
				for _, c := range notPlain {
					b := body()
					b[at] = c
					switch {
					case c == '\\' && at+1 < len(b):
						b[at+1] = 'n'
					case c == 0xc3 && at+1 < len(b):
						b[at+1] = 0xa9
					}
					if at+2 < n {
						b[n] = '\\' // a later one must not be found first
					}
					stringsAgree(t, b)
				}
			}
		}
	}
}

// plainBytewise is plainBlocks read byte by byte.
func plainBytewise(b []byte) int {
	for j, c := range b {
		if c >= utf8.RuneSelf || !strSafe[c] {
			return j
		}
	}
	return len(b)
}

// TestPlainBlocksAgrees calls plainBlocks itself, the assembly or the
// portable loop (which String never reaches where haveStrScan is false):
// only whole 32-byte blocks are read, a byte past them is not found.
func TestPlainBlocksAgrees(t *testing.T) {
	if !haveStrScan && !strScanInGo {
		t.Skip("plainBlocks is AVX2 assembly and this CPU has no AVX2")
	}
	for n := 32; n <= 130; n++ {
		b := bytes.Repeat([]byte("xy z~"), n)[:n]
		if got, want := plainBlocks(&b[0], n), n&^31; got != want {
			t.Fatalf("len %d, none: %d, want %d", n, got, want)
		}
		for at := range n {
			for _, c := range notPlain[:7] {
				b := bytes.Repeat([]byte("xy z~"), n)[:n]
				b[at] = c
				if got, want := plainBlocks(&b[0], n), plainBytewise(b[:n&^31]); got != want {
					t.Fatalf("len %d, %q at %d: %d, want %d", n, c, at, got, want)
				}
			}
		}
	}
}

func FuzzString(f *testing.F) {
	f.Add([]byte(`"plain"`))
	f.Add([]byte(`"a\"b\\c\u00e9\ud83d` + "caf\xc3\xa9 \xff\x01" + `" , "next"`))
	f.Add(append(append([]byte{'"'}, bytes.Repeat([]byte("the quick brown fox "), 5)...), '"'))
	f.Fuzz(func(t *testing.T, b []byte) {
		stringsAgree(t, append([]byte{'"'}, b...))
	})
}

// TestPlainStringAsAppendQuoted: plainString says AppendQuoted writes s
// unchanged between quotes, at every offset of lengths to 40.
func TestPlainStringAsAppendQuoted(t *testing.T) {
	for n := 0; n <= 40; n++ {
		for i := -1; i < n; i++ {
			for _, c := range []byte{'"', '\\', 0x1f, 0x7f, 0x80, 0xe2, 'z'} {
				b := bytes.Repeat([]byte{'k'}, n)
				if i >= 0 {
					b[i] = c
				}
				s := string(b)
				same := string(AppendQuoted(nil, s)) == `"`+s+`"`
				if got := plainString(s); got && !same || !got && c < 0x80 && i >= 0 && same {
					t.Fatalf("plainString(%q) = %v; AppendQuoted unchanged: %v", s, got, same)
				}
			}
		}
	}
}
