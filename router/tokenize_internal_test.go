package router

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/infera/infera/openai"
)

// FuzzReadTokens: readTokens reads "tokens" of a /detokenize body as
// encoding/json does whenever it accepts it, and accepts every array of
// uint32 ids.
func FuzzReadTokens(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","tokens":[1,2,3]}`, `{"tokens":[]}`, `{"tokens":[4294967295]}`, `{"tokens":[4294967296]}`,
		`{"tokens":[-1]}`, `{"tokens":[1.5]}`, `{"tokens":"x"}`, `{"t\u006fkens":[7]}`, `{"tokens":[1],"tokens":[2]}`, `{"tokens":[],"tokeNs":[0]}`,
		`{"tokens":[ 1 , 2 ]}`, `{"model":"m"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var scan openai.Request
		if openai.Scan(body, &scan) != nil {
			return // serveTokenize answers 400 before readTokens
		}
		tr, err := readTokens(body)
		// The oracle matches keys exactly, as the reference's pydantic
		// models do (a map keeps the last of duplicate keys, as readTokens
		// does); a struct tag would also take "tokeNs".
		var members map[string]json.RawMessage
		if json.Unmarshal(body, &members) != nil {
			return
		}
		raw, has := members["tokens"]
		var want []uint32
		jerr := json.Unmarshal(raw, &want)
		if err != nil {
			return // stricter than encoding/json is fine (it takes 1e0)
		}
		if has != tr.hasTokens {
			t.Fatalf("%s: has tokens %v, encoding/json %v", body, tr.hasTokens, has)
		}
		if has && jerr == nil && !slices.Equal(want, tr.tokens) {
			t.Fatalf("%s: read %v, encoding/json %v", body, tr.tokens, want)
		}
	})
}
