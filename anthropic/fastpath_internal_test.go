package anthropic

import (
	"testing"
)

// FuzzReadText: whenever the text fast path accepts a chunk's tail, the
// general walk of the tail accepts it too and reads the same thing (the
// content alone).
func FuzzReadText(f *testing.F) {
	for _, tail := range []string{
		textHead + ` token"` + textTail,
		textHead + `\u00e9\"x"` + textTail,
		textHead + `"` + textTail,
		textHead + `bad` + textTail,
		textHead + `"x"` + textTail + ` `,
		textHead + `"x` + "\xff" + `"` + textTail,
		`[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":"stop"}]}`,
	} {
		f.Add([]byte(`{"id":"chatcmpl-1","model":"m","choices":` + tail))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fast chunk
		at := 0
		i := -1
		for j := 0; j+len(choicesKey) <= len(data); j++ {
			if string(data[j:j+len(choicesKey)]) == string(choicesKey) {
				i = j
				break
			}
		}
		if i <= 0 || !fast.readText(data, i+len(choicesKey)) {
			return
		}
		var walk chunk
		if !walk.walkTail(data, i+len(choicesKey)) {
			t.Fatalf("fast path accepted what the walk rejects: %q", data)
		}
		if walk.content != fast.content || walk.finish.ok() || walk.tools.ok() || walk.err.ok() || walk.usage.seen || walk.stopSeq.ok() {
			t.Fatalf("fast %+v, walk %+v for %q", fast, walk, data)
		}
		var tail chunk
		if !tail.readTail(data, &at) || tail.content != fast.content || at != i {
			t.Fatalf("readTail %+v (at %d), fast %+v for %q", tail, at, fast, data)
		}
	})
}
