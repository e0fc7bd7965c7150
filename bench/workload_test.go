package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// pretokenize splits text the way byte-level BPE pre-tokenizers do for plain
// lowercase words: each piece is a run of letters with the space before it.
// BPE merges never cross pieces, so equal leading pieces mean equal leading
// tokens under such a tokenizer.
func pretokenize(s string) []string {
	var out []string
	start := 0
	for i := 1; i <= len(s); i++ {
		if i == len(s) || s[i] == ' ' || s[i] == '\n' || (s[i-1] == '\n' && s[i] != '\n') {
			out = append(out, s[start:i])
			start = i
		}
	}
	return out
}

// sharesTokens reports whether prompt starts with prefix token for token,
// under a bytes tokenizer and under a whitespace-split BPE, and the prefix
// ends on a word boundary of the prompt.
func sharesTokens(prompt, prefix string) bool {
	if !strings.HasPrefix(prompt, prefix) {
		return false
	}
	if len(prompt) > len(prefix) && prompt[len(prefix)] != ' ' && prompt[len(prefix)] != '\n' {
		return false
	}
	a, b := pretokenize(prompt), pretokenize(prefix)
	return len(a) >= len(b) && slices.Equal(a[:len(b)], b)
}

func collect(t *testing.T, w workload, n int) []item {
	t.Helper()
	out := make([]item, 0, n)
	for i := range n {
		it, ok := w.next(i)
		if !ok {
			t.Fatalf("workload ended at %d", i)
		}
		w.build(&it)
		out = append(out, it)
	}
	return out
}

// gen schedules and builds request i alone.
func gen(w workload, i int) item {
	it, _ := w.next(i)
	w.build(&it)
	return it
}

func prompts(items []item) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = renderPrompt(it.messages)
	}
	return out
}

func TestVocabularyIsPlainWords(t *testing.T) {
	seen := map[string]bool{}
	for _, w := range vocabulary {
		if seen[w] {
			t.Fatalf("duplicate word %q", w)
		}
		seen[w] = true
		for _, r := range w {
			if r < 'a' || r > 'z' {
				t.Fatalf("word %q has %q: words must be lowercase ASCII letters", w, r)
			}
		}
	}
	if len(vocabulary) < 256 {
		t.Fatalf("vocabulary has %d words, want at least 256", len(vocabulary))
	}
}

func TestRandomWorkloadDeterministic(t *testing.T) {
	mk := func(seed int64) workload {
		return &randomWorkload{seed: seed, inputLen: 50, outputLen: 10, spread: 0.5}
	}
	a := collect(t, mk(42), 20)
	b := collect(t, mk(42), 20)
	if !slices.Equal(prompts(a), prompts(b)) {
		t.Fatal("same seed gave different prompts")
	}
	for i := range a {
		if a[i].maxTokens != b[i].maxTokens || a[i].words != b[i].words {
			t.Fatalf("request %d: lengths differ for the same seed", i)
		}
		if n := len(strings.Fields(renderPrompt(a[i].messages))); n != a[i].words || n < 25 || n > 75 {
			t.Fatalf("request %d: %d words (recorded %d), want 25..75", i, n, a[i].words)
		}
	}
	// Generated on its own, request 7 is the same as in sequence.
	if it := gen(mk(42), 7); renderPrompt(it.messages) != prompts(a)[7] {
		t.Fatal("a request depends on the requests generated before it")
	}
	c := collect(t, mk(43), 20)
	if slices.Equal(prompts(a), prompts(c)) {
		t.Fatal("different seeds gave the same prompts")
	}
	if len(slices.Compact(slices.Sorted(slices.Values(prompts(a))))) != len(a) {
		t.Fatal("random prompts repeat")
	}
}

