package sim

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/jsonx"
)

// recorder is a cacheObserver that logs events.
type recorder struct {
	stored, removed []uint64
	cleared         int
}

func (r *recorder) blockStored(h, _ uint64, tokens []uint32) { r.stored = append(r.stored, h) }
func (r *recorder) blockRemoved(h uint64)                    { r.removed = append(r.removed, h) }
func (r *recorder) allCleared()                              { r.cleared++ }

func TestPrefixCacheLRU(t *testing.T) {
	rec := &recorder{}
	c := newPrefixCache(4, 2, rec)
	tok := []uint32{1, 2}
	// Sequence A holds blocks with hashes 10, 11; B holds 20.
	a := []int32{c.allocate(), c.allocate()}
	c.commit(a[0], 10, rootHash, tok)
	c.commit(a[1], 11, 10, tok)
	b := []int32{c.allocate()}
	c.commit(b[0], 20, rootHash, tok)
	if c.usage() != 0.75 {
		t.Fatalf("usage %v", c.usage())
	}
	c.release(a) // free queue: [unused, 11, 10]
	c.release(b) // free queue: [unused, 11, 10, 20]
	if c.usage() != 0 {
		t.Fatalf("usage after release %v", c.usage())
	}
	// Hitting 10 takes it off the free queue: it cannot be evicted.
	id, ok := c.lookup(10)
	if !ok {
		t.Fatal("10 not cached")
	}
	c.acquire(id)
	var got []int32
	for range 3 {
		got = append(got, c.allocate())
	}
	// unused block first, then a's tail (11) before b (20); 10 is held.
	if !slices.Equal(rec.removed, []uint64{11, 20}) {
		t.Errorf("evicted %v, want [11 20]", rec.removed)
	}
	if _, ok := c.lookup(10); !ok {
		t.Error("referenced block evicted")
	}
	if c.freeLen != 0 || slices.Contains(got, id) {
		t.Errorf("free %d, allocated %v (held %d)", c.freeLen, got, id)
	}
	// Duplicate content stays anonymous and is reused first.
	c.release([]int32{got[0]})
	c.commit(got[1], 10, rootHash, tok) // 10 is already cached in id
	if len(rec.stored) != 3 {
		t.Errorf("duplicate commit stored: %v", rec.stored)
	}
	c.reset()
	if rec.cleared != 1 || len(c.index) != 0 {
		t.Errorf("reset: cleared %d, index %d", rec.cleared, len(c.index))
	}
}

// testSeq builds a prepared sequence of prompt tokens and maxTokens outputs.
func testSeq(prompt string, maxTokens, blockSize int) *seq {
	q := getSeq()
	q.tokens = TokenizeBytes(q.tokens[:0], []byte(prompt))
	q.promptLen, q.maxTokens = len(q.tokens), maxTokens
	prepareSeq(q, blockSize, 1, nil, nil, span{})
	return q
}

// runToFirstToken admits q alone and returns the simulated time until its
// first token.
func runToFirstToken(t *testing.T, sc *scheduler, q *seq) time.Duration {
	t.Helper()
	sc.handle(msg{q: q})
	var total time.Duration
	for q.generated.Load() == 0 {
		sc.admit()
		d, busy := sc.plan()
		if !busy {
			t.Fatal("nothing to run")
		}
		total += d
		sc.apply()
	}
	return total
}

func drainAll(sc *scheduler) {
	for len(sc.running) > 0 || sc.numWaiting() > 0 {
		sc.admit()
		sc.plan()
		sc.apply()
	}
}

