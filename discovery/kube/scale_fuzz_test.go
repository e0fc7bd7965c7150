package kube

import (
	"errors"
	"testing"
)

// POST /v1/admin/scale bodies come from clients: parsing and the messages
// built from them (Python reprs of any JSON value) never panic, and a
// refused body is a 400 scale error.
func FuzzParseScaleBody(f *testing.F) {
	for _, s := range []string{
		`{"services":{"prefill":{"replicas":3},"decode":4}}`,
		`{"services":{"a":1,"a":{"replicas":2.5e-7}}}`,
		`{"services":{"x":[1,"it's",{"k":null,"j":true}]}}`,
		`{"services":{"x":"\u00e9\n\u2028"}}`,
		`{"services":{"x":-0}}`, `{"services":{"x":1e400}}`, `[1]`, `{"services":`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		reqs, err := ParseScaleBody(body)
		if err != nil {
			var se *ScaleError
			if !errors.As(err, &se) || se.Status != 400 {
				t.Fatalf("refused body: %v, want a 400 scale error", err)
			}
			return
		}
		for _, r := range reqs {
			_ = reprJSON(r.Replicas)
			_, _ = intLiteral(r.Replicas)
			_ = pyRepr(r.Service)
		}
	})
}
