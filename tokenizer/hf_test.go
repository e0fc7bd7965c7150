package tokenizer

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// toyMerges build "he", "ll", "hell", "hello", "Ġw", "aa", "aaaa" on top of
// the 256 byte tokens (id = byte value).
var toyMerges = [][2]string{{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"a", "a"}, {"aa", "aa"}}

const (
	idHe = 256 + iota
	idLl
	idHell
	idHello
	idSpaceW
	idAA
	idAAAA
	idHel // in the vocab but reachable only through ignore_merges
)

func toyVocab() map[string]uint32 {
	v := map[string]uint32{}
	for b := range 256 {
		v[string(byteToRune[b])] = uint32(b)
	}
	for i, m := range toyMerges {
		v[m[0]+m[1]] = uint32(256 + i)
	}
	v["hel"] = idHel
	return v
}

// toyTokenizer returns a tokenizer.json; edit tweaks the decoded document.
func toyTokenizer(t *testing.T, edit func(doc map[string]any)) []byte {
	t.Helper()
	merges := make([]string, len(toyMerges))
	for i, m := range toyMerges {
		merges[i] = m[0] + " " + m[1]
	}
	doc := map[string]any{
		"version":      "1.0",
		"normalizer":   nil,
		"added_tokens": []any{},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patLlama3}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": toyVocab(), "merges": merges, "ignore_merges": false},
	}
	if edit != nil {
		edit(doc)
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func parseToy(t *testing.T, edit func(doc map[string]any)) *HF {
	t.Helper()
	tk, err := parseTokenizer(toyTokenizer(t, edit), Options{})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func model(doc map[string]any) map[string]any { return doc["model"].(map[string]any) }

func TestToyBPE(t *testing.T) {
	pairs := func(doc map[string]any) {
		var ms [][]string
		for _, m := range toyMerges {
			ms = append(ms, []string{m[0], m[1]})
		}
		model(doc)["merges"] = ms
	}
	ignore := func(doc map[string]any) { model(doc)["ignore_merges"] = true }
	long := make([]uint32, 25)
	for i := range long {
		long[i] = idAAAA
	}
	longText := ""
	for range 100 {
		longText += "a"
	}
	cases := []struct {
		name string
		edit func(map[string]any)
		text string
		want []uint32
	}{
		{"merges", nil, "hello", []uint32{idHello}},
		{"space prefix", nil, "hello world", []uint32{idHello, idSpaceW, 'o', 'r', 'l', 'd'}},
		{"leftmost first among equal ranks", nil, "aaa", []uint32{idAA, 'a'}},
		{"chained", nil, "aaaaa", []uint32{idAAAA, 'a'}},
		{"long word through the heap", nil, longText, long},
		{"pair merges", pairs, "hello aaa", []uint32{idHello, ' ', idAA, 'a'}},
		{"no ignore_merges", nil, "hel", []uint32{idHe, 'l'}},
		{"ignore_merges", ignore, "hel", []uint32{idHel}},
		{"ignore_merges falls back to merges", ignore, "hello", []uint32{idHello}},
		{"raw bytes", nil, "\x00\xff", []uint32{0, 0xff}},
		{"empty", nil, "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tk := parseToy(t, c.edit)
			got := tk.Encode(c.text)
			if !slices.Equal(got, c.want) && len(got)+len(c.want) > 0 {
				t.Fatalf("got %v want %v", got, c.want)
			}
			dec, err := tk.Decode(got)
			if err != nil || dec != c.text {
				t.Fatalf("decode %q, %v; want %q", dec, err, c.text)
			}
		})
	}
}

// TestMergeHeapMatchesScan checks the two merge algorithms against each other
// on random words with a real model's merges.
func TestMergeHeapMatchesScan(t *testing.T) {
	tk := loadModel(t, "qwen3")
	r := rand.New(rand.NewPCG(1, 1))
	alphabet := []byte("aaabbbeeinnorsttt  \n.,'0123456789éü中")
	var sc scratch
	for range 2000 {
		n := 2 + r.IntN(120)
		word := make([]byte, n)
		for i := range word {
			word[i] = alphabet[r.IntN(len(alphabet))]
		}
		syms := make([]uint32, n)
		for i, b := range word {
			syms[i] = tk.model.byteIDs[b]
		}
		viaHeap := slices.Clone(tk.model.mergeHeap(slices.Clone(syms), &sc))
		// The scan form is used for words up to smallWord; run it on any
		// length here.
		viaScan := mergeScanForTest(&tk.model, slices.Clone(syms))
		if !slices.Equal(viaHeap, viaScan) {
			t.Fatalf("word %q: heap %v scan %v", word, viaHeap, viaScan)
		}
	}
}

func mergeScanForTest(m *bpe, syms []uint32) []uint32 {
	for len(syms) > 1 {
		best, bestRank, bestID := -1, ^uint32(0), uint32(0)
		for i := 0; i+1 < len(syms); i++ {
			if r, id, ok := m.merges.get(syms[i], syms[i+1]); ok && r < bestRank {
				best, bestRank, bestID = i, r, id
			}
		}
		if best < 0 {
			break
		}
		syms[best] = bestID
		syms = append(syms[:best+1], syms[best+2:]...)
	}
	return syms
}

func TestApplyBehavior(t *testing.T) {
	const s = "the-final--countdown"
	matches := literalMatcher("-").appendMatches(s, nil, nil)
	cases := []struct {
		b      splitBehavior
		invert bool
		want   []string
	}{
		{behaviorRemoved, false, []string{"the", "final", "countdown"}},
		{behaviorIsolated, false, []string{"the", "-", "final", "-", "-", "countdown"}},
		{behaviorMergedWithPrevious, false, []string{"the-", "final-", "-", "countdown"}},
		{behaviorMergedWithNext, false, []string{"the", "-final", "-", "-countdown"}},
		{behaviorContiguous, false, []string{"the", "-", "final", "--", "countdown"}},
		{behaviorRemoved, true, []string{"-", "-", "-"}},
	}
	for _, c := range cases {
		var got []string
		for _, p := range applyBehavior(nil, matches, len(s), c.b, c.invert) {
			got = append(got, s[p.start:p.end])
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("behavior %d invert %v: got %q want %q", c.b, c.invert, got, c.want)
		}
	}
}

func TestSplitFallbacks(t *testing.T) {
	// A literal pattern with MergedWithNext, then a regex with no scanner
	// (regexp2), then the byte-level step with its own GPT-2 split.
	tk := parseToy(t, func(doc map[string]any) {
		doc["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"String": "|"}, "behavior": "Removed"},
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `(?<=l)l`}, "behavior": "MergedWithNext"},
			map[string]any{"type": "ByteLevel", "add_prefix_space": true},
		}}
	})
	// "hello|hello w": "|" removed; "hel" + "lo" (split before the second
	// l); ByteLevel adds a space to each piece not starting with one and
	// splits " w" off.
	got := tk.Encode("hello|aa w")
	want := []uint32{' ', idHe, 'l', ' ', 'l', 'o', ' ', idAA, idSpaceW}
	if !slices.Equal(got, want) {
		t.Errorf("got %v want %v", got, want)
	}
}

