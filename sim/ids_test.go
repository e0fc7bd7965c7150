package sim

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/tokenizer"
)

// byteIDs are text's bytes-tokenizer ids.
func byteIDs(text string) []uint32 { return TokenizeBytes(nil, []byte(text)) }

// TestGeneratedTextContinuesExactly: the text generated from prompt + the
// first j output bytes is the rest of the text generated from the prompt,
// for every j, whatever the prompt's tail (chat template, inside a word,
// not a word, empty).
func TestGeneratedTextContinuesExactly(t *testing.T) {
	prompts := []string{
		"<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
		"The router picks the mod",
		"zzzz",
		"",
		"ends with a space ",
	}
	for _, seed := range []uint64{0, 7, choiceSeed(7, 3)} {
		for _, p := range prompts {
			full := appendGenerated(nil, seed, byteIDs(p), 120)
			if len(full) != 120 {
				t.Fatalf("%q: %d bytes, want 120", p, len(full))
			}
			for j := range len(full) {
				ctx := byteIDs(p + string(full[:j]))
				rest := appendGenerated(nil, seed, ctx, len(full)-j)
				if string(rest) != string(full[j:]) {
					t.Fatalf("seed %d prompt %q cut at %d: continued %q, unbroken %q", seed, p, j, rest, full[j:])
				}
			}
		}
	}
	chat := appendGenerated(nil, 1, byteIDs(prompts[0]), 60)
	for _, w := range strings.Fields(string(chat[:strings.LastIndexByte(string(chat), ' ')])) {
		if !slices.Contains(words[:], w) {
			t.Fatalf("answer %q has %q, not a word of the list", chat, w)
		}
	}
}

// TestHFGeneratedContinuesExactly: the same for model tokens.
func TestHFGeneratedContinuesExactly(t *testing.T) {
	for name, tok := range map[string]func(*testing.T) tokenizer.Tokenizer{
		"toy": func(t *testing.T) tokenizer.Tokenizer {
			tok, err := tokenizer.Open(toyTokenizerDir(t))
			if err != nil {
				t.Fatal(err)
			}
			return tok
		},
		"qwen3": qwen3,
	} {
		t.Run(name, func(t *testing.T) {
			c, err := newHFCodec(tok(t).(*tokenizer.HF))
			if err != nil {
				t.Fatal(err)
			}
			if len(c.pieces) < 2 {
				t.Fatalf("%d single-token words", len(c.pieces))
			}
			prompt := c.encode(nil, []byte("Why do prefix caches help routers?"))
			_, all, _ := c.generate(nil, slices.Clone(prompt), nil, 5, 40)
			out := all[len(prompt):]
			for j := range len(out) {
				_, cont, _ := c.generate(nil, slices.Clone(all[:len(prompt)+j]), nil, 5, len(out)-j)
				if !slices.Equal(cont[len(prompt)+j:], out[j:]) {
					t.Fatalf("cut at %d: continued %v, unbroken %v", j, cont[len(prompt)+j:], out[j:])
				}
			}
		})
	}
}

// idsChunk is what a continuing router reads from a chunk.
type idsChunk struct {
	PromptTokenIDs []uint32 `json:"prompt_token_ids"`
	Choices        []struct {
		Text           string
		Delta          struct{ Content string }
		TokenIDs       []uint32 `json:"token_ids"`
		PromptTokenIDs []uint32 `json:"prompt_token_ids"`
		FinishReason   *string  `json:"finish_reason"`
	}
	SGLExt *struct {
		PromptTokenIDs     []uint32   `json:"prompt_token_ids"`
		CompletionTokenIDs [][]uint32 `json:"completion_token_ids"`
	} `json:"sglext"`
}

