package router

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/openai"
	"github.com/infera/infera/tokenizer"
)

// benchIndexBlocks is the index population of the pick benchmarks.
const benchIndexBlocks = 1 << 20

// benchFleet is a kv-aware policy over n precise workers whose index holds
// benchIndexBlocks blocks (1Mi / n each, in 64-block chains of random
// tokens), built once per fleet size.
type benchFleet struct {
	p     *KVAware
	r     *Router
	c     *Candidates
	close func()
}

func newBenchFleet(b *testing.B, n int, tok tokenizer.Tokenizer, set ...func(*KVAwareConfig)) *benchFleet {
	b.Helper()
	// No recent-miss charge and no warm share bound: back-to-back picks
	// of one prompt would otherwise (rightly) spread, and every pick
	// should do the same work.
	p, err := NewKVAware(kvConfig(func(c *KVAwareConfig) {
		c.Tokenizer = tok
		c.IndexMaxBlocks = benchIndexBlocks + 1<<16
		c.RecentHalfLife = 0
		c.MaxShareWarm = 0
		for _, f := range set {
			f(c)
		}
	}), zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	r, err := New(DefaultConfig(), p, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]discovery.Record, n)
	for i := range recs {
		recs[i] = kvRecord(i, nil)
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: recs})
	f := &benchFleet{p: p, r: r, c: r.view.Load().models["m"], close: func() { _ = p.Close() }}
	rng := rand.New(rand.NewPCG(1, 2))
	const chain = 64
	tokens := make([]uint32, chain*16)
	engine := make([]uint64, chain)
	var next uint64
	for i, rec := range recs {
		t := (*p.workers[rec.WorkerID].targets.Load())[0]
		h, err := p.idx.Register(t.key, 16)
		if err != nil {
			b.Fatal(err)
		}
		h.SetMode(kvcache.ModePrecise)
		t.idx = h
		for stored := 0; stored < benchIndexBlocks/n; stored += chain {
			for k := range tokens {
				tokens[k] = rng.Uint32N(150000)
			}
			for k := range engine {
				next++
				engine[k] = next
			}
			batch := kvcache.Batch{Events: []kvcache.Event{{Type: kvcache.EventBlockStored, Hashes: engine, Tokens: tokens, BlockSize: 16}}}
			p.idx.Apply(h, &batch)
		}
		_ = i
	}
	if got := p.idx.Len(); got < benchIndexBlocks*9/10 {
		b.Fatalf("index holds %d blocks", got)
	}
	return f
}

// benchText returns English-like text of about words words.
func benchText(words int) string {
	vocab := strings.Fields("the router sends each request to the worker that already caches its prefix so prefill is skipped and time to first token drops without piling every request onto one worker while engines stream events about blocks they store and evict")
	rng := rand.New(rand.NewPCG(3, 4))
	var sb strings.Builder
	for i := range words {
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(vocab[rng.IntN(len(vocab))])
	}
	return sb.String()
}

// BenchmarkKVPick measures one kv-aware Pick+Release over 16 and 64
// precise workers with 1Mi blocks indexed, for 2k/8k/32k-token prompts:
// "tokens" is a completions request with a token-array prompt (no
// tokenization), "bytes" a chat request tokenized by the bytes tokenizer,
// "qwen3" a chat request rendered with Qwen3's template and encoded by its
// BPE (when testdata/tokenizers/qwen3 is present). Half of every prompt is
// cached on one worker. Reports p50/p99 per pick besides ns/op.
func BenchmarkKVPick(b *testing.B) {
	type tokMode struct {
		name string
		tok  tokenizer.Tokenizer
	}
	modes := []tokMode{{"tokens", nil}, {"bytes", tokenizer.Bytes{}}}
	if dir := filepath.Join("..", "testdata", "tokenizers", "qwen3"); fileExists(filepath.Join(dir, "tokenizer.json")) {
		hf, err := tokenizer.Load(dir)
		if err != nil {
			b.Fatal(err)
		}
		modes = append(modes, tokMode{"qwen3", hf})
	}
	for _, workers := range []int{16, 64} {
		for _, mode := range modes {
			f := newBenchFleet(b, workers, mode.tok)
			for _, size := range []int{2048, 8192, 32768} {
				name := "workers=" + strconv.Itoa(workers) + "/tok=" + mode.name + "/prompt=" + strconv.Itoa(size/1024) + "k"
				b.Run(name, func(b *testing.B) { benchPick(b, f, mode.tok, size) })
			}
			f.close()
		}
	}
}

