package upstream

import (
	"bufio"
	"errors"
	"io"

	"github.com/valyala/fasthttp"
)

// ErrBrokenChunk is the error of a streamed answer whose chunked framing
// (RFC 9112 §7.1) is malformed or ends inside a chunk's size line, the
// CRLF after its data or its trailer section. A body cut inside a chunk's
// data is io.ErrUnexpectedEOF instead, as fasthttp's own reader says.
var ErrBrokenChunk = errors.New("upstream: broken chunked body")

// The framing errors, made once: a failure costs no allocation either.
var (
	errChunkSizeEmpty    = brokenChunk("chunk size has no hex digit")
	errChunkSizeTooLarge = brokenChunk("chunk size has too many hex digits")
	errChunkSizeEnd      = brokenChunk("chunk size line ends without crlf")
	errChunkSizeChar     = brokenChunk("invalid character after chunk size")
	errChunkSizeLF       = brokenChunk("bare lf after chunk size")
	errChunkDataCRLF     = brokenChunk("no crlf after chunk data")
	errChunkTrailerEnd   = brokenChunk("trailer section cut short")
)

type chunkError struct{ what string }

func (e *chunkError) Error() string { return "upstream: broken chunked body: " + e.what }
func (e *chunkError) Unwrap() error { return ErrBrokenChunk }

func brokenChunk(what string) error { return &chunkError{what} }

// maxChunkSizeDigits is fasthttp's bound on a chunk size's hex digits,
// leading zeros included (maxHexIntChars on 64-bit): the same bytes get the
// same answer from both readers.
const maxChunkSizeDigits = 15

// chunkedBody decodes a streamed answer's chunked transfer coding
// (RFC 9112 §7.1: hex size, optional extensions, CRLF, data, CRLF; a last
// chunk of size 0, then the trailer section) straight from the
// connection's reader, in place of fasthttp's body stream: no pooled
// stream object, and one Read returns as many chunks as have already
// arrived. It accepts and rejects what fasthttp's reader does: sizes of
// at most 15 hex digits, whitespace only before the end of the line and
// never before an extension, no bare LF; the trailer section is read by
// fasthttp's own trailer parser into the answer's header.
//
// It differs in one respect on purpose: a read that fails inside the
// framing (a deadline, a closed connection) returns that error as it is,
// where fasthttp wraps it in its ErrBrokenChunk and hides the timeout from
// errors.Is. The end of the bytes there is still ErrBrokenChunk.
//
// An Exchange owns one and reuses it; it runs on the exchange's goroutine.
type chunkedBody struct {
	br      *bufio.Reader
	trailer *fasthttp.ResponseHeader
	left    int   // data bytes left in the current chunk
	last    bool  // the last chunk's size line is read: the trailer is next
	done    bool  // the trailer is read: the body is over
	err     error // the failure that ended the body, returned again
}

// reset readies c for the body of the answer whose header is h, read from
// br.
func (c *chunkedBody) reset(br *bufio.Reader, h *fasthttp.ResponseHeader) {
	*c = chunkedBody{br: br, trailer: h}
}

// Read returns the body's data, io.EOF once its trailer section is read.
// It waits for the body's next bytes; past them, it stops where what has
// arrived ends rather than wait for more with data in hand (save for the
// CRLF after a chunk's data, which it reads at once, as fasthttp does).
func (c *chunkedBody) Read(p []byte) (int, error) {
	if c.done {
		return 0, io.EOF
	}
	if c.err != nil {
		return 0, c.err
	}
	n := 0
	for n < len(p) {
		if c.last {
			if n > 0 {
				return n, nil // the trailer with the next Read
			}
			if err := c.trailer.ReadTrailer(c.br); err != nil {
				if err == io.EOF {
					err = errChunkTrailerEnd
				}
				return 0, c.fail(err)
			}
			c.done = true
			return 0, io.EOF
		}
		if c.left == 0 {
			size, err := c.nextSize(n > 0)
			if err != nil {
				return n, c.fail(err)
			}
			if size < 0 {
				return n, nil // the size line has not all arrived
			}
			if size == 0 {
				c.last = true
				continue
			}
			c.left = size
		}
		if n > 0 && c.br.Buffered() == 0 {
			return n, nil
		}
		want := min(c.left, len(p)-n)
		k, err := c.br.Read(p[n : n+want])
		n += k
		c.left -= k
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return n, c.fail(err)
		}
		if c.left == 0 {
			// The CRLF after the data, read at once as fasthttp does:
			// what stays buffered is the next chunk (see Buffered).
			if !c.skipBufferedCRLF() {
				if err := c.readCRLF(errChunkDataCRLF); err != nil {
					return n, c.fail(err)
				}
			}
		}
	}
	return n, nil
}