func TestAddedTokens(t *testing.T) {
	added := func(tokens ...map[string]any) func(map[string]any) {
		return func(doc map[string]any) {
			var list []any
			for i, tok := range tokens {
				tok["id"] = 1000 + i
				list = append(list, tok)
			}
			doc["added_tokens"] = list
			doc["normalizer"] = map[string]any{"type": "Lowercase"}
		}
	}
	cases := []struct {
		name   string
		tokens []map[string]any
		text   string
		want   []uint32
	}{
		{"special matched in text", []map[string]any{{"content": "<x>", "special": true}}, "a<x>b", []uint32{'a', 1000, 'b'}},
		{"longest at the leftmost start", []map[string]any{{"content": "<a>"}, {"content": "<a><b>"}}, "<a><b><a>", []uint32{1001, 1000}},
		{"lstrip", []map[string]any{{"content": "<x>", "lstrip": true}}, "a  <x>b", []uint32{'a', 1000, 'b'}},
		{"rstrip", []map[string]any{{"content": "<x>", "rstrip": true}}, "a<x>  b", []uint32{'a', 1000, 'b'}},
		{"single_word matches a word", []map[string]any{{"content": "hel", "single_word": true}}, "hel lo", []uint32{1000, ' ', 'l', 'o'}},
		{"single_word skips inside a word", []map[string]any{{"content": "hel", "single_word": true}}, "xhel", []uint32{'x', idHe, 'l'}},
		{"not normalized: raw text only", []map[string]any{{"content": "TOK"}}, "TOK tok", []uint32{1000, ' ', 't', 'o', 'k'}},
		{"normalized: after lowercasing", []map[string]any{{"content": "tok", "normalized": true}}, "TOK", []uint32{1000}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tk := parseToy(t, added(c.tokens...))
			if got := tk.Encode(c.text); !slices.Equal(got, c.want) {
				t.Errorf("got %v want %v", got, c.want)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	cases := []struct {
		name string
		edit func(map[string]any)
		want error
	}{
		{"wordpiece", func(d map[string]any) { model(d)["type"] = "WordPiece" }, ErrUnsupported},
		{"dropout", func(d map[string]any) { model(d)["dropout"] = 0.1 }, ErrUnsupported},
		{"subword prefix", func(d map[string]any) { model(d)["continuing_subword_prefix"] = "##" }, ErrUnsupported},
		{"no pre-tokenizer", func(d map[string]any) { d["pre_tokenizer"] = nil }, ErrUnsupported},
		{"whitespace pre-tokenizer", func(d map[string]any) { d["pre_tokenizer"] = map[string]any{"type": "Whitespace"} }, ErrUnsupported},
		{"split after byte-level", func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "ByteLevel"},
				map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Removed"},
			}}
		}, ErrUnsupported},
		{"bad behavior", func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Sideways"},
				map[string]any{"type": "ByteLevel"},
			}}
		}, ErrUnsupported},
		{"bad regex", func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "("}, "behavior": "Isolated"},
				map[string]any{"type": "ByteLevel"},
			}}
		}, ErrUnsupported},
		{"replace normalizer", func(d map[string]any) { d["normalizer"] = map[string]any{"type": "Replace"} }, ErrUnsupported},
		{"metaspace decoder", func(d map[string]any) { d["decoder"] = map[string]any{"type": "Metaspace"} }, ErrUnsupported},
		{"merge outside vocab", func(d map[string]any) { model(d)["merges"] = []string{"q z"} }, ErrInvalidTokenizer},
		{"merge not a pair", func(d map[string]any) { model(d)["merges"] = []string{"abc"} }, ErrInvalidTokenizer},
		{"merge triple", func(d map[string]any) { model(d)["merges"] = [][]string{{"a", "b", "c"}} }, ErrInvalidTokenizer},
		{"empty vocab", func(d map[string]any) { model(d)["vocab"] = map[string]int{} }, ErrInvalidTokenizer},
		{"no model", func(d map[string]any) { delete(d, "model") }, ErrInvalidTokenizer},
		{"empty added token", func(d map[string]any) { d["added_tokens"] = []any{map[string]any{"id": 5, "content": ""}} }, ErrInvalidTokenizer},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseTokenizer(toyTokenizer(t, c.edit), Options{})
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	if _, err := parseTokenizer([]byte("{"), Options{}); !errors.Is(err, ErrInvalidTokenizer) {
		t.Errorf("truncated json: got %v", err)
	}
	if _, err := Load(t.TempDir()); err == nil {
		t.Error("Load of an empty directory succeeded")
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, fileTokenizer), toyTokenizer(t, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tk.Name() != filepath.Base(dir) || tk.HasChatTemplate() {
		t.Errorf("name %q, template %v", tk.Name(), tk.HasChatTemplate())
	}
	if _, err := tk.RenderChat([]byte(`[]`)); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("got %v, want ErrNoChatTemplate", err)
	}
	if _, err := tk.Decode([]uint32{1 << 20}); !errors.Is(err, ErrUnknownID) {
		t.Errorf("got %v, want ErrUnknownID", err)
	}
}

func TestBytes(t *testing.T) {
	var b Bytes
	if got := b.Encode("a\xffé"); !slices.Equal(got, []uint32{'a', 0xff, 0xc3, 0xa9}) {
		t.Errorf("got %v", got)
	}
	if s, err := b.Decode([]uint32{'h', 'i'}); err != nil || s != "hi" {
		t.Errorf("got %q %v", s, err)
	}
	if _, err := b.Decode([]uint32{256}); !errors.Is(err, ErrUnknownID) {
		t.Errorf("got %v", err)
	}
	if b.Name() != "bytes" {
		t.Error(b.Name())
	}
	tk, err := Open("bytes")
	if err != nil || tk.Name() != "bytes" {
		t.Errorf("Open(bytes) = %v, %v", tk, err)
	}
	if _, err := Open(t.TempDir()); err == nil {
		t.Error("Open of an empty directory succeeded")
	}
}
