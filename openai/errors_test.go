package openai_test

import (
	"encoding/json"
	"testing"

	"github.com/infera/infera/openai"
)

func TestAppendError(t *testing.T) {
	tests := []struct{ message, typ, code string }{
		{"The model `x` does not exist", openai.TypeNotFound, "model_not_found"},
		{"quote \" backslash \\ newline \n tab \t nul \x00 del \x7f", openai.TypeInvalidRequest, ""},
		{"bad utf8 \xff\xfe and \u2028 line sep, é ok 😀", openai.TypeServer, "x\"y"},
		{"", "", ""},
	}
	for _, tc := range tests {
		out := openai.AppendError([]byte("prefix:"), tc.message, tc.typ, tc.code)
		if string(out[:7]) != "prefix:" {
			t.Fatalf("AppendError dropped dst: %q", out)
		}
		var env struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(out[7:], &env); err != nil {
			t.Fatalf("AppendError(%q) = %q is not JSON: %v", tc.message, out[7:], err)
		}
		// encoding/json turns invalid UTF-8 into U+FFFD exactly as the envelope does.
		wantMsg, _ := json.Marshal(tc.message)
		var want string
		_ = json.Unmarshal(wantMsg, &want)
		if env.Error.Message != want || env.Error.Type != tc.typ {
			t.Fatalf("round trip = %+v, want message %q type %q", env.Error, want, tc.typ)
		}
		if tc.code == "" && env.Error.Code != nil || tc.code != "" && (env.Error.Code == nil || *env.Error.Code != tc.code) {
			t.Fatalf("code = %v, want %q", env.Error.Code, tc.code)
		}
	}
}

func FuzzAppendQuoted(f *testing.F) {
	f.Add("plain")
	f.Add("\x00\"\\\xff\u2028")
	f.Fuzz(func(t *testing.T, s string) {
		out := openai.AppendQuoted(nil, s)
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("AppendQuoted(%q) = %q is not a JSON string: %v", s, out, err)
		}
		want, _ := json.Marshal(s)
		var w string
		_ = json.Unmarshal(want, &w)
		if got != w {
			t.Fatalf("AppendQuoted(%q) decodes to %q, want %q", s, got, w)
		}
	})
}

func TestAppendErrorAllocs(t *testing.T) {
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() {
		buf = openai.AppendError(buf[:0], "no active worker serves model \"m\"", openai.TypeUnavailable, "no_worker_available")
	}); n != 0 {
		t.Fatalf("AppendError allocates %.1f times, want 0", n)
	}
}
