package tokenizer

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// parityModels have goldens made by transformers.js: qwen3 and llama3 in
// shared/fixtures/tokenizers (copied to testdata/), deepseek_v3 in testdata/
// only (shared/fixtures/tokenizers/gen scripts, corpus seed 1 N 300, chats
// seed 1 N 24).
var parityModels = []string{"qwen3", "llama3", "deepseek_v3"}

func TestParityText(t *testing.T) {
	for _, model := range parityModels {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			cases := readGolden(t, goldenPath(t, model, "golden-text.jsonl"))
			pass := 0
			for i, c := range cases {
				got := tk.Encode(c.Text)
				if !slices.Equal(got, c.IDs) {
					t.Errorf("case %d %q:\n got %v\nwant %v", i, clip(c.Text), got, c.IDs)
					continue
				}
				pass++
			}
			t.Logf("%s golden-text: %d/%d", model, pass, len(cases))
		})
	}
}

func TestParityChat(t *testing.T) {
	for _, model := range parityModels {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			cases := readGolden(t, goldenPath(t, model, "golden-chat.jsonl"))
			pass := 0
			for i, c := range cases {
				text, err := tk.RenderChat(c.Messages)
				if err != nil {
					t.Errorf("case %d: render: %v", i, err)
					continue
				}
				if text != c.Text {
					t.Errorf("case %d: rendered\n%q\nwant\n%q", i, text, c.Text)
					continue
				}
				if got := tk.Encode(text); !slices.Equal(got, c.IDs) {
					t.Errorf("case %d: ids\n got %v\nwant %v", i, got, c.IDs)
					continue
				}
				pass++
			}
			t.Logf("%s golden-chat: %d/%d", model, pass, len(cases))
		})
	}
}

func clip(s string) string {
	if len(s) > 120 {
		return fmt.Sprintf("%s…(%d bytes)", s[:120], len(s))
	}
	return s
}

// TestParityExtra checks goldens made outside the repository with the Node
// scripts in shared/fixtures/tokenizers/gen: INFERA_TOKENIZER_GOLDENS is a
// comma-separated list of MODEL=PATH (golden-text or golden-chat format; the
// model's files must be in testdata/tokenizers/MODEL).
func TestParityExtra(t *testing.T) {
	spec := os.Getenv("INFERA_TOKENIZER_GOLDENS")
	if spec == "" {
		t.Skip("INFERA_TOKENIZER_GOLDENS not set")
	}
	for _, item := range strings.Split(spec, ",") {
		model, path, ok := strings.Cut(item, "=")
		if !ok {
			t.Fatalf("INFERA_TOKENIZER_GOLDENS item %q is not MODEL=PATH", item)
		}
		t.Run(model+"/"+filepath.Base(path), func(t *testing.T) {
			tk := loadModel(t, model)
			cases := readGolden(t, path)
			pass := 0
			for i, c := range cases {
				text := c.Text
				if len(c.Messages) > 0 {
					r, err := tk.RenderChat(c.Messages)
					if err != nil {
						t.Errorf("case %d: render: %v", i, err)
						continue
					}
					if r != text {
						t.Errorf("case %d: rendered\n%q\nwant\n%q", i, r, text)
						continue
					}
				}
				if got := tk.Encode(text); !slices.Equal(got, c.IDs) {
					t.Errorf("case %d %q:\n got %v\nwant %v", i, clip(text), got, c.IDs)
					continue
				}
				pass++
			}
			t.Logf("%s %s: %d/%d", model, path, pass, len(cases))
		})
	}
}

// TestSegmentCacheParity: every golden encodes to its ids on a cold segment
// cache and again from the cache, one by one and with the chats joined into
// one long multi-turn text; and a cached segment is what Encode returns.
func TestSegmentCacheParity(t *testing.T) {
	for _, model := range parityModels {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			if tk.segs == nil {
				t.Fatal("no segment cache by default")
			}
			texts := readGolden(t, goldenPath(t, model, "golden-text.jsonl"))
			chats := readGolden(t, goldenPath(t, model, "golden-chat.jsonl"))
			var all []goldenCase
			all = append(all, texts...)
			all = append(all, chats...)
			var joined strings.Builder
			var joinedIDs []uint32
			for _, c := range chats {
				joined.WriteString(c.Text)
				joinedIDs = append(joinedIDs, c.IDs...)
			}
			for round := range 2 {
				for i, c := range all {
					if got := tk.Encode(c.Text); !slices.Equal(got, c.IDs) {
						t.Errorf("round %d case %d %q:\n got %v\nwant %v", round, i, clip(c.Text), got, c.IDs)
					}
				}
			}
			if tk.segs.len() == 0 {
				t.Fatal("no segment was cached")
			}
			// The chats end and start with special tokens, so joining them
			// joins their ids; every segment is a hit now.
			if got := tk.Encode(joined.String()); !slices.Equal(got, joinedIDs) {
				t.Errorf("joined chats differ (%d ids, want %d)", len(got), len(joinedIDs))
			}
			// A hit is served from the cache: plant other ids for a long
			// segment and Encode returns them.
			seg := strings.Repeat("cache me ", minCachedSegment/8)
			want := tk.Encode(seg)
			tk.segs.mu.Lock()
			e := tk.segs.m[tk.segs.key(seg)]
			tk.segs.mu.Unlock()
			if e == nil {
				t.Fatal("a long segment was not cached")
			}
			planted := []uint32{1, 2, 3}
			e.ids = planted
			if got := tk.Encode(seg); !slices.Equal(got, planted) {
				t.Fatalf("Encode did not use the cache: %v", got)
			}
			e.ids = want
		})
	}
}

// TestSegmentCacheBound: the cache stays within its token budget, evicting
// the least recently used segment first.
func TestSegmentCacheBound(t *testing.T) {
	c := newSegmentCache(100)
	ids := make([]uint32, 20)
	keys := make([]segKey, 8)
	for i := range keys {
		keys[i] = c.key(strings.Repeat("x", i+1))
		c.put(keys[i], ids)
		if i == 3 {
			c.get(keys[0]) // keep the first one recent
		}
	}
	if c.tokens > 100 || c.len() != 5 {
		t.Fatalf("%d tokens in %d segments, want <= 100 in 5", c.tokens, c.len())
	}
	if _, ok := c.get(keys[0]); !ok {
		t.Fatal("the recently used segment was evicted")
	}
	if _, ok := c.get(keys[1]); ok {
		t.Fatal("the least recently used segment is still there")
	}
	c.put(c.key("big"), make([]uint32, 26))
	if _, ok := c.get(c.key("big")); ok {
		t.Fatal("a segment over a quarter of the budget was cached")
	}
	if newSegmentCache(-1) != nil {
		t.Fatal("negative size should disable the cache")
	}
}
