package router

import (
	"encoding/json"
	"slices"
	"testing"
)

// FuzzReadTokens: readTokens reads "tokens" of a /detokenize body as
// encoding/json does whenever it accepts it, and accepts every array of
// uint32 ids.
func FuzzReadTokens(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","tokens":[1,2,3]}`, `{"tokens":[]}`, `{"tokens":[4294967295]}`, `{"tokens":[4294967296]}`,
		`{"tokens":[-1]}`, `{"tokens":[1.5]}`, `{"tokens":"x"}`, `{"t\u006fkens":[7]}`, `{"tokens":[1],"tokens":[2]}`,
		`{"tokens":[ 1 , 2 ]}`, `{"model":"m"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) || len(body) == 0 || body[0] != '{' {
			return // openai.Scan rejects these before readTokens
		}
		tr, err := readTokens(body)
		var v struct {
			Tokens *[]uint32 `json:"tokens"`
		}
		jerr := json.Unmarshal(body, &v)
		if err != nil {
			return // stricter than encoding/json is fine (it takes 1e0)
		}
		if jerr != nil {
			// encoding/json matches keys case-insensitively; ours does not.
			return
		}
		if v.Tokens != nil && tr.hasTokens && !slices.Equal(*v.Tokens, tr.tokens) && len(*v.Tokens)+len(tr.tokens) > 0 {
			t.Fatalf("%s: read %v, encoding/json %v", body, tr.tokens, *v.Tokens)
		}
	})
}