// BenchmarkKVPickFleet512 is issue 37's scale point: 512 precise workers
// (1Mi blocks indexed, 2048 per worker), 32k-token prompts as token arrays,
// under both cost modes. It reports the pick's p99 and, for the first fleet
// built, the heap the fleet's policy state and index take per worker.
func BenchmarkKVPickFleet512(b *testing.B) {
	const workers = 512
	for i, cost := range []string{KVCostBlocks, KVCostTTFT} {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f := newBenchFleet(b, workers, nil, func(c *KVAwareConfig) { c.Cost = cost })
		runtime.GC()
		runtime.ReadMemStats(&after)
		perWorker := float64(after.HeapAlloc-min(after.HeapAlloc, before.HeapAlloc)) / workers
		b.Run("cost="+cost+"/prompt=32k", func(b *testing.B) {
			benchPick(b, f, nil, 32768)
			if i == 0 {
				// The first fleet only: the router of an earlier one
				// stays reachable (its background goroutines), so later
				// deltas would net out its release.
				b.ReportMetric(perWorker, "heap-B/worker")
			}
		})
		f.close()
	}
}

func benchPick(b *testing.B, f *benchFleet, tok tokenizer.Tokenizer, size int) {
	var body string
	var tokens []uint32
	switch tok.(type) {
	case nil:
		rng := rand.New(rand.NewPCG(5, 6))
		tokens = make([]uint32, size)
		var sb strings.Builder
		sb.WriteString(`{"model":"m","prompt":[`)
		for i := range tokens {
			tokens[i] = rng.Uint32N(150000)
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(strconv.FormatUint(uint64(tokens[i]), 10))
		}
		sb.WriteString(`]}`)
		body = sb.String()
	case tokenizer.Bytes:
		content := benchText(size / 4)[:size-60]
		body = `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + content + `"}]}`
		s, _ := tok.RenderChat([]byte(body[strings.Index(body, "[") : len(body)-1]))
		tokens = tok.AppendEncode(nil, s)
	default:
		// English words are ~1.3 tokens each in Qwen3's vocabulary;
		// calibrate to the target size.
		words := size
		for {
			content := benchText(words)
			body = `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + content + `"}]}`
			s, err := tok.RenderChat([]byte(body[strings.Index(body, "[") : len(body)-1]))
			if err != nil {
				b.Fatal(err)
			}
			tokens = tok.AppendEncode(nil, s)
			if len(tokens) <= size {
				break
			}
			words = words * size / len(tokens)
		}
	}
	// Half the prompt is cached on worker 3.
	h := (*f.p.workers[kvRecord(3, nil).WorkerID].targets.Load())[0].idx
	half := tokens[:len(tokens)/2/16*16]
	engine := make([]uint64, len(half)/16)
	for i := range engine {
		engine[i] = uint64(1<<40 + i + size<<20)
	}
	f.p.idx.Apply(h, &kvcache.Batch{Events: []kvcache.Event{{Type: kvcache.EventBlockStored, Hashes: engine, Tokens: half, BlockSize: 16}}})

	var req openai.Request
	raw := []byte(body)
	if err := openai.Scan(raw, &req); err != nil {
		b.Fatal(err)
	}
	rt := RouteCompletions
	if !req.Messages.Empty() {
		rt = RouteChatCompletions
	}
	in := &PickInput{Route: rt, Body: raw, Request: &req}
	holder := kvRecord(3, nil).WorkerID
	lat := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		tk, err := f.p.Pick(in, f.c)
		if err != nil {
			b.Fatal(err)
		}
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(start))
		}
		if tk.Worker.id != holder {
			b.Fatalf("picked %s, not the holder of half the prompt", tk.Worker.id)
		}
		f.p.Release(tk, Result{})
	}
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
	}
	b.ReportMetric(float64(len(tokens)), "tokens")
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
