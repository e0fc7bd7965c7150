package tokenizer

import (
	"os"
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
// "cold" disables the word cache, so every word runs through BPE.
func BenchmarkEncode(b *testing.B) {
	text := benchCorpus(b)
	for _, model := range parityModels {
		warm := loadModel(b, model)
		cold, err := LoadOptions(tokenizerDir(b, model), Options{CacheWords: -1})
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
