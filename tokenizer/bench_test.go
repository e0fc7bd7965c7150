package tokenizer

import (
	"math/rand/v2"
	"os"
	"strings"
	"testing"
)

func benchCorpus(b *testing.B) string {
	b.Helper()
	raw, err := os.ReadFile("testdata/bench-corpus.txt")
	if err != nil {
		b.Fatal(err)
	}
	return string(raw)
}

// BenchmarkEncode measures encoding the mixed corpus in testdata (the same
// file scripts/tokenizer-bench.mjs feeds transformers.js) on one core.
// "cold" disables the word cache, so every word runs through BPE; neither
// uses the segment cache.
func BenchmarkEncode(b *testing.B) {
	text := benchCorpus(b)
	for _, model := range parityModels {
		// The segment cache is off in both: the corpus is one segment,
		// and a hit would measure a hash, not BPE.
		warm, err := LoadOptions(tokenizerDir(b, model), Options{CacheSegmentTokens: -1})
		if err != nil {
			b.Fatal(err)
		}
		cold, err := LoadOptions(tokenizerDir(b, model), Options{CacheWords: -1, CacheSegmentTokens: -1})
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range []struct {
			name string
			tk   *HF
		}{{"warm", warm}, {"cold", cold}} {
			b.Run(model+"/"+c.name, func(b *testing.B) {
				dst := c.tk.AppendEncode(nil, text)
				b.ReportAllocs()
				b.SetBytes(int64(len(text)))
				for b.Loop() {
					dst = c.tk.AppendEncode(dst[:0], text)
				}
				b.ReportMetric(float64(len(dst)), "tokens/op")
			})
		}
	}
}

// BenchmarkEncodeParallel shows that concurrent callers scale (the word cache
// is sharded, scratch memory pooled).
func BenchmarkEncodeParallel(b *testing.B) {
	text := benchCorpus(b)
	tk := loadModel(b, "qwen3")
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	b.RunParallel(func(pb *testing.PB) {
		var dst []uint32
		for pb.Next() {
			dst = tk.AppendEncode(dst[:0], text)
		}
	})
}

func BenchmarkRenderChat(b *testing.B) {
	tk := loadModel(b, "qwen3")
	msgs := []byte(`[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is KV-aware routing?"},{"role":"assistant","content":"It routes to the worker that caches the prefix."},{"role":"user","content":"Explain prefill vs decode."}]`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tk.RenderChat(msgs); err != nil {
			b.Fatal(err)
		}
	}
}

// chat32k is a 16-message chat of about 32k Qwen3 tokens, the shape of
// router's BenchmarkKVPickChat: a short system prompt and 15 turns of about
// 1950 words (the last one a quarter of that), tag at the start of each.
func chat32k(tag string) []byte {
	vocab := strings.Fields("the router sends each request to the worker that already caches its prefix so prefill is skipped and time to first token drops without piling every request onto one worker while engines stream events about blocks they store and evict")
	rng := rand.New(rand.NewPCG(3, 4))
	const msgs, words = 15, 1950
	var sb strings.Builder
	sb.WriteString(`[{"role":"system","content":"be brief"}`)
	for i := range msgs + 1 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		sb.WriteString(`,{"role":"` + role + `","content":"` + tag)
		n := words
		if i == msgs {
			n = words / 4
		}
		for range n {
			sb.WriteString(" " + vocab[rng.IntN(len(vocab))])
		}
		sb.WriteString(`"}`)
	}
	sb.WriteString(`]`)
	return []byte(sb.String())
}

// BenchmarkChat32k splits the tokenization of a ~32k-token chat into its
// steps: rendering by the template engine and by the compiled Qwen3
// template, encoding with the segment cache off (every message new) and
// warm (every message seen).
func BenchmarkChat32k(b *testing.B) {
	tk := loadModel(b, "qwen3")
	noSegs, err := LoadOptions(tokenizerDir(b, "qwen3"), Options{CacheSegmentTokens: -1})
	if err != nil {
		b.Fatal(err)
	}
	c := Chat{Messages: chat32k("x")}
	text, err := tk.RenderChatRequest(c)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("render-template", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			if _, err := tk.chat.renderTemplate(c); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("render-compiled", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(text)))
		var dst []byte
		for b.Loop() {
			if dst, err = tk.AppendRenderChat(dst[:0], c); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, e := range []struct {
		name string
		tk   *HF
	}{{"encode-new", noSegs}, {"encode-seen", tk}} {
		b.Run(e.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			dst := e.tk.AppendEncode(nil, text)
			for b.Loop() {
				dst = e.tk.AppendEncode(dst[:0], text)
			}
			b.ReportMetric(float64(len(dst)), "tokens/op")
		})
	}
}
