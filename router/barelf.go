package router

import (
	"errors"
	"net"
)

// errBareLF: a request line ended with a bare LF. fasthttp only knows
// CRLF line endings and would wait for one until the read timeout, so the
// client connection's reader ends the request at once instead: fasthttp
// hands the error to handleParseError, which answers 400 and closes.
var errBareLF = errors.New("request line ends with a bare LF; HTTP/1.1 lines end with CRLF")

// lfListener wraps a client listener's connections in lfGuardConn.
type lfListener struct{ net.Listener }

func (l lfListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lfGuardConn{Conn: c}, nil
}

// lfGuardConn watches the first line a client sends: when it ends with a
// bare LF, the bytes read so far are returned and the next Read fails with
// errBareLF. After the first line it is a plain pass-through (one branch
// per Read). Only the connection's first request line is checked: a client
// that sends CRLF once does not switch to bare LF.
//
// Concurrency: fasthttp reads a connection from one goroutine at a time.
type lfGuardConn struct {
	net.Conn
	checked bool // the first line was complete (or bad)
	bad     bool // it ended with a bare LF
	lastCR  bool // the last byte read was '\r'
}

func (c *lfGuardConn) Read(p []byte) (int, error) {
	if c.checked {
		if c.bad {
			return 0, errBareLF
		}
		return c.Conn.Read(p)
	}
	n, err := c.Conn.Read(p)
	for i := range n {
		if p[i] == '\n' {
			prevCR := c.lastCR
			if i > 0 {
				prevCR = p[i-1] == '\r'
			}
			c.checked, c.bad = true, !prevCR
			break
		}
	}
	if n > 0 {
		c.lastCR = p[n-1] == '\r'
	}
	return n, err
}