// next returns the body's next data that has already arrived, up to the
// end of the current chunk, in place: a slice of the connection reader's
// buffer, not a copy, valid until the reader next reads from the
// connection (a Read, or a next that waits); until then the bytes before
// it in that buffer, already read, may be written over. With wait, and
// nothing buffered, it first waits for the next bytes as Read does; it
// never waits otherwise. It returns nil and no error where the framing has
// not all arrived (a size line, the CRLF after a chunk's data, a trailer
// section) or is not its common form: Read takes it from there, and
// decides as it always does. io.EOF: the last chunk and an empty trailer
// section are read, the body is over.
func (c *chunkedBody) next(wait bool) ([]byte, error) {
	if c.done {
		return nil, io.EOF
	}
	if c.err != nil {
		return nil, c.err
	}
	if wait && c.br.Buffered() == 0 {
		if _, err := c.br.Peek(1); err != nil {
			if err == io.EOF {
				// As Read names it: a cut between chunks or inside one's
				// data (the CRLF after data is never left unread here), or
				// inside the trailer section.
				err = io.ErrUnexpectedEOF
				if c.last {
					err = errChunkTrailerEnd
				}
			}
			return nil, c.fail(err)
		}
	}
	for c.left == 0 {
		if c.last {
			if c.br.Buffered() < 2 {
				return nil, nil
			}
			if crlf, _ := c.br.Peek(2); crlf[0] != '\r' || crlf[1] != '\n' {
				return nil, nil // a trailer with fields: fasthttp's parser reads it (Read)
			}
			_, _ = c.br.Discard(2)
			c.done = true
			return nil, io.EOF
		}
		size, err := c.nextSize(true)
		switch {
		case err != nil:
			return nil, c.fail(err)
		case size < 0:
			return nil, nil
		case size == 0:
			c.last = true
		default:
			c.left = size
		}
	}
	k := min(c.left, c.br.Buffered())
	if k == c.left {
		// The chunk's data ends here: taken with its CRLF when that has
		// arrived too and is one; else a byte is left for Read, which
		// waits for the CRLF or fails on it as it always does.
		if c.br.Buffered() < k+2 {
			k--
		} else if b, _ := c.br.Peek(k + 2); b[k] != '\r' || b[k+1] != '\n' {
			k--
		}
	}
	if k <= 0 {
		return nil, nil
	}
	b, _ := c.br.Peek(k)
	_, _ = c.br.Discard(k)
	c.left -= k
	if c.left == 0 {
		_, _ = c.br.Discard(2) // the CRLF checked above
	}
	return b, nil
}

// skipBufferedCRLF skips a CRLF that waits in the reader, and reports
// whether there was one.
func (c *chunkedBody) skipBufferedCRLF() bool {
	if c.br.Buffered() < 2 {
		return false
	}
	crlf, _ := c.br.Peek(2)
	if crlf[0] != '\r' || crlf[1] != '\n' {
		return false
	}
	_, _ = c.br.Discard(2)
	return true
}

func (c *chunkedBody) fail(err error) error {
	c.err = err
	return err
}

