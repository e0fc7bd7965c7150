package resp

import "strconv"

// Reply encoders: each appends one RESP2 value to b.

var (
	replyOK     = []byte("+OK\r\n")
	replyPong   = []byte("+PONG\r\n")
	replyNil    = []byte("$-1\r\n")
	replyNoAuth = []byte("-NOAUTH Authentication required.\r\n")
	replySyntax = []byte("-ERR syntax error\r\n")
	replyNotInt = []byte("-ERR value is not an integer or out of range\r\n")
	replyOOM    = []byte("-OOM command not allowed when used memory > 'maxmemory'.\r\n")
	// replyOOMHeld and replyOOMLarge say why kvd refused (the "-OOM"
	// prefix is what clients match).
	replyOOMHeld  = []byte("-OOM command not allowed when used memory > 'maxmemory': kvd's memory is held by values of equal or higher retention.\r\n")
	replyOOMLarge = []byte("-OOM command not allowed when used memory > 'maxmemory': the value is larger than kvd's largest arena slot and its inline budget.\r\n")
	replyNoProto  = []byte("-NOPROTO unsupported protocol version\r\n")
	replyBadPass  = []byte("-WRONGPASS invalid username-password pair or user is disabled.\r\n")
)

func appendBulk(b, v []byte) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(v)), 10)
	b = append(b, '\r', '\n')
	b = append(b, v...)
	return append(b, '\r', '\n')
}

func appendBulkString(b []byte, v string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(v)), 10)
	b = append(b, '\r', '\n')
	b = append(b, v...)
	return append(b, '\r', '\n')
}

func appendInt(b []byte, v int64) []byte {
	b = append(b, ':')
	b = strconv.AppendInt(b, v, 10)
	return append(b, '\r', '\n')
}

func appendArray(b []byte, n int) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

// appendErr writes "-ERR msg" with Redis's sanitizing of CR and LF to
// spaces (rejectCommandFormat).
func appendErr(b []byte, msg string) []byte {
	b = append(b, "-ERR "...)
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return append(b, '\r', '\n')
}

// appendStrings writes an array of bulk strings.
func appendStrings(b []byte, ss ...string) []byte {
	b = appendArray(b, len(ss))
	for _, s := range ss {
		b = appendBulkString(b, s)
	}
	return b
}
