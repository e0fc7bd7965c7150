package continuation_test

import (
	"testing"

	"github.com/infera/infera/continuation"
)

// BenchmarkObserveEvent: the per-event cost of tracking a stream for
// continuation, with the ids the router asked for stripped (vLLM's chat
// chunk shape) and without ids (text only).
func BenchmarkObserveEvent(b *testing.B) {
	for _, c := range []struct{ name, ev string }{
		{"ids", "data: {\"id\":\"chatcmpl-8c1f\",\"object\":\"chat.completion.chunk\",\"created\":1730000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"logprobs\":null,\"finish_reason\":null,\"token_ids\":[1234]}]}\n\n"},
		{"text", "data: {\"id\":\"chatcmpl-8c1f\",\"object\":\"chat.completion.chunk\",\"created\":1730000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"},
	} {
		b.Run(c.name, func(b *testing.B) {
			var t continuation.Tracker
			t.Reset(true)
			ev := []byte(c.ev)
			b.ReportAllocs()
			b.SetBytes(int64(len(ev)))
			for i := range b.N {
				if i%4096 == 0 {
					t.Reset(true)
				}
				t.ObserveEvent(ev)
			}
		})
	}
}
