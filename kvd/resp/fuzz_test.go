package resp

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/kvd"
)

// FuzzParse: any input parses without panicking, consumes no more than
// it was given, yields arguments inside the input, and a parsed request
// re-encoded as multibulk parses back to the same arguments.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"*1\r\n$4\r\nPING\r\n", "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n", "PING\r\n", "SET a b\n", "*0\r\n", "*-1\r\n",
		"*1\r\n:x\r\n", "*abc\r\n", "*1\r\n$-5\r\n", "*2\r\n$3\r\nGET\r\n$100\r\nshort", "\r\n", "*1\r\n$0\r\n\r\n",
		"*11\r\n", "*1\r\n$16385\r\n", "*3\r\n$1\r\na\r\n$0\r\n\r\n$2\r\nbc\r\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, b []byte, unauth bool) {
		args, n, need, err := Parse(b, nil, 1<<20, unauth)
		if err != nil {
			if n != 0 || len(args) != 0 {
				t.Fatalf("error %v with n=%d args=%d", err, n, len(args))
			}
			return
		}
		if n < 0 || n > len(b) {
			t.Fatalf("consumed %d of %d", n, len(b))
		}
		if n == 0 {
			if len(args) != 0 {
				t.Fatalf("incomplete request returned %d args", len(args))
			}
			if need != 0 && need <= len(b) {
				t.Fatalf("need %d but have %d", need, len(b))
			}
			return
		}
		if b[0] == '*' {
			// need is a lower bound: every prefix of a complete request is
			// incomplete and claims no more than the whole (a parser that
			// waits for need bytes then never misses the request).
			for k := range n {
				_, pn, pneed, perr := Parse(b[:k], nil, 1<<20, unauth)
				if perr == nil && (pn != 0 || pneed > n) {
					t.Fatalf("prefix %d of %d: n %d need %d", k, n, pn, pneed)
				}
			}
		}
		for _, a := range args {
			if len(a) > 0 && !within(b, a) {
				t.Fatalf("argument %q not inside the input", a)
			}
		}
		if len(args) == 0 {
			return
		}
		re := appendArray(nil, len(args))
		for _, a := range args {
			re = appendBulk(re, a)
		}
		args2, n2, _, err := Parse(re, nil, 1<<20, false)
		if err != nil || n2 != len(re) || len(args2) != len(args) {
			t.Fatalf("re-parse: err %v n %d/%d args %d/%d", err, n2, len(re), len(args2), len(args))
		}
		for i := range args {
			if !bytes.Equal(args[i], args2[i]) {
				t.Fatalf("arg %d: %q != %q", i, args[i], args2[i])
			}
		}
	})
}

func within(b, a []byte) bool {
	if len(b) == 0 {
		return false
	}
	as := &a[0]
	for i := range b {
		if &b[i] == as {
			return i+len(a) <= len(b)
		}
	}
	return false
}

// FuzzProcessChunks: a byte stream answered as it arrives, in chunks of
// any sizes (as the event loop reads it), gets the replies it gets when
// it arrives whole, and the connection ends at the same point.
func FuzzProcessChunks(f *testing.F) {
	for _, s := range []string{
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", "PING\r\nPING x\r\nGET k\n",
		"*2\r\n$4\r\nECHO\r\n$70000\r\n" + strings.Repeat("v", 70000) + "\r\n*1\r\n$4\r\nPING\r\n",
		"*1\r\n$4\r\nQUIT\r\n*1\r\n$4\r\nPING\r\n", "*1\r\nx\r\n", "MSET a 1 b 2\r\nMGET a b c\r\nDEL a\r\nEXISTS a b\r\n",
		// Replies past the output hold: the GETs after it wait for them.
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$600000\r\n" + strings.Repeat("v", 600000) + "\r\n" + strings.Repeat("GET k\r\n", 5) + "PING\r\n",
	} {
		f.Add([]byte(s), uint16(1), uint16(7))
		f.Add([]byte(s), uint16(5000), uint16(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, chunk, step uint16) {
		whole, wholeErr := processStream(t, b, len(b), 0)
		chunked, chunkErr := processStream(t, b, int(chunk%4096)+1, int(step%64))
		if bytes.Contains(whole, []byte("uptime_in_seconds")) {
			return // INFO's uptime may tick between the two
		}
		if !bytes.Equal(whole, chunked) || (wholeErr == nil) != (chunkErr == nil) {
			t.Fatalf("whole: %q (%v)\nchunked: %q (%v)", whole, wholeErr, chunked, chunkErr)
		}
	})
}

// processStream feeds b to a fresh connection chunk bytes at a time
// (growing by step), returning every reply and the error that ended it.
func processStream(t *testing.T, b []byte, chunk, step int) ([]byte, error) {
	st, err := kvd.NewStore(kvd.StoreOptions{MaxBytes: 64 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := NewServer(st, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	cn := &conn{s: srv, fd: -1, id: 1, in: make([]byte, readBuf), authed: true}
	var out []byte
	for len(b) > 0 {
		n := copy(cn.in[cn.w:], b[:min(chunk, len(b))])
		cn.w += n
		b = b[n:]
		chunk += step
		for {
			err := cn.process()
			out = append(out, cn.out...)
			cn.resetOut()
			if err != nil {
				return out, err
			}
			if !cn.held { // requests wait for 1 MiB of replies: written, they go on
				break
			}
		}
	}
	return out, nil
}
