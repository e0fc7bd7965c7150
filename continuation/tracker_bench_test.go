package continuation_test

import (
	"bytes"
	"os"
	"strconv"
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
		// AppendEvent, as the relay calls it: the event matched whole,
		// appended to the step's output.
		b.Run(c.name+"/append", func(b *testing.B) {
			var t continuation.Tracker
			t.Reset(true)
			ev := []byte(c.ev)
			out := make([]byte, 0, 4096)
			b.ReportAllocs()
			b.SetBytes(int64(len(ev)))
			for i := range b.N {
				if i%4096 == 0 {
					t.Reset(true)
				}
				out = t.AppendEvent(out[:0], ev)
			}
		})
	}
}

// BenchmarkObserveStream: one 16-token vLLM chat stream as the router
// tracks it (ids asked and stripped): the first chunk with a 700-id
// prompt, 15 steady chunks, the finish and [DONE] (one op = one stream).
func BenchmarkObserveStream(b *testing.B) {
	prompt := make([]byte, 0, 4096)
	prompt = append(prompt, '[')
	for i := range 700 {
		if i > 0 {
			prompt = append(prompt, ',')
		}
		prompt = strconv.AppendInt(prompt, int64(32+i%90), 10)
	}
	prompt = append(prompt, ']')
	head := `data: {"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,`
	evs := [][]byte{[]byte(head + `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":` + string(prompt) + "}\n\n")}
	for i := range 15 {
		evs = append(evs, []byte(head+`"delta":{"content":"t`+strconv.Itoa(i)+`"},"logprobs":null,"finish_reason":null,"token_ids":[`+strconv.Itoa(100+i)+"]}]}\n\n"))
	}
	evs = append(evs, []byte(head+`"delta":{"content":"!"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[33]}]}`+"\n\n"), []byte("data: [DONE]\n\n"))
	var t continuation.Tracker
	b.ReportAllocs()
	for range b.N {
		t.Reset(true)
		for _, ev := range evs {
			t.ObserveEvent(ev)
		}
	}
}

// simStream is a 16-token chat stream as `infera sim` writes it with
// return_token_ids (testdata/sim-chat-ids.sse), one SSE event each.
func simStream(b *testing.B) [][]byte {
	raw, err := os.ReadFile("testdata/sim-chat-ids.sse")
	if err != nil {
		b.Fatal(err)
	}
	return splitEvents(b, raw)
}

// BenchmarkAppendSimStream: one stream as the relay tracks it, event by
// event (one op = one stream; the tracker is reused, as a pooled relay's
// is), through the fast path and read in full. fast replays the same
// stream; fast_streams cycles through streams that differ, as a relay's
// do, in their id and time (the layouts are rebased on each).
func BenchmarkAppendSimStream(b *testing.B) {
	evs := simStream(b)
	streams := [][][]byte{evs}
	for k := range 7 {
		// Same lengths: the stream's id and time as the next streams of
		// one engine have them.
		id := []byte("chatcmpl-5ae6257261e06ecb2a54213578c1755" + strconv.Itoa(k))
		created := []byte(strconv.Itoa(1796418577 + k))
		var s [][]byte
		for _, ev := range evs {
			ev = bytes.ReplaceAll(ev, []byte("chatcmpl-5ae6257261e06ecb2a54213578c1755e"), id)
			s = append(s, bytes.ReplaceAll(ev, []byte("1796418576"), created))
		}
		streams = append(streams, s)
	}
	for _, c := range []struct {
		name    string
		fast    bool
		streams [][][]byte
	}{{"fast", true, streams[:1]}, {"full", false, streams[:1]}, {"fast_streams", true, streams}} {
		b.Run(c.name, func(b *testing.B) {
			var t continuation.Tracker
			if !c.fast {
				continuation.DisableFast(&t)
			}
			out := make([]byte, 0, 8192)
			b.ReportAllocs()
			for i := range b.N {
				t.Reset(true)
				out = out[:0]
				for _, ev := range c.streams[i%len(c.streams)] {
					out = t.AppendEvent(out, ev)
				}
			}
		})
	}
}