func TestSharedPrefixWorkload(t *testing.T) {
	const groups, prefixLen, suffixLen = 5, 64, 16
	mk := func(seed int64) *sharedPrefixWorkload {
		return newSharedPrefixWorkload(seed, groups, prefixLen, suffixLen, 8, 0)
	}
	w := mk(1)
	items := collect(t, w, 200)
	if !slices.Equal(prompts(items), prompts(collect(t, mk(1), 200))) {
		t.Fatal("same seed gave different prompts")
	}
	byGroup := map[int][]string{}
	for i, p := range prompts(items) {
		g, _ := w.group(i)
		prefix := w.prefixes[g]
		if n := len(strings.Fields(prefix)); n != prefixLen {
			t.Fatalf("group %d prefix has %d words, want %d", g, n, prefixLen)
		}
		if !sharesTokens(p, prefix) {
			t.Fatalf("request %d does not start with its group's prefix token for token", i)
		}
		if n := len(strings.Fields(p)); n != prefixLen+suffixLen || items[i].words != n {
			t.Fatalf("request %d has %d words (recorded %d), want %d", i, n, items[i].words, prefixLen+suffixLen)
		}
		byGroup[g] = append(byGroup[g], p)
	}
	if len(byGroup) != groups {
		t.Fatalf("%d groups used, want %d", len(byGroup), groups)
	}
	// Within a group the suffixes differ; across groups the prompts differ
	// from the very first token.
	for g, ps := range byGroup {
		if len(slices.Compact(slices.Sorted(slices.Values(ps)))) != len(ps) {
			t.Fatalf("group %d repeats a prompt", g)
		}
	}
	for g := range groups {
		for h := g + 1; h < groups; h++ {
			if pretokenize(w.prefixes[g])[0] == pretokenize(w.prefixes[h])[0] {
				t.Fatalf("groups %d and %d share their first token", g, h)
			}
		}
	}
	// More groups than words: the leading words still tell groups apart.
	many := newSharedPrefixWorkload(1, 2*len(vocabulary)+5, 8, 0, 8, 0)
	heads := map[string]int{}
	for g, p := range many.prefixes {
		head := strings.Join(strings.Fields(p)[:2], " ")
		if o, ok := heads[head]; ok {
			t.Fatalf("groups %d and %d share their first two words %q", o, g, head)
		}
		heads[head] = g
	}
	if mk(2).prefixes[0] == w.prefixes[0] {
		t.Fatal("different seeds gave the same prefix")
	}
}

func TestMultiTurnWorkload(t *testing.T) {
	const sessions, turns = 3, 4
	mk := func() *multiTurnWorkload {
		return &multiTurnWorkload{seed: 9, sessions: sessions, turns: turns, inputLen: 20, outputLen: 10,
			last: make([]chan struct{}, sessions)}
	}
	items := collect(t, mk(), 2*sessions*turns)
	again := collect(t, mk(), 2*sessions*turns)
	if !slices.Equal(prompts(items), prompts(again)) {
		t.Fatal("same seed gave different conversations")
	}
	for i, it := range items {
		turn := (i / sessions) % turns
		if len(it.messages) != 2*turn+1 {
			t.Fatalf("request %d (turn %d) has %d messages, want %d", i, turn, len(it.messages), 2*turn+1)
		}
		for k, m := range it.messages {
			want := "user"
			if k%2 == 1 {
				want = "assistant"
			}
			if m.role != want {
				t.Fatalf("request %d message %d role %q, want %q", i, k, m.role, want)
			}
		}
		if turn == 0 {
			if it.after != nil {
				t.Fatalf("request %d starts a session but waits on another", i)
			}
			continue
		}
		prev := items[i-sessions]
		// The previous turn's whole prompt is a prefix of this one, token for
		// token, chat messages and the flattened completions prompt alike.
		if !reflect.DeepEqual(it.messages[:len(prev.messages)], prev.messages) {
			t.Fatalf("request %d does not extend its session's previous turn", i)
		}
		if !sharesTokens(renderPrompt(it.messages), renderPrompt(prev.messages)) {
			t.Fatalf("request %d flattened prompt does not extend the previous turn", i)
		}
		if it.after == nil || it.after != (<-chan struct{})(prev.done) {
			t.Fatalf("request %d does not wait for its session's previous turn", i)
		}
	}
	// The second round starts new conversations.
	if prompts(items)[0] == prompts(items)[sessions*turns] {
		t.Fatal("second round repeats the first round's sessions")
	}
}

