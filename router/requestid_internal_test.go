package router

import (
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
)

// The request-id header names are set with SetCanonical, which trusts
// them to be in fasthttp's canonical form: they must be what fasthttp
// makes of them itself, or a lookup of the header would miss it.
func TestRequestIDKeysAreCanonical(t *testing.T) {
	for _, key := range [][]byte{requestIDKey, inferaRequestIDKey} {
		var h fasthttp.ResponseHeader
		h.Set(string(bytes.ToLower(key)), "v")
		var got []byte
		for k := range h.All() {
			if bytes.EqualFold(k, key) {
				got = append(got[:0], k...)
			}
		}
		if !bytes.Equal(got, key) {
			t.Fatalf("fasthttp names %q %q", key, got)
		}
	}
}