// streamIDs streams body and gathers the text, the prompt's ids and the
// output ids the chunks carry.
func streamIDs(t *testing.T, ts *testSim, path, body string) (text string, prompt, out []uint32, finish string) {
	t.Helper()
	resp := ts.stream(t, t.Context(), path, body)
	events, err := readAllEvents(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream ends with %q", events[len(events)-1])
	}
	var sb strings.Builder
	for _, ev := range events[:len(events)-1] {
		var c idsChunk
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("%s: %v", ev, err)
		}
		prompt = append(prompt, c.PromptTokenIDs...)
		if c.SGLExt != nil {
			prompt = append(prompt, c.SGLExt.PromptTokenIDs...)
			for _, ids := range c.SGLExt.CompletionTokenIDs {
				out = append(out, ids...)
			}
		}
		for _, ch := range c.Choices {
			sb.WriteString(ch.Text + ch.Delta.Content)
			prompt = append(prompt, ch.PromptTokenIDs...)
			out = append(out, ch.TokenIDs...)
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return sb.String(), prompt, out, finish
}

// TestReturnTokenIDsContinuation: a vLLM-flavoured sim streams the prompt's
// and the output's ids when asked; a completion on prompt ids + the first j
// output ids (what a router sends another worker when the stream breaks
// after j tokens) returns exactly the rest of the text, and the ids match
// the text.
func TestReturnTokenIDsContinuation(t *testing.T) {
	ts := startSim(t, nil)
	const n = 24
	msg := "Tell me about prefix caches."
	text, prompt, out, finish := streamIDs(t, ts, "/v1/chat/completions",
		chatBody(t, map[string]any{"max_tokens": n, "stream": true, "return_token_ids": true}, msg))
	wantPrompt := byteIDs("<|im_start|>user\n" + msg + "<|im_end|>\n<|im_start|>assistant\n")
	if !slices.Equal(prompt, wantPrompt) || !slices.Equal(out, byteIDs(text)) || len(out) != n || finish != "length" {
		t.Fatalf("text %q finish %q prompt ids %v (want %v), output ids %v", text, finish, prompt, wantPrompt, out)
	}
	plain, _, noIDs, _ := streamIDs(t, ts, "/v1/chat/completions", chatBody(t, map[string]any{"max_tokens": n, "stream": true}, msg))
	if plain != text || len(noIDs) != 0 {
		t.Fatalf("without return_token_ids: %q with %d ids, want %q and none", plain, len(noIDs), text)
	}
	for _, j := range []int{1, 5, 11, n - 1} {
		ctx := append(slices.Clone(prompt), out[:j]...)
		m := ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": n - j, "return_token_ids": true}, ctx))
		ch := m["choices"].([]any)[0].(map[string]any)
		if got := ch["text"].(string); got != text[j:] {
			t.Fatalf("continued after %d tokens: %q, want %q", j, got, text[j:])
		}
		if got := jsonIDs(t, ch, "token_ids"); !slices.Equal(got, out[j:]) {
			t.Fatalf("continued ids %v, want %v", got, out[j:])
		}
		if got := jsonIDs(t, ch, "prompt_token_ids"); !slices.Equal(got, ctx) {
			t.Fatalf("continued prompt ids %v, want %v", got, ctx)
		}
	}
	// Streamed completions carry the prompt's ids in the first chunk's choice.
	ctext, cprompt, cout, _ := streamIDs(t, ts, "/v1/completions",
		complBody(t, map[string]any{"max_tokens": 6, "stream": true, "return_token_ids": true}, prompt))
	if ctext != text[:6] || !slices.Equal(cprompt, prompt) || !slices.Equal(cout, out[:6]) {
		t.Fatalf("completions stream %q prompt %v ids %v", ctext, cprompt, cout)
	}
	// Unary chat: top-level prompt ids, the choice's output ids.
	m := ts.postJSON(t, "/v1/chat/completions", chatBody(t, map[string]any{"max_tokens": n, "return_token_ids": true}, msg))
	if !slices.Equal(jsonIDs(t, m, "prompt_token_ids"), prompt) || !slices.Equal(jsonIDs(t, m["choices"].([]any)[0].(map[string]any), "token_ids"), out) {
		t.Fatalf("unary chat ids: %v", m)
	}
}

// TestReturnTokenIDsSGLang: SGLang's shape (sglext) on completions, and
// its refusal on streaming chat.
func TestReturnTokenIDsSGLang(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) { c.Flavor = config.FlavorSGLang })
	code, body := ts.post(t, "/v1/chat/completions", chatBody(t, map[string]any{"max_tokens": 4, "stream": true, "return_token_ids": true}, "hi"))
	if code != http.StatusBadRequest {
		t.Fatalf("streaming chat with return_token_ids: %d %s, want 400", code, body)
	}
	prompt := byteIDs("Continue this: the model")
	text, gotPrompt, out, _ := streamIDs(t, ts, "/v1/completions",
		complBody(t, map[string]any{"max_tokens": 10, "stream": true, "return_token_ids": true}, prompt))
	if !slices.Equal(gotPrompt, prompt) || !slices.Equal(out, byteIDs(text)) || len(out) != 10 {
		t.Fatalf("text %q prompt %v ids %v", text, gotPrompt, out)
	}
	m := ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 10, "return_token_ids": true, "n": 2}, prompt))
	ext := m["sglext"].(map[string]any)
	per := ext["completion_token_ids"].([]any)
	if !slices.Equal(jsonIDs(t, ext, "prompt_token_ids"), prompt) || len(per) != 2 {
		t.Fatalf("unary sglext %v", ext)
	}
	if first := jsonIDs(t, map[string]any{"ids": per[0]}, "ids"); !slices.Equal(first, out) {
		t.Fatalf("choice 0 ids %v, streamed %v", first, out)
	}
}
