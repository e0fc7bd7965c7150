package sim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"testing"
)

type embeddingAnswer struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Index     int             `json:"index"`
		Object    string          `json:"object"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func (ts *testSim) embed(t *testing.T, body string) embeddingAnswer {
	t.Helper()
	code, b := ts.post(t, "/v1/embeddings", body)
	var a embeddingAnswer
	if err := json.Unmarshal(b, &a); err != nil || code != 200 || a.Object != "list" || a.Model != "sim-model" {
		t.Fatalf("embeddings %s: %d %s (%v)", body, code, b, err)
	}
	return a
}

func floats(t *testing.T, raw json.RawMessage) []float64 {
	t.Helper()
	var v []float64
	if raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		bs, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(bs)%4 != 0 {
			t.Fatalf("base64 embedding %s: %v", raw, err)
		}
		for i := 0; i < len(bs); i += 4 {
			v = append(v, float64(math.Float32frombits(binary.LittleEndian.Uint32(bs[i:]))))
		}
		return v
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("embedding %s: %v", raw, err)
	}
	return v
}

// TestEmbeddings: POST /v1/embeddings answers vLLM's shape with one unit
// vector per input, the same for the same input (string or its token ids,
// float or base64), different for different inputs.
func TestEmbeddings(t *testing.T) {
	ts := startSim(t, nil)
	a := ts.embed(t, `{"model":"sim-model","input":["hello","world","hello"]}`)
	if len(a.Data) != 3 || a.Usage.PromptTokens != 15 || a.Usage.TotalTokens != 15 {
		t.Fatalf("three inputs: %+v", a)
	}
	vs := make([][]float64, 3)
	for i, d := range a.Data {
		if d.Index != i || d.Object != "embedding" {
			t.Fatalf("data[%d] = %+v", i, d)
		}
		vs[i] = floats(t, d.Embedding)
		var norm float64
		for _, x := range vs[i] {
			norm += x * x
		}
		if len(vs[i]) != embeddingDims || math.Abs(norm-1) > 1e-4 {
			t.Fatalf("vector %d: %d dims, norm² %v", i, len(vs[i]), norm)
		}
	}
	same := func(x, y []float64) bool {
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if math.Abs(x[i]-y[i]) > 1e-6 {
				return false
			}
		}
		return true
	}
	if !same(vs[0], vs[2]) || same(vs[0], vs[1]) {
		t.Fatalf("equal inputs must embed equally, different ones differently: %v", vs)
	}
	// "hello" as token ids (the bytes tokenizer), alone and batched, and in base64.
	for _, body := range []string{
		`{"model":"sim-model","input":"hello"}`,
		`{"model":"sim-model","input":[104,101,108,108,111]}`,
		`{"model":"sim-model","input":[[104,101,108,108,111],[1,2]]}`,
		`{"model":"sim-model","input":"hello","encoding_format":"base64"}`,
	} {
		if v := floats(t, ts.embed(t, body).Data[0].Embedding); !same(v, vs[0]) {
			t.Fatalf("%s embeds differently from \"hello\"", body)
		}
	}
	if v := floats(t, ts.embed(t, `{"model":"sim-model","input":"hello","dimensions":8}`).Data[0].Embedding); len(v) != 8 {
		t.Fatalf("dimensions 8: %d", len(v))
	}
	for _, tc := range []struct{ body, typ string }{
		{`{"model":"sim-model"}`, "BadRequestError"},
		{`{"model":"sim-model","input":[]}`, "BadRequestError"},
		{`{"model":"sim-model","input":""}`, "BadRequestError"},
		{`{"model":"sim-model","input":3}`, "BadRequestError"},
		{`{"model":"sim-model","input":[1,"x"]}`, "BadRequestError"},
		{`{"model":"sim-model","input":[999]}`, "BadRequestError"},
		{`{"model":"sim-model","input":"x","encoding_format":"hex"}`, "BadRequestError"},
		{`{"model":"sim-model","input":"x","dimensions":0}`, "BadRequestError"},
		{`{"model":"other","input":"x"}`, "NotFoundError"},
	} {
		code, b := ts.post(t, "/v1/embeddings", tc.body)
		want := 400
		if tc.typ == "NotFoundError" {
			want = 404
		}
		if code != want {
			t.Fatalf("%s: %d %s", tc.body, code, b)
		}
		checkEnvelope(t, b, want, tc.typ)
	}
}
