package upstream

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"math/bits"
	"strings"

	"github.com/valyala/fasthttp"
)

// answerHead is what the exchange's own reading of an answer's head keeps:
// the status, the headers the router reads (Content-Type) and the body's
// framing. contentType aliases the bytes read, valid until they are
// discarded.
type answerHead struct {
	status        int
	contentType   []byte
	contentLength int  // the body's length; -1: chunked
	close         bool // Connection: close
	length        int  // bytes of the head, blank line included
}

// The only status line prefix the exchange reads itself: every engine
// answers HTTP/1.1 (an HTTP/1.0 answer's keep-alive rules are fasthttp's).
const http11Prefix = "HTTP/1.1 "

// parseHead parses the head of an answer at the start of b in its common
// form, as an engine sends it: "HTTP/1.1", a status of 200–999 other than
// 204 and 304 (an answer with a body), header lines "Name: value" ended by
// CRLF, a body framed by one Content-Length or by Transfer-Encoding:
// chunked, and at most a Connection of "close" or "keep-alive". It reports
// false for anything else, and when b ends before the head does: an
// interim answer (1xx), a bodyless status, HTTP/1.0, a bare LF, obs-fold,
// whitespace before a colon, a value with a control byte, a Content-Length
// that is not plain digits or comes twice, both Content-Length and
// Transfer-Encoding, another transfer coding, a Trailer header, another
// Connection option, a body until close. Those heads are fasthttp's to
// read (readAnswer), with the answers and errors they always had; what
// parseHead does accept, fasthttp reads the same way
// (FuzzHeadMatchesFasthttp).
func parseHead(b []byte) (answerHead, bool) {
	var h answerHead
	if len(b) < len(http11Prefix)+4 || string(b[:len(http11Prefix)]) != http11Prefix {
		return h, false
	}
	i := len(http11Prefix)
	c0, c1, c2 := b[i], b[i+1], b[i+2]
	if c0 < '2' || c0 > '9' || !isDigit(c1) || !isDigit(c2) {
		return h, false
	}
	h.status = int(c0-'0')*100 + int(c1-'0')*10 + int(c2-'0')
	if h.status == fasthttp.StatusNoContent || h.status == fasthttp.StatusNotModified {
		return h, false
	}
	i += 3
	// The rest of the status line: CRLF, or a space and a reason phrase
	// (not kept: nothing reads it) up to CRLF.
	switch b[i] {
	case '\r':
	case ' ':
		lf := bytes.IndexByte(b[i:], '\n')
		if lf < 0 {
			return h, false
		}
		i += lf - 1 // the CR before the LF, checked below
	default:
		return h, false
	}
	if i+1 >= len(b) || b[i] != '\r' || b[i+1] != '\n' {
		return h, false
	}
	i += 2
	h.contentLength = -2 // none yet
	sawLength, sawChunked := false, false
	for {
		if i >= len(b) {
			return h, false
		}
		if b[i] == '\r' {
			if i+1 >= len(b) || b[i+1] != '\n' {
				return h, false
			}
			i += 2
			break
		}
		// The names the exchange reads, matched whole with their colon
		// (then their bytes are tokens); any other name byte by byte.
		name := headerOther
		switch b[i] | 0x20 {
		case 'c':
			switch {
			case nameContentType.at(b[i:]):
				name, i = headerContentType, i+len(nameContentType.name)
			case nameContentLength.at(b[i:]):
				name, i = headerContentLength, i+len(nameContentLength.name)
			}
		case 't':
			if nameTransferEncoding.at(b[i:]) {
				name, i = headerTransferEncoding, i+len(nameTransferEncoding.name)
			}
		case 'd':
			// Not read, but every answer of fasthttp's and uvicorn's has
			// one: matched whole, its name is not scanned byte by byte.
			if nameDate.at(b[i:]) {
				name, i = headerDate, i+len(nameDate.name)
			}
		}
		if name == headerOther {
			nameStart := i
			for i < len(b) && tokenBytes[b[i]] {
				i++
			}
			if i == nameStart || i >= len(b) || b[i] != ':' {
				return h, false
			}
			name = otherName(b[nameStart:i])
			i++
		}
		for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
			i++
		}
		if name == headerContentLength {
			// Read as digits to the line's end, not found and checked
			// first: plain digits are valid value bytes.
			n, next, ok := lengthLine(b, i)
			if !ok || sawLength || sawChunked {
				return h, false
			}
			h.contentLength, sawLength, i = n, true, next
			continue
		}
		valueStart := i
		// The value ends at its first byte that cannot be in a value,
		// which must be the CR of a CRLF.
		i += valueEnd(b[i:])
		if i+2 >= len(b) || b[i] != '\r' || b[i+1] != '\n' || b[i+2] == ' ' || b[i+2] == '\t' {
			// A control byte or bare LF, not all here, or obs-fold next.
			return h, false
		}
		valueEnd := i
		for valueEnd > valueStart && (b[valueEnd-1] == ' ' || b[valueEnd-1] == '\t') {
			valueEnd--
		}
		value := b[valueStart:valueEnd]
		i += 2
		switch name {
		case headerContentType:
			h.contentType = value
		case headerTransferEncoding:
			if !equalFoldLower(value, "chunked") || sawChunked || sawLength {
				return h, false
			}
			h.contentLength, sawChunked = -1, true
		case headerConnection:
			switch {
			case equalFoldLower(value, "close"):
				h.close = true
			case equalFoldLower(value, "keep-alive"):
			default:
				return h, false
			}
		case headerTrailer:
			return h, false
		}
	}
	if !sawLength && !sawChunked {
		return h, false
	}
	h.length = i
	return h, true
}

