package router

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestOriginFormWritesAsTheURI: a request given originForm's Host and
// target goes out byte for byte as one given the full URI (what the relay
// sent before it stopped parsing URIs per request), whatever the worker's
// URL looks like.
func TestOriginFormWritesAsTheURI(t *testing.T) {
	write := func(build func(*fasthttp.Request)) []byte {
		t.Helper()
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		build(req)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetBodyString("{}")
		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		if err := req.Write(bw); err != nil {
			t.Fatal(err)
		}
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
		return out.Bytes()
	}
	for _, uri := range []string{
		"http://127.0.0.1:8000/v1/chat/completions",
		"http://Engine-A.Example:8000/v1/chat/completions",
		"http://[::1]:8000/v1/completions",
		"http://engine/prefix/v1/chat/completions",
		"https://engine:443/a%20b/v1/chat/completions",
		"http://engine:8000/a//b/../v1/embeddings",
	} {
		for _, disable := range []bool{true, false} {
			host, target, err := originForm(uri, disable)
			if err != nil {
				t.Fatalf("%s: %v", uri, err)
			}
			want := write(func(req *fasthttp.Request) {
				req.SetRequestURI(uri)
				req.URI().DisablePathNormalizing = disable
			})
			got := write(func(req *fasthttp.Request) {
				req.Header.SetHost(host)
				req.Header.SetRequestURI(target)
			})
			if !bytes.Equal(got, want) {
				t.Errorf("%s (path normalizing off: %v): origin form writes\n%q\nthe URI\n%q", uri, disable, got, want)
			}
		}
	}
}
