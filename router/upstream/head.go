package upstream

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
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
		nameStart := i
		for i < len(b) && tokenBytes[b[i]] {
			i++
		}
		if i == nameStart || i >= len(b) || b[i] != ':' {
			return h, false
		}
		name := b[nameStart:i]
		i++
		for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
			i++
		}
		valueStart := i
		cr := bytes.IndexByte(b[i:], '\r')
		if cr < 0 {
			return h, false
		}
		i += cr
		if !validValue(b[valueStart:i]) || i+2 >= len(b) || b[i+1] != '\n' || b[i+2] == ' ' || b[i+2] == '\t' {
			// A control byte or bare LF, not all here, or obs-fold next.
			return h, false
		}
		valueEnd := i
		for valueEnd > valueStart && (b[valueEnd-1] == ' ' || b[valueEnd-1] == '\t') {
			valueEnd--
		}
		value := b[valueStart:valueEnd]
		i += 2
		switch {
		case equalFoldLower(name, "content-type"):
			h.contentType = value
		case equalFoldLower(name, "content-length"):
			n, ok := parseLength(value)
			if !ok || sawLength || sawChunked {
				return h, false
			}
			h.contentLength, sawLength = n, true
		case equalFoldLower(name, "transfer-encoding"):
			if !equalFoldLower(value, "chunked") || sawChunked || sawLength {
				return h, false
			}
			h.contentLength, sawChunked = -1, true
		case equalFoldLower(name, "connection"):
			switch {
			case equalFoldLower(value, "close"):
				h.close = true
			case equalFoldLower(value, "keep-alive"):
			default:
				return h, false
			}
		case equalFoldLower(name, "trailer"):
			return h, false
		}
	}
	if !sawLength && !sawChunked {
		return h, false
	}
	h.length = i
	return h, true
}

// maxLengthDigits bounds a Content-Length the exchange parses itself: 18
// digits cannot overflow an int; a longer one is fasthttp's to judge.
const maxLengthDigits = 18

// parseLength parses a Content-Length of plain decimal digits.
func parseLength(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > maxLengthDigits {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

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

// validValue reports whether every byte of v may appear in a header
// value, eight at a time: a word with no byte below 0x20 and none equal
// to 0x7f (exact tests on the word's bytes) is valid whole; only a word
// that has one (a tab, or a byte that is not valid) is looked at byte by
// byte.
func validValue(v []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for len(v) >= 8 {
		w := binary.LittleEndian.Uint64(v)
		del := w ^ (0x7f * ones)
		if (w-0x20*ones)&^w&highs != 0 || (del-ones)&^del&highs != 0 {
			for _, c := range v[:8] {
				if !isValueByte(c) {
					return false
				}
			}
		}
		v = v[8:]
	}
	for _, c := range v {
		if !isValueByte(c) {
			return false
		}
	}
	return true
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