// The header names parseHead tells apart.
const (
	headerOther = iota
	headerContentType
	headerContentLength
	headerTransferEncoding
	headerConnection
	headerTrailer
	headerDate
)

// otherName tells which of the names parseHead reads a name found byte by
// byte is (one in another case than the common one, or Connection and
// Trailer, which no engine's common answer has).
func otherName(name []byte) int {
	switch {
	case equalFoldLower(name, "content-type"):
		return headerContentType
	case equalFoldLower(name, "content-length"):
		return headerContentLength
	case equalFoldLower(name, "transfer-encoding"):
		return headerTransferEncoding
	case equalFoldLower(name, "connection"):
		return headerConnection
	case equalFoldLower(name, "trailer"):
		return headerTrailer
	}
	return headerOther
}

// wordName is a header name and its colon, "name:" in lower case, matched
// against a head eight bytes at a time: each word of the head ORed with
// 0x20 at the name's letters (which maps only a letter's two cases onto
// its lower case) and masked to the name's length equals the name's word.
type wordName struct {
	name  string
	words [3]uint64 // the name's bytes, little-endian, zero past its end
	fold  [3]uint64 // 0x20 at each letter
	keep  [3]uint64 // 0xff at each of the name's bytes
}

func newWordName(name string) wordName {
	w := wordName{name: name}
	if len(name) > 8*len(w.words) {
		// Only the package's own names (the vars below) are made into
		// wordNames, at init: a longer one is a programming error.
		panic("upstream: header name longer than a wordName holds")
	}
	for i := range len(name) {
		c, shift := uint64(name[i]), 8*uint(i%8)
		w.words[i/8] |= c << shift
		w.keep[i/8] |= 0xff << shift
		if c >= 'a' && c <= 'z' {
			w.fold[i/8] |= 0x20 << shift
		}
	}
	return w
}

// at reports whether b starts with the name and its colon, in any case.
func (w *wordName) at(b []byte) bool {
	if len(b) < 8*len(w.words) {
		// Near the end of what has arrived: byte by byte.
		return len(b) >= len(w.name) && equalFoldLower(b[:len(w.name)], w.name)
	}
	for k := range w.words {
		if w.keep[k] == 0 {
			break
		}
		if (binary.LittleEndian.Uint64(b[8*k:])|w.fold[k])&w.keep[k] != w.words[k] {
			return false
		}
	}
	return true
}

var (
	nameContentType      = newWordName("content-type:")
	nameContentLength    = newWordName("content-length:")
	nameTransferEncoding = newWordName("transfer-encoding:")
	nameDate             = newWordName("date:")
)

