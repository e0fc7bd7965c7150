package tokenizer

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// uncached returns a copy of tk with no word cache and no segment cache:
// every encode runs the pre-tokenizer and BPE over the whole text.
func uncached(tk *HF) *HF {
	c := withCache(tk, 0)
	c.segs = nil
	return c
}

// longChat turns a golden chat into a multi-turn conversation whose
// messages are long enough for the segment cache (each content repeated to
// at least 2*minCachedSegment bytes).
func longChat(t testing.TB, raw json.RawMessage) []map[string]string {
	t.Helper()
	var msgs []map[string]string
	if err := json.Unmarshal(raw, &msgs); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		c := m["content"]
		var sb strings.Builder
		for sb.Len() < 2*minCachedSegment {
			sb.WriteString(c)
			sb.WriteString(" \n")
		}
		m["content"] = sb.String()
	}
	return msgs
}

// TestChatTokensCachedMatchUncached is the router's hot path against the
// plain one on growing multi-turn conversations built from every golden
// chat: each turn is rendered by AppendRenderChat (the compiled template
// where there is one) and encoded through the segment and word caches, so
// every earlier message is a hit; the ids must be those of the template
// engine's rendering encoded with no cache at all.
func TestChatTokensCachedMatchUncached(t *testing.T) {
	for _, model := range parityModels {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			plain := uncached(tk)
			var conv []map[string]string
			hits := 0
			for _, g := range readGolden(t, goldenPath(t, model, "golden-chat.jsonl")) {
				for _, m := range longChat(t, g.Messages) {
					conv = append(conv, m)
					raw, err := json.Marshal(conv)
					if err != nil {
						t.Fatal(err)
					}
					c := Chat{Messages: raw}
					before := tk.segs.len()
					text, err := tk.AppendRenderChat(nil, c)
					if err != nil {
						t.Fatal(err)
					}
					got := tk.AppendEncode(nil, string(text))
					want, err := tk.chat.renderTemplate(c)
					if err != nil {
						t.Fatal(err)
					}
					if string(text) != want {
						t.Fatalf("%d messages: rendering differs from the template engine's", len(conv))
					}
					if ids := plain.AppendEncode(nil, want); !slices.Equal(got, ids) {
						t.Fatalf("%d messages: cached ids differ from uncached (%d vs %d ids)", len(conv), len(got), len(ids))
					}
					if len(conv) > 1 && tk.segs.len() <= before+2 {
						hits++
					}
				}
			}
			if hits == 0 {
				t.Fatal("no turn reused the segment cache")
			}
		})
	}
}

// FuzzSegmentCache: any text encodes to the same ids through the caches
// (cold, then warm) as with none, for every model; the seeds put special
// tokens, long runs and message-like segments side by side.
func FuzzSegmentCache(f *testing.F) {
	long := strings.Repeat("the router routes ", minCachedSegment/16)
	f.Add("<|im_start|>user\n" + long + "<|im_end|>\n<|im_start|>assistant\n")
	f.Add(long + "<|endoftext|>" + long + "<|im_end|>" + long)
	f.Add("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n" + long + "<|eot_id|>")
	f.Add("<｜begin▁of▁sentence｜><｜User｜>" + long + "<｜Assistant｜>")
	f.Add(long + " <|im_start|> " + long + "\n\n<|im_end|>\t" + strings.Repeat("😀 12345 ", 40))
	f.Add("<|im_start<|im_end|>|>" + long + "<|im_" + long)
	type pair struct{ cached, plain *HF }
	var models []pair
	for _, m := range parityModels {
		tk := loadModel(f, m)
		models = append(models, pair{tk, uncached(tk)})
	}
	f.Fuzz(func(t *testing.T, text string) {
		for _, m := range models {
			want := m.plain.Encode(text)
			for round := range 2 {
				if got := m.cached.Encode(text); !slices.Equal(got, want) {
					t.Fatalf("%s round %d: cached %v, uncached %v", m.cached.name, round, got, want)
				}
			}
		}
	})
}
