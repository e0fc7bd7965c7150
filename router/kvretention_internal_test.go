package router

import (
	"testing"
	"time"

	"github.com/infera/infera/anthropic"
)

// TestKVRetentionWeighsPlacements (issue 13): in the approximate view a
// prompt marked as worth keeping (retention long: Anthropic cache_control,
// prompt_cache_retention) is still matched on the worker that prefilled it
// after the ordinary placement TTL; an unmarked one is not; one marked
// none is never expected to stay (no placement recorded).
func TestKVRetentionWeighsPlacements(t *testing.T) {
	eachCost(t, func(t *testing.T, cost string) {
		const ttl = 2 * time.Second
		text := unique(5, 2000)
		marked, _, err := anthropic.AppendChatRequest(nil, []byte(`{"model":"m","max_tokens":4,"system":[{"type":"text","text":"`+text+`","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"q"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		unmarked, _, err := anthropic.AppendChatRequest(nil, []byte(`{"model":"m","max_tokens":4,"system":[{"type":"text","text":"`+text+`"}],"messages":[{"role":"user","content":"q"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name, body string
			sticks     bool // after the ordinary TTL
		}{
			{"anthropic cache_control", string(marked), true},
			{"prompt_cache_retention 1h", `{"model":"m","prompt_cache_retention":"1h","messages":[{"role":"user","content":"` + text + `"}]}`, true},
			{"unmarked anthropic", string(unmarked), false},
			{"unmarked chat", chat(text), false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e := newKVEnv(t, costConfig(cost, func(c *KVAwareConfig) { c.TokenizerSpec, c.ApproxTTL = TokenizerBytes, ttl }), fleet(4)...)
				first := e.serial(tc.body)
				e.clock.advance(20 * time.Millisecond)
				if second := e.serial(tc.body); second != first {
					t.Fatalf("within the placement ttl the prompt went to %s, not %s", second, first)
				}
				e.clock.advance(ttl + time.Second)
				if third := e.serial(tc.body); (third == first) != tc.sticks {
					t.Fatalf("after the placement ttl: first %s, third %s; want sticking %v", first, third, tc.sticks)
				}
			})
		}
		t.Run("retention none", func(t *testing.T) {
			e := newKVEnv(t, costConfig(cost, func(c *KVAwareConfig) { c.TokenizerSpec, c.ApproxTTL = TokenizerBytes, ttl }), fleet(4)...)
			body := `{"model":"m","prompt_cache_retention":"none","messages":[{"role":"user","content":"` + text + `"}]}`
			first := e.serial(body)
			e.clock.advance(20 * time.Millisecond)
			if second := e.serial(body); second == first {
				t.Fatalf("a prompt the engine was told not to keep was expected on %s again", first)
			}
		})
	})
}