// lengthLine parses a Content-Length's value from b[i:], after the space
// before it, to its line's end: plain decimal digits (at most
// maxLengthDigits), optional spaces or tabs, CRLF, and a next line that
// is not obs-fold. It returns the value and where the next line starts.
func lengthLine(b []byte, i int) (n, next int, ok bool) {
	start := i
	for i < len(b) && isDigit(b[i]) {
		n = n*10 + int(b[i]-'0')
		i++
	}
	if i == start || i-start > maxLengthDigits {
		return 0, 0, false
	}
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	if i+2 >= len(b) || b[i] != '\r' || b[i+1] != '\n' || b[i+2] == ' ' || b[i+2] == '\t' {
		return 0, 0, false
	}
	return n, i + 2, true
}

// maxLengthDigits bounds a Content-Length the exchange parses itself: 18
// digits cannot overflow an int; a longer one is fasthttp's to judge.
const maxLengthDigits = 18

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// tokenBytes marks the bytes that may appear in a header name (RFC 9110
// §5.6.2 tchar).
var tokenBytes = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || isDigit(byte(c)) || strings.IndexByte("!#$%&'*+-.^_`|~", byte(c)) >= 0
	}
	return t
}()

// isValueByte reports whether c may appear in a header value (RFC 9110
// §5.5: visible, obs-text, space and tab).
func isValueByte(c byte) bool {
	return c == '\t' || c >= ' ' && c != 0x7f
}

// valueEnd returns the index of the first byte of b that may not appear
// in a header value (a CR, where a value ends well), len(b) if there is
// none; eight bytes at a time: the lowest byte of a word flagged as below
// 0x20 or equal to 0x7f is such a byte exactly (a borrow can only flag
// bytes above it), so a word is passed whole, or stops the search at its
// first such byte, or, that byte a tab, the search goes on after it.
func valueEnd(b []byte) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for i+8 <= len(b) {
		w := binary.LittleEndian.Uint64(b[i:])
		del := w ^ (0x7f * ones)
		m := ((w-0x20*ones)&^w | (del-ones)&^del) & highs
		if m == 0 {
			i += 8
			continue
		}
		i += bits.TrailingZeros64(m) / 8
		if b[i] != '\t' {
			return i
		}
		i++
	}
	for ; i < len(b); i++ {
		if !isValueByte(b[i]) {
			return i
		}
	}
	return len(b)
}

// equalFoldLower reports whether b equals lower, which is in lower case,
// ignoring the case of b's ASCII letters. b holds token bytes or value
// bytes, so folding with 0x20 maps only letters onto letters.
func equalFoldLower(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if c >= 'A' && c <= 'Z' {
			c |= 0x20
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// readHead reads an answer's head in its common form (parseHead) from br
// into resp, waiting for the answer's first bytes as fasthttp does. It
// reports false, with nothing consumed, when the head is not in its common
// form or has not all arrived with them, or announces a chunked body when
// chunked is false (a unary answer's: fasthttp reads its body and trailer
// section): fasthttp reads it then. An error
// is a failure before the first byte, named as fasthttp names it
// (fasthttp.ErrTimeout, io.EOF).
func readHead(br *bufio.Reader, resp *fasthttp.Response, chunked bool) (bool, error) {
	if b, err := br.Peek(1); len(b) == 0 {
		if t, ok := err.(interface{ Timeout() bool }); ok && t.Timeout() {
			return false, fasthttp.ErrTimeout
		}
		return false, io.EOF
	}
	b, _ := br.Peek(br.Buffered())
	h, ok := parseHead(b)
	if !ok || h.contentLength == -1 && !chunked {
		return false, nil
	}
	resp.ResetBody()
	resp.Header.Reset()
	resp.Header.SetStatusCode(h.status)
	if len(h.contentType) > 0 {
		resp.Header.SetContentTypeBytes(h.contentType)
	}
	resp.Header.SetContentLength(h.contentLength)
	if h.close {
		resp.Header.SetConnectionClose()
	}
	_, _ = br.Discard(h.length)
	return true, nil
}
