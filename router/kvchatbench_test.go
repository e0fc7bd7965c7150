package router

import (
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/infera/infera/openai"
	"github.com/infera/infera/tokenizer"
)

// BenchmarkKVPickChat measures the kv-aware pick of a 16-message, ~32k-token
// chat with Qwen3's tokenizer (template render + BPE + index lookup) over 16
// precise workers with 1Mi blocks indexed: "first-sight" sends a
// conversation never seen before on every pick (every message new), and
// "last-turn-new" the same 15 earlier messages with a new last user turn, as
// a multi-turn client does — only that turn should be tokenized. Reports
// p50/p99 of Pick alone (the body is built and scanned outside the clock),
// in wall time and in the thread's CPU time (cpu-p50-µs: what a quiet
// machine's wall p50 comes to, on a loaded one).
func BenchmarkKVPickChat(b *testing.B) {
	dir := filepath.Join("..", "testdata", "tokenizers", "qwen3")
	if !fileExists(filepath.Join(dir, "tokenizer.json")) {
		b.Skip("testdata/tokenizers/qwen3 missing (make tokenizers)")
	}
	hf, err := tokenizer.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	f := newBenchFleet(b, 16, hf)
	defer f.close()
	// ~2k words per message ≈ 2.6k tokens; 12 such messages + a short
	// system prompt ≈ 32k tokens.
	const msgs, words = 15, 1950
	text := benchText(msgs * words)
	fields := strings.Fields(text)
	bodies := make([]string, msgs+1)
	for i := range bodies {
		lo, hi := (i%msgs)*words, (i%msgs+1)*words
		if i == msgs {
			hi = lo + words/4 // a shorter new turn
		}
		bodies[i] = strings.Join(fields[lo:hi], " ")
	}
	// build appends the request to buf (reused: the loop's allocations are
	// Pick's own).
	build := func(buf []byte, id string, lastID string) []byte {
		buf = append(buf[:0], `{"model":"m","messages":[{"role":"system","content":"be brief"}`...)
		for i := range msgs + 1 {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			tag := id
			if i == msgs {
				tag = lastID
			}
			buf = append(buf, `,{"role":"`...)
			buf = append(buf, role...)
			buf = append(buf, `","content":"`...)
			buf = append(buf, tag...)
			buf = append(buf, ' ')
			buf = append(buf, bodies[i]...)
			buf = append(buf, `"}`...)
		}
		return append(buf, `]}`...)
	}
	for _, mode := range []string{"first-sight", "last-turn-new"} {
		b.Run(mode, func(b *testing.B) {
			var tokens int
			lat := make([]time.Duration, 0, 1<<16)
			cpu := make([]time.Duration, 0, 1<<16)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var req openai.Request
			var in PickInput
			var raw, conv, turn []byte
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				n++
				conv = append(conv[:0], "conversation-"...)
				if mode == "first-sight" {
					conv = strconv.AppendInt(conv, int64(n), 10)
				} else {
					conv = append(conv, '0')
				}
				turn = strconv.AppendInt(append(turn[:0], "turn-"...), int64(n), 10)
				raw = build(raw, bytesString(conv), bytesString(turn))
				req = openai.Request{}
				if err := openai.Scan(raw, &req); err != nil {
					b.Fatal(err)
				}
				in = PickInput{Route: RouteChatCompletions, Body: raw, Request: &req}
				cpu0 := threadCPU()
				start := time.Now()
				tk, err := f.p.Pick(&in, f.c)
				if err != nil {
					b.Fatal(err)
				}
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(start))
					cpu = append(cpu, threadCPU()-cpu0)
				}
				f.p.Release(tk, Result{})
				if tokens == 0 {
					body := string(raw) // once
					text, err := hf.RenderChat([]byte(body[strings.Index(body, "[") : len(body)-1]))
					if err != nil {
						b.Fatal(err)
					}
					tokens = len(hf.Encode(text))
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			slices.Sort(cpu)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
				b.ReportMetric(float64(cpu[len(cpu)/2].Nanoseconds())/1e3, "cpu-p50-µs")
			}
			b.ReportMetric(float64(tokens), "tokens")
		})
	}
}

// threadCPU is the calling thread's CPU time (the goroutine must be locked
// to its thread).
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
