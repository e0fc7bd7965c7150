package router

import (
	"bufio"
	"bytes"
	"strings"
	"testing"

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
