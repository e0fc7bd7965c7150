package resp

import (
	"bytes"
	"testing"
)

// FuzzParse: any input parses without panicking, consumes no more than
// it was given, yields arguments inside the input, and a parsed request
// re-encoded as multibulk parses back to the same arguments.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"*1\r\n$4\r\nPING\r\n", "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n", "PING\r\n", "SET a b\n", "*0\r\n", "*-1\r\n",
		"*1\r\n:x\r\n", "*abc\r\n", "*1\r\n$-5\r\n", "*2\r\n$3\r\nGET\r\n$100\r\nshort", "\r\n", "*1\r\n$0\r\n\r\n",
		"*11\r\n", "*1\r\n$16385\r\n",
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