func TestTraceWorkloadBlocks(t *testing.T) {
	recs, err := LoadTrace(filepath.Join("testdata", "trace_sample.jsonl"), 0)
	if err != nil {
		t.Fatal(err)
	}
	w := &traceWorkload{seed: 3, records: recs, timeScale: 0.5}
	items := collect(t, w, len(recs))
	if _, ok := w.next(len(recs)); ok {
		t.Fatal("trace workload did not end after its records")
	}
	ps := prompts(items)
	for i, it := range items {
		if n := len(strings.Fields(ps[i])); n != recs[i].InputLength || it.words != n {
			t.Fatalf("record %d: %d words, want input_length %d", i, n, recs[i].InputLength)
		}
		if want := max(recs[i].OutputLength, 1); it.maxTokens != want {
			t.Fatalf("record %d: max tokens %d, want %d", i, it.maxTokens, want)
		}
		if want := recs[i].Timestamp * 500_000; int64(it.at) != want {
			t.Fatalf("record %d: at %v, want %v ns", i, it.at, want)
		}
	}
	block := func(p string, k int) string {
		f := strings.Fields(p)
		return strings.Join(f[k*traceBlockTokens:min((k+1)*traceBlockTokens, len(f))], " ")
	}
	// Records 0 and 2 share hash ids 0 and 1: their first 1024 words are the
	// same text; their third blocks (2 vs 5) differ.
	shared := strings.Join(strings.Fields(ps[0])[:2*traceBlockTokens], " ")
	if !sharesTokens(ps[2], shared) {
		t.Fatal("records with equal leading hash ids do not share their leading text")
	}
	if block(ps[0], 2)[:50] == block(ps[2], 2)[:50] {
		t.Fatal("different hash ids gave the same block")
	}
	// Record 3 is block 0 alone; record 6 repeats record 0's blocks, longer.
	if ps[3] != block(ps[0], 0) {
		t.Fatal("hash id 0 is not the same text in every record")
	}
	if !sharesTokens(ps[6], ps[0]) {
		t.Fatal("a cut block is not a prefix of the full block")
	}
	// Hash ids 3, 4 in records 1 and 4.
	if !sharesTokens(ps[4], block(ps[1], 0)+" "+block(ps[1], 1)) {
		t.Fatal("records 1 and 4 do not share blocks 3 and 4")
	}
	// Timestamps off: no arrival times.
	it := gen(&traceWorkload{seed: 3, records: recs}, 1)
	if it.at >= 0 {
		t.Fatalf("time scale 0 gave arrival %v", it.at)
	}
	// Longer than its blocks: padded to input_length.
	pad := &traceWorkload{seed: 3, records: []TraceRecord{{InputLength: 600, OutputLength: 1, HashIDs: []int64{0}}}}
	if it := gen(pad, 0); len(strings.Fields(renderPrompt(it.messages))) != 600 {
		t.Fatal("record longer than its blocks not padded to input_length")
	}
}

// writeMooncakeTrace writes n records in the layout of the Mooncake
// synthetic trace (one JSON object a line, ", " and ": " separators, long
// prompts of 512-token blocks, some sharing a prefix) and returns its path.
func writeMooncakeTrace(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	next := int64(0)
	for i := range n {
		blocks := 3 + i%70
		var ids []string
		for j := range blocks {
			if i%3 == 1 && j < 2 {
				ids = append(ids, strconv.Itoa(j)) // a shared system prompt
				continue
			}
			ids = append(ids, strconv.FormatInt(next, 10))
			next++
		}
		fmt.Fprintf(&b, "{\"timestamp\": %d, \"input_length\": %d, \"output_length\": %d, \"hash_ids\": [%s]}\n",
			i*7, blocks*512-i%300, 1+i%9, strings.Join(ids, ", "))
	}
	path := filepath.Join(t.TempDir(), "mooncake_synthetic_trace.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSharedTraceFixture reads a trace in the Mooncake synthetic layout
// (generated here; the team's shared fixture as well when it is checked
// out next to the repository) and renders prompts of the recorded length.
func TestSharedTraceFixture(t *testing.T) {
	paths := []string{writeMooncakeTrace(t, 60)}
	shared := filepath.Join("..", "..", "shared", "fixtures", "traces", "mooncake_synthetic_trace.jsonl")
	if _, err := os.Stat(shared); err == nil {
		paths = append(paths, shared)
	}
	for _, path := range paths {
		recs, err := LoadTrace(path, 50)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 50 {
			t.Fatalf("limit 50 read %d records", len(recs))
		}
		w := &traceWorkload{seed: 0, records: recs}
		for i := range 5 {
			it := gen(w, i)
			if n := len(strings.Fields(renderPrompt(it.messages))); n != recs[i].InputLength {
				t.Fatalf("%s: record %d: %d words, want %d", path, i, n, recs[i].InputLength)
			}
		}
	}
}
