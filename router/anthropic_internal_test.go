package router

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// anthropicTestRelay is testRelay on the Anthropic route, its stream
// translator bound as attach binds it.
func anthropicTestRelay(r *Router, bufSize int) *relay {
	rel := testRelay(r, bufSize)
	rel.route, rel.dialect = RouteMessages, r.dialects[RouteMessages]
	rel.xlateEvent = rel.xlate.Event
	rel.pump.transform = rel.xlateEvent
	return rel
}

// TestAnthropicRelayWriteToAlloc drives the whole Anthropic stream relay
// over many text events and checks that it allocates nothing per event.
func TestAnthropicRelayWriteToAlloc(t *testing.T) {
	r, err := New(DefaultConfig(), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ev := []byte(testEvent)
	const events = 1000
	stream := bytes.Repeat(ev, events)
	dst := &countWriter{}
	src := &eofReader{}
	rel := anthropicTestRelay(r, relayBufSize)
	run := func() {
		src.data, src.size = stream, len(ev)
		rel.att.src, rel.done, rel.firstByte = src, false, false
		rel.xlate.Reset()
		if _, err := rel.WriteTo(dst); err != nil {
			t.Fatal(err)
		}
	}
	run()
	if n := testing.AllocsPerRun(20, run); n != 0 {
		t.Fatalf("relaying %d Anthropic text events allocates %.1f times, want 0", events, n)
	}
	if dst.writes != 22*events {
		t.Fatalf("%d writes for %d events: not one write per event", dst.writes, 22*events)
	}
}

// TestAnthropicRelayLargeEvent: an engine event larger than the pump's
// buffer reaches the translator whole (the buffer grows), and the pooled
// buffer is back to its size after reuse.
func TestAnthropicRelayLargeEvent(t *testing.T) {
	r, err := New(DefaultConfig(), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("y", 3*relayBufSize)
	stream := []byte(testEvent + `data: {"id":"chatcmpl-8c1f","model":"m","choices":[{"index":0,"delta":{"content":"` + big + `"},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n")
	rel := anthropicTestRelay(r, relayBufSize)
	rel.att.src = &eofReader{data: stream, size: 7000}
	var out bytes.Buffer
	if _, err := rel.WriteTo(&out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if !strings.Contains(got, `"text_delta","text":"`+big+`"}}`) || !strings.HasSuffix(got, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
		t.Fatalf("large event not translated whole:\n%s", got)
	}
	if strings.Contains(got, "chat.completion.chunk") || strings.Contains(got, "data: {\"id\"") {
		t.Fatal("untranslated OpenAI bytes reached the Anthropic client")
	}
	if rel.pump.reset(); len(rel.pump.buf) != relayBufSize {
		t.Fatalf("grown buffer kept for the pool: %d bytes", len(rel.pump.buf))
	}
}
