package router

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
)

// chunkConn is a net.Conn whose reads return data in chunks of the given
// sizes (the last one repeating), then io.EOF.
type chunkConn struct {
	net.Conn
	data  []byte
	sizes []byte
}

func (c *chunkConn) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := len(c.data)
	if len(c.sizes) > 0 {
		n = max(1, int(c.sizes[0]))
		if len(c.sizes) > 1 {
			c.sizes = c.sizes[1:]
		}
	}
	n = min(n, len(c.data), len(p))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// readGuarded reads everything through an lfGuardConn.
func readGuarded(data, sizes []byte) ([]byte, error) {
	g := &lfGuardConn{Conn: &chunkConn{data: data, sizes: sizes}}
	var out []byte
	buf := make([]byte, 64)
	for {
		n, err := g.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return out, err
		}
	}
}

func TestLFGuard(t *testing.T) {
	for _, c := range []struct {
		in  string
		bad bool
	}{
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"GET / HTTP/1.1\nHost: x\n\n", true},
		{"\n", true},
		{"\r\nGET / HTTP/1.1\r\n", false},
		{"GET / HTTP/1.1\r\nHost: x\n\n", false}, // only the first line is checked
		{"no line end at all", false},
	} {
		for _, sizes := range [][]byte{nil, {1}, {3, 1, 7}} {
			out, err := readGuarded([]byte(c.in), sizes)
			if bad := errors.Is(err, errBareLF); bad != c.bad {
				t.Errorf("%q in chunks %v: bare LF %t, want %t (err %v)", c.in, sizes, bad, c.bad, err)
			}
			if !c.bad && string(out) != c.in {
				t.Errorf("%q in chunks %v: read %q", c.in, sizes, out)
			}
		}
	}
}

// FuzzLFGuard: however the bytes are split into reads, the guard passes
// them through unchanged up to its verdict, and its verdict is that of the
// first line end of the whole input.
func FuzzLFGuard(f *testing.F) {
	f.Add([]byte("POST /v1/chat/completions HTTP/1.1\nHost: x\n\n"), []byte{5, 1})
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), []byte{16, 1})
	f.Add([]byte("\r\n\n"), []byte{1})
	f.Fuzz(func(t *testing.T, data, sizes []byte) {
		out, err := readGuarded(data, sizes)
		i := bytes.IndexByte(data, '\n')
		wantBad := i == 0 || i > 0 && data[i-1] != '\r'
		if gotBad := errors.Is(err, errBareLF); gotBad != wantBad {
			t.Fatalf("bare LF %t, want %t (err %v)", gotBad, wantBad, err)
		}
		if !bytes.HasPrefix(data, out) {
			t.Fatalf("read %q, not a prefix of the input", out)
		}
		if !wantBad && !bytes.Equal(out, data) {
			t.Fatalf("read %q of %q", out, data)
		}
	})
}
