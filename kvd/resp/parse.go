package resp

import (
	"bytes"
	"errors"
)

// Limits Redis applies to requests (server.h: PROTO_INLINE_MAX_SIZE, the
// multibulk length limit in processMultibulkBuffer).
const (
	inlineMax     = 64 << 10
	maxMultibulk  = 1<<31 - 1
	unauthMaxArgs = 10
	unauthMaxBulk = 16384
)

// ProtocolError is a malformed request; Msg is Redis's text (the reply is
// "-ERR Protocol error: " + Msg and the connection is closed after it).
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "resp: protocol error: " + e.Msg }

// ErrProtocol is wrapped by every *ProtocolError (errors.Is).
var ErrProtocol = errors.New("resp: protocol error")

// Is makes errors.Is(err, ErrProtocol) hold.
func (e *ProtocolError) Is(target error) bool { return target == ErrProtocol }

var (
	errInvalidMultibulk = &ProtocolError{"invalid multibulk length"}
	errInvalidBulk      = &ProtocolError{"invalid bulk length"}
	errBigMultibulk     = &ProtocolError{"too big mbulk count string"}
	errBigBulk          = &ProtocolError{"too big bulk count string"}
	errBigInline        = &ProtocolError{"too big inline request"}
	errUnauthMultibulk  = &ProtocolError{"unauthenticated multibulk length"}
	errUnauthBulk       = &ProtocolError{"unauthenticated bulk length"}
)

// expectedDollar is Redis's "expected '$', got 'c'" (an allocation only on
// this error path).
func expectedDollar(c byte) *ProtocolError {
	return &ProtocolError{"expected '$', got '" + string(rune(c)) + "'"}
}

// parseInt is Redis's string2ll: an optional '-', digits, no leading
// zeros (except "0"), no '+', no spaces, within int64.
func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	neg := false
	if b[0] == '-' {
		neg, b = true, b[1:]
		if len(b) == 0 {
			return 0, false
		}
	}
	if len(b) == 1 && b[0] == '0' {
		return 0, !neg
	}
	if b[0] < '1' || b[0] > '9' {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (1<<64-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
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

// Parse reads one request from the front of b: a multibulk array of bulk
// strings (what clients send) or an inline command (words separated by
// spaces, as typed into telnet; quoting is not interpreted). It returns
// the arguments, aliasing b, appended to args[:0], and the bytes consumed.
//
// n == 0 with a nil error means b holds no complete request yet; need is
// then a lower bound of the request's total length (0 = unknown): the
// caller need not parse again before that much has arrived. A request
// that Redis ignores (an empty inline line, "*0" or a negative count)
// returns n > 0 and no arguments. maxBulk bounds one argument; a client
// that still has to authenticate (unauth) may send at most 10 arguments of
// at most 16 KiB, as in Redis.
// minBulk is the shortest bulk argument: "$0\r\n" and two bytes.
const minBulk = 6

func Parse(b []byte, args [][]byte, maxBulk int, unauth bool) (out [][]byte, n, need int, err error) {
	out = args[:0]
	if len(b) == 0 {
		return out, 0, 0, nil
	}
	if b[0] != '*' {
		return parseInline(b, out)
	}
	nl := bytes.IndexByte(b, '\r')
	if nl < 0 {
		if len(b) > inlineMax {
			return out, 0, 0, errBigMultibulk
		}
		return out, 0, 0, nil
	}
	if nl > inlineMax {
		return out, 0, 0, errBigMultibulk
	}
	if nl+1 >= len(b) {
		return out, 0, 0, nil // the '\n' has not arrived
	}
	count, ok := parseInt(b[1:nl])
	if !ok || count > maxMultibulk {
		return out, 0, 0, errInvalidMultibulk
	}
	if unauth && count > unauthMaxArgs {
		return out, 0, 0, errUnauthMultibulk
	}
	pos := nl + 2
	if count <= 0 {
		return out, pos, 0, nil
	}
	for i := int64(0); i < count; i++ {
		// What is missing is at least minBulk bytes per argument still
		// to come: the caller parses again only when that much is here,
		// so a request dripped in small reads is not re-parsed from its
		// start on every read.
		atLeast := pos + int(count-i)*minBulk
		if pos >= len(b) {
			return out[:0], 0, atLeast, nil
		}
		if b[pos] != '$' {
			return out[:0], 0, 0, expectedDollar(b[pos])
		}
		rest := b[pos:]
		nl := bytes.IndexByte(rest, '\r')
		if nl < 0 {
			if len(rest) > inlineMax {
				return out[:0], 0, 0, errBigBulk
			}
			return out[:0], 0, max(atLeast, len(b)+1), nil
		}
		if nl > inlineMax {
			return out[:0], 0, 0, errBigBulk
		}
		if nl+1 >= len(rest) {
			return out[:0], 0, max(atLeast, len(b)+1), nil
		}
		l, ok := parseInt(rest[1:nl])
		if !ok || l < 0 || l > int64(maxBulk) {
			return out[:0], 0, 0, errInvalidBulk
		}
		if unauth && l > unauthMaxBulk {
			return out[:0], 0, 0, errUnauthBulk
		}
		start := pos + nl + 2
		end := start + int(l)
		if end+2 > len(b) {
			return out[:0], 0, end + 2 + int(count-i-1)*minBulk, nil
		}
		out = append(out, b[start:end:end])
		pos = end + 2 // Redis skips the two bytes after a bulk without checking them
	}
	return out, pos, 0, nil
}

func parseInline(b []byte, out [][]byte) ([][]byte, int, int, error) {
	nl := bytes.IndexByte(b, '\n')
	if nl < 0 {
		if len(b) > inlineMax {
			return out, 0, 0, errBigInline
		}
		return out, 0, 0, nil
	}
	line := b[:nl]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	i := 0
	for i < len(line) {
		for i < len(line) && isSpace(line[i]) {
			i++
		}
		j := i
		for j < len(line) && !isSpace(line[j]) {
			j++
		}
		if j > i {
			out = append(out, line[i:j:j])
		}
		i = j
	}
	return out, nl + 1, 0, nil
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'
}
