package sim

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/tokenizer"
)

// byteLevelAlphabet maps bytes to the printable runes byte-level BPE
// vocabularies are written in: printable Latin-1 bytes stand for
// themselves, the others take the runes from U+0100 on, in byte order.
func byteLevelAlphabet() [256]rune {
	var out [256]rune
	next := rune(256)
	for b := range 256 {
		switch {
		case b >= '!' && b <= '~', b >= 0xA1 && b <= 0xAC, b >= 0xAE && b <= 0xFF:
			out[b] = rune(b)
		default:
			out[b] = next
			next++
		}
	}
	return out
}

// toyTokenizerDir writes a small byte-level BPE tokenizer.json (no chat
// template): the 256 byte tokens plus merges that make "the", " the",
// " theme" and " a" single tokens, so words take one or more tokens (and the
// simulator has two single-token words to answer with).
func toyTokenizerDir(t *testing.T) string {
	t.Helper()
	alpha := byteLevelAlphabet()
	vocab := map[string]int{}
	for b, r := range alpha {
		vocab[string(r)] = b
	}
	sp := string(alpha[' '])
	merges := [][2]string{{"t", "h"}, {"th", "e"}, {sp, "the"}, {sp + "the", "m"}, {sp + "them", "e"}, {"e", "n"}, {sp, "a"}}
	var ms []string
	for i, m := range merges {
		vocab[m[0]+m[1]] = 256 + i
		ms = append(ms, m[0]+" "+m[1])
	}
	doc := map[string]any{
		"version":      "1.0",
		"normalizer":   nil,
		"added_tokens": []any{},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+`}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": ms},
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func jsonIDs(t *testing.T, m map[string]any, key string) []uint32 {
	t.Helper()
	raw, ok := m[key].([]any)
	if !ok {
		t.Fatalf("%s missing: %v", key, m)
	}
	out := make([]uint32, len(raw))
	for i, v := range raw {
		out[i] = uint32(v.(float64))
	}
	return out
}

func usageOf(t *testing.T, m map[string]any) (prompt, completion, cached int) {
	t.Helper()
	u := m["usage"].(map[string]any)
	return int(u["prompt_tokens"].(float64)), int(u["completion_tokens"].(float64)),
		int(u["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64))
}

// TestHFTokenizerToy loads --tokenizer from a directory (no chat template):
// prompts are encoded with it, chat falls back to the ChatML layout,
// answers are max_tokens model tokens, and the KV events carry those ids.
func TestHFTokenizerToy(t *testing.T) {
	dir := toyTokenizerDir(t)
	tok, err := tokenizer.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := startEventRig(t, config.KVFormatVLLMArray, func(c *config.Sim) { c.Tokenizer = dir })
	ts := r.ts

	prompt := "the theme then the theme"
	want := tok.Encode(prompt)
	if got := jsonIDs(t, ts.postJSON(t, "/tokenize", `{"prompt":"the theme then the theme"}`), "tokens"); !slices.Equal(got, want) {
		t.Fatalf("tokenize %v, want %v", got, want)
	}
	chatText := "<|im_start|>user\nthe theme<|im_end|>\n<|im_start|>assistant\n"
	if got := jsonIDs(t, ts.postJSON(t, "/tokenize", chatBody(t, nil, "the theme")), "tokens"); !slices.Equal(got, tok.Encode(chatText)) {
		t.Fatalf("chat tokenize %v, want %v", got, tok.Encode(chatText))
	}
	vocab := tok.(*tokenizer.HF).VocabSize()
	if code, _ := ts.post(t, "/v1/completions", complBody(t, nil, []int{vocab})); code != http.StatusBadRequest {
		t.Errorf("out-of-vocabulary id: status %d", code)
	}

	m := r.complete(t, want, 9)
	text := m["choices"].([]any)[0].(map[string]any)["text"].(string)
	p, c, _ := usageOf(t, m)
	out := tok.Encode(text)
	if p != len(want) || c != 9 || len(out) != 9 {
		t.Fatalf("usage %d/%d, answer %q is %d tokens", p, c, text, len(out))
	}
	// The same answer streamed: one model token per event.
	resp := ts.stream(t, t.Context(), "/v1/completions", complBody(t, map[string]any{"max_tokens": 9, "stream": true}, prompt))
	events, err := readAllEvents(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var streamed strings.Builder
	for _, ev := range events[:len(events)-1] {
		var chunk struct {
			Choices []struct{ Text string }
		}
		if err := json.Unmarshal([]byte(ev), &chunk); err != nil {
			t.Fatal(err)
		}
		streamed.WriteString(chunk.Choices[0].Text)
	}
	if len(events) != 10 || streamed.String() != text {
		t.Errorf("%d events streaming %q, want 10 and %q", len(events), streamed.String(), text)
	}
	r.requests++

	// Prompt and answer blocks reach the router under its own hashes.
	st := r.waitSynced(t)
	all := append(slices.Clone(want), out...)
	hashes := kvcache.AppendBlockHashes(nil, all[:len(all)-1], r.bs)
	if got := r.idx.Match(r.w, hashes); got != len(hashes) || st.Blocks == 0 {
		t.Errorf("match %d of %d blocks of prompt+answer (%d indexed)", got, len(hashes), st.Blocks)
	}
}

var (
	qwenOnce sync.Once
	qwenTok  tokenizer.Tokenizer
	qwenErr  error
)

// qwen3 loads testdata/tokenizers/qwen3 once per test binary (seconds under
// the race detector). The files come from `make tokenizers`.
func qwen3(t *testing.T) tokenizer.Tokenizer {
	t.Helper()
	dir := filepath.Join("..", "testdata", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("INFERA_SKIP_TOKENIZER_PARITY") == "1" {
			t.Skip("qwen3 tokenizer files missing and INFERA_SKIP_TOKENIZER_PARITY=1")
		}
		t.Fatalf("qwen3 tokenizer files missing in %s: run make tokenizers (or set INFERA_SKIP_TOKENIZER_PARITY=1 to skip)", dir)
	}
	qwenOnce.Do(func() { qwenTok, qwenErr = tokenizer.Open(dir) })
	if qwenErr != nil {
		t.Fatal(qwenErr)
	}
	return qwenTok
}

// TestHFTokenizerQwen3: chat is rendered with Qwen3's template, the router
// (same tokenizer) finds the sim's blocks, and a second turn hits the
// first turn's cache.
func TestHFTokenizerQwen3(t *testing.T) {
	tok := qwen3(t)
	r := startEventRig(t, config.KVFormatVLLM, nil, withTokenizer(tok))
	msgs1 := `[{"role":"system","content":"You are terse."},{"role":"user","content":"Why do prefix caches help routers? Explain briefly."}]`
	text1, err := tok.RenderChat([]byte(msgs1))
	if err != nil {
		t.Fatal(err)
	}
	ids1 := tok.Encode(text1)
	if got := jsonIDs(t, r.ts.postJSON(t, "/tokenize", `{"messages":`+msgs1+`}`), "tokens"); !slices.Equal(got, ids1) {
		t.Fatalf("tokenize %v, want %v", got, ids1)
	}
	r.requests++
	m := r.ts.postJSON(t, "/v1/chat/completions", `{"max_tokens":12,"messages":`+msgs1+`}`)
	p, c, _ := usageOf(t, m)
	if p != len(ids1) || c != 12 {
		t.Errorf("usage prompt %d completion %d, want %d and 12", p, c, len(ids1))
	}
	answer := m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
	r.waitSynced(t)
	hashes := kvcache.AppendBlockHashes(nil, ids1, r.bs)
	if got := r.idx.Match(r.w, hashes); got != len(hashes) {
		t.Errorf("router matches %d of %d prompt blocks", got, len(hashes))
	}

	ans, _ := json.Marshal(answer)
	msgs2 := msgs1[:len(msgs1)-1] + `,{"role":"assistant","content":` + string(ans) + `},{"role":"user","content":"And why not always?"}]`
	r.requests++
	m = r.ts.postJSON(t, "/v1/chat/completions", `{"max_tokens":4,"messages":`+msgs2+`}`)
	if _, _, cached := usageOf(t, m); cached < (len(ids1)-1)/r.bs*r.bs {
		t.Errorf("second turn cached %d tokens, first turn prompt is %d", cached, len(ids1))
	}
	r.waitSynced(t)
}
