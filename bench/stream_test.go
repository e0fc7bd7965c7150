package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func sseBody(events int, chat bool) []byte {
	var b bytes.Buffer
	if chat {
		b.WriteString("data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	}
	for range events {
		if chat {
			b.WriteString("data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"},\"finish_reason\":null}]}\n\n")
		} else {
			b.WriteString("data: {\"id\":\"x\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"tok\",\"finish_reason\":null}]}\r\n\r\n")
		}
	}
	b.WriteString(": keep-alive comment\n\n")
	b.WriteString("data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":" +
		strings.Repeat("", 0) + "3,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

func TestReadStream(t *testing.T) {
	c := newClient([]string{"http://x"}, "", "m", true, true, false, 1, time.Second)
	ctx := context.Background()
	for _, chat := range []bool{true, false} {
		var res result
		c.readStream(ctx, ctx, bytes.NewReader(sseBody(5, chat)), &res)
		if res.kind != "" || !res.done || res.chunks != 5 || len(res.itl) != 4 || !res.haveUsage ||
			res.promptTokens != 9 || res.outputTokens != 3 || res.cached != 4 {
			t.Fatalf("chat=%v: %+v", chat, res)
		}
	}
	// A data line longer than the read buffer, and a multi-line event.
	long := "data: {\"choices\":[{\"text\":\"" + strings.Repeat("y", 3*readBufferSize) + "\"}]}\n\n" +
		"data: {\"choices\":\ndata: [{\"text\":\"z\"}]}\n\ndata: [DONE]\n\n"
	var res result
	c.readStream(ctx, ctx, strings.NewReader(long), &res)
	if res.kind != "" || res.chunks != 2 || !res.done {
		t.Fatalf("long line: %+v", res)
	}
	// Truncated stream.
	res = result{}
	c.readStream(ctx, ctx, bytes.NewReader(sseBody(3, true)[:200]), &res)
	if res.kind != KindStream {
		t.Fatalf("truncated stream: kind %q", res.kind)
	}
}

// TestReadStreamNoPerEventAllocs: reading a stream allocates nothing per
// event once the pools and the ITL buffer are warm.
func TestReadStreamNoPerEventAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	c := newClient([]string{"http://x"}, "", "m", true, true, false, 1, time.Second)
	ctx := context.Background()
	body := sseBody(200, true)
	rd := bytes.NewReader(body)
	res := &result{}
	allocs := testing.AllocsPerRun(50, func() {
		rd.Reset(body)
		res.reset()
		c.readStream(ctx, ctx, rd, res)
		if res.chunks != 200 {
			t.Fatalf("%d chunks", res.chunks)
		}
	})
	if allocs > 0 {
		t.Fatalf("%v allocations per 200-event stream, want 0", allocs)
	}
}

func BenchmarkReadStream(b *testing.B) {
	c := newClient([]string{"http://x"}, "", "m", true, true, false, 1, time.Second)
	ctx := context.Background()
	body := sseBody(100, true)
	rd := bytes.NewReader(body)
	res := &result{}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		rd.Reset(body)
		res.reset()
		c.readStream(ctx, ctx, rd, res)
	}
}
