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
