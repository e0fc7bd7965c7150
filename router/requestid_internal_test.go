package router

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// The header names the relay peeks and sets with PeekCanonical and
// SetCanonical, which trust them to be in fasthttp's canonical form: they
// must be what fasthttp makes of them itself (as a response's names, and
// as its parser stores a request's, whatever their case on the wire), or
// a lookup of the header would miss it.
func TestHeaderKeysAreCanonical(t *testing.T) {
	keys := [][]byte{requestIDKey, inferaRequestIDKey, inferaWorkerKey, cacheControlKey, dataParallelRankKey, traceparentKey, tracestateKey}
	keys = append(keys, forwardHeaders[:]...)
	for _, key := range keys {
		var h fasthttp.ResponseHeader
		h.Set(string(bytes.ToLower(key)), "v")
		var got []byte
		for k := range h.All() {
			if bytes.EqualFold(k, key) {
				got = append(got[:0], k...)
			}
		}
		if !bytes.Equal(got, key) {
			t.Errorf("fasthttp names %q %q", key, got)
		}
		for _, wire := range []string{string(bytes.ToLower(key)), string(bytes.ToUpper(key))} {
			var req fasthttp.Request
			raw := "POST / HTTP/1.1\r\nHost: h\r\n" + wire + ": v\r\nContent-Length: 0\r\n\r\n"
			if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
				t.Fatal(err)
			}
			if v := req.Header.PeekCanonical(key); string(v) != "v" {
				t.Errorf("a request's %q header is not found as %q (%q)", wire, key, v)
			}
		}
	}
}

// TestGeneratedRequestIDs: an id the router makes is its random prefix and
// the sequence number in 16 lower-case hex digits; a client's valid one
// is taken as is.
func TestGeneratedRequestIDs(t *testing.T) {
	r, err := New(DefaultConfig(), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{0, 1, 0xabcdef, 1<<63 + 5, 0x0123456789abcdee, 0xfedcba987654320f, 0x9a9a9a9a9a9a9a9a, ^uint64(0) - 1} {
		r.idSeq.Store(seq)
		got := r.appendRequestID([]byte("x"), nil)
		digits := strconv.FormatUint(seq+1, 16)
		want := "x" + string(r.idPrefix[:]) + strings.Repeat("0", 16-len(digits)) + digits
		if string(got) != want {
			t.Errorf("sequence %d: id %q, want %q", seq+1, got, want)
		}
	}
	if got := r.appendRequestID(nil, []byte("client-id-1")); string(got) != "client-id-1" {
		t.Errorf("a client's id came back as %q", got)
	}
	buf := make([]byte, 0, maxRequestIDBytes)
	if n := testing.AllocsPerRun(100, func() { buf = r.appendRequestID(buf[:0], nil) }); n != 0 {
		t.Errorf("%v allocations an id", n)
	}
}