// nextSize reads the next chunk's size line. From the bytes already
// buffered when the whole line is there (no reader call a byte); else, with
// data in hand (nowait), it reports -1 rather than wait for the rest;
// else it reads the line byte by byte, waiting for it.
func (c *chunkedBody) nextSize(nowait bool) (int, error) {
	if c.br.Buffered() == 0 {
		if nowait {
			return -1, nil
		}
		// Wait for the line: it comes with whatever else has arrived.
		if _, err := c.br.Peek(1); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // cut between chunks
			}
			return 0, err
		}
	}
	b, _ := c.br.Peek(c.br.Buffered())
	size, k, err := parseSizeLine(b)
	switch {
	case err != nil:
		return 0, err
	case k > 0:
		_, _ = c.br.Discard(k)
		return size, nil
	case nowait:
		return -1, nil
	}
	return c.readSize()
}

// sizeLine is a chunk's size line being read: the size, then optional
// whitespace or an extension (';' right after the size, anything up to
// CR), then CRLF.
type sizeLine struct {
	size, digits            int
	pastDigits              bool
	inExtension, afterSpace bool
}

// step takes the line's next byte. It reports true at the CR that ends the
// line (the LF is the caller's to check).
func (l *sizeLine) step(b byte) (bool, error) {
	if !l.pastDigits {
		if d := hexDigit(b); d >= 0 {
			if l.digits == maxChunkSizeDigits {
				return false, errChunkSizeTooLarge
			}
			l.size = l.size<<4 | d
			l.digits++
			return false, nil
		}
		if l.digits == 0 {
			return false, errChunkSizeEmpty
		}
		l.pastDigits = true
	}
	switch {
	case b == '\r':
		return true, nil
	case b == '\n':
		return false, errChunkSizeLF
	case l.inExtension:
	case b == ' ' || b == '\t':
		l.afterSpace = true
	case b == ';' && !l.afterSpace:
		l.inExtension = true
	default:
		return false, errChunkSizeChar
	}
	return false, nil
}

// parseSizeLine parses a chunk's size line at the start of b, returning
// the size and the line's length, or a length of 0 when b ends before the
// line does.
func parseSizeLine(b []byte) (size, length int, err error) {
	var l sizeLine
	for i, c := range b {
		end, err := l.step(c)
		switch {
		case err != nil:
			return 0, 0, err
		case !end:
			continue
		case i+1 == len(b):
			return 0, 0, nil
		case b[i+1] != '\n':
			return 0, 0, errChunkSizeEnd
		}
		return l.size, i + 2, nil
	}
	return 0, 0, nil
}

// readSize reads a chunk's size line byte by byte, waiting for its bytes.
func (c *chunkedBody) readSize() (int, error) {
	var l sizeLine
	for {
		b, err := c.br.ReadByte()
		switch {
		case err == io.EOF && l.digits == 0:
			return 0, io.ErrUnexpectedEOF // cut between chunks
		case err == io.EOF:
			return 0, errChunkSizeEnd
		case err != nil:
			return 0, err
		}
		end, err := l.step(b)
		if err != nil {
			return 0, err
		}
		if end {
			_ = c.br.UnreadByte()
			return l.size, c.readCRLF(errChunkSizeEnd)
		}
	}
}

// readCRLF reads CR then LF; bad is the error of another byte or of the
// end of the bytes.
func (c *chunkedBody) readCRLF(bad error) error {
	for _, want := range [2]byte{'\r', '\n'} {
		b, err := c.br.ReadByte()
		switch {
		case err == io.EOF:
			return bad
		case err != nil:
			return err
		case b != want:
			return bad
		}
	}
	return nil
}

func hexDigit(b byte) int {
	switch {
	case b >= '0' && b <= '9':
		return int(b - '0')
	case b >= 'a' && b <= 'f':
		return int(b-'a') + 10
	case b >= 'A' && b <= 'F':
		return int(b-'A') + 10
	}
	return -1
}