func TestTimingModel(t *testing.T) {
	tm := timing{overhead: 1000, perPrefill: 10, perDecodeSeq: 100}
	sc := newScheduler(newPrefixCache(1024, 16, nil), 64, 512, tm, false, nil)
	prompt := string(make([]byte, 1000))

	// Cold: 1000 tokens in chunks of 512 → two steps.
	cold := runToFirstToken(t, sc, testSeq(prompt, 3, 16))
	if want := time.Duration(2*1000 + 1000*10); cold != want {
		t.Errorf("cold TTFT %v, want %v", cold, want)
	}
	drainAll(sc)
	// Warm: 992 tokens cached, 8 to compute in one step.
	q := testSeq(prompt, 3, 16)
	warm := runToFirstToken(t, sc, q)
	if want := time.Duration(1000 + 8*10); warm != want || q.cached.Load() != 992 {
		t.Errorf("warm TTFT %v (cached %d), want %v", warm, q.cached.Load(), want)
	}
	drainAll(sc)

	// Load: ten sequences decoding make every step, and so the next
	// prefill's first token, slower.
	for i := range 10 {
		sc.handle(msg{q: testSeq(string(rune('a'+i))+"x", 100, 16)})
	}
	sc.admit()
	sc.plan()
	sc.apply() // all ten prefilled, now decoding
	loaded := runToFirstToken(t, sc, testSeq(prompt, 3, 16))
	if loaded <= warm || loaded < time.Duration(10*100) {
		t.Errorf("TTFT under load %v not above idle %v", loaded, warm)
	}
	drainAll(sc)
	if sc.cache.usage() != 0 || sc.reserved != 0 || len(sc.running) != 0 {
		t.Errorf("leak: usage %v reserved %d running %d", sc.cache.usage(), sc.reserved, len(sc.running))
	}
}

func TestSchedulerWaitsForBlocks(t *testing.T) {
	// 4 blocks of 4 tokens; each sequence needs 3 → the second waits
	// until the first finishes.
	sc := newScheduler(newPrefixCache(4, 4, nil), 8, 64, timing{}, false, nil)
	a, b := testSeq("aaaaaaaa", 3, 4), testSeq("bbbbbbbb", 3, 4)
	sc.handle(msg{q: a})
	sc.handle(msg{q: b})
	sc.admit()
	if len(sc.running) != 1 || sc.numWaiting() != 1 {
		t.Fatalf("running %d waiting %d", len(sc.running), sc.numWaiting())
	}
	// Abort the waiting one: it leaves the queue.
	sc.handle(msg{q: b, abort: true})
	if sc.numWaiting() != 0 {
		t.Fatalf("aborted sequence still waiting")
	}
	drainAll(sc)
	if a.done.Load() != seqFinished || a.generated.Load() != 3 {
		t.Errorf("a: done %d generated %d", a.done.Load(), a.generated.Load())
	}
}

func TestParseRequest(t *testing.T) {
	body := []byte(`{"model":"m\u0031","stream":true,"stream_options":{"include_usage":true,"x":[1,{"y":null}]},
		"max_tokens":null,"max_completion_tokens":12,"temperature":0.5e-3,"messages":[{"role":"user","content":"hi"}],"n":1}`)
	var r request
	if err := parseRequest(body, &r); err != nil {
		t.Fatal(err)
	}
	if !r.stream || !r.includeUsage || r.maxTokens != -1 || r.maxCompl != 12 || !r.hasModel || !r.modelEsc || r.messages.empty() {
		t.Errorf("parsed %+v", r)
	}
	if got := string(jsonx.AppendUnescaped(nil, body[r.model.start:r.model.end])); got != "m1" {
		t.Errorf("model %q", got)
	}
	for _, bad := range []string{``, `{`, `{"a":}`, `{"a":1,}`, `{"a":"\x"}`, `{"a":01}`, `{"a":1} x`, `{"a":tru}`, `{"a":"` + "\x01" + `"}`,
		`{"stream":"yes"}`, `{"max_tokens":1.5}`, `{"max_tokens":99999999999999999999}`, `{"messages":{}}`,
		`{"a":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + "}"} {
		if err := parseRequest([]byte(bad), &r); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestParseRequestAllocs(t *testing.T) {
	body := []byte(`{"model":"sim-model","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hello there"}]}`)
	var r request
	allocs := testing.AllocsPerRun(100, func() {
		if err := parseRequest(body, &r); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("parseRequest allocates %v times", allocs)
	}
}

func TestRenderChatEscapes(t *testing.T) {
	body := []byte(`{"messages":[{"content":"a\"\n\ud83d\ude00\u00e9","role":"user"},{"role":"assistant","content":null}]}`)
	var r request
	if err := parseRequest(body, &r); err != nil {
		t.Fatal(err)
	}
	text, err := renderChat(nil, body, r.messages, true)
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>user\na\"\n😀é<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n"
	if string(text) != want {
		t.Errorf("rendered %q, want %q", text, want)
	}
}
