package openai_test

import (
	"bytes"
	"testing"

	"github.com/infera/infera/openai"
)

func TestNextEvent(t *testing.T) {
	tests := []struct {
		buf  string
		want int
	}{
		{"", -1},
		{"data: x", -1},
		{"data: x\n", -1},
		{"data: x\n\n", 9},
		{"data: x\n\ndata: y\n\n", 9},
		{"data: x\r\n\r\n", 11},
		{"data: x\r\n\r\ndata", 11},
		{"data: x\r\r", 9},
		{"data: x\r\rdata: y\r\r", 9},
		{"data: x\r\n", -1},
		{"data: x\r", -1},
		{"data: x\r\n\r", 10}, // a trailing CR ends the blank line at once
		{"data: x\n\r\n", 10},
		{"data: x\r\n\n", 10},
		{"data: x\n\r", 9},
		{"event: a\ndata: 1\ndata: 2\n\nrest", 26},
		{"event: a\rdata: 1\r\ndata: 2\n\r\n", 28},
		{": comment\n\n", 11},
		{"\n\n", 2},
		{"\n", -1},
		{"data: {\"a\":\"\\n\\n\"}\n\n", 20},
	}
	for _, tc := range tests {
		if got := openai.NextEvent([]byte(tc.buf)); got != tc.want {
			t.Errorf("NextEvent(%q) = %d, want %d", tc.buf, got, tc.want)
		}
	}
}

func TestNextEventAllocs(t *testing.T) {
	buf := []byte("data: {\"id\":\"cmpl-1\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	if n := testing.AllocsPerRun(1000, func() { openai.NextEvent(buf) }); n != 0 {
		t.Fatalf("NextEvent allocates %.1f times per call, want 0", n)
	}
}

// refNextEvent is a direct transcription of the SSE line grammar: split into
// lines at CRLF, LF or CR (a CR at the very end of the buffer ends its line),
// and stop after the first empty line that follows a line.
func refNextEvent(buf []byte) int {
	i := 0
	lineStart := 0
	for i < len(buf) {
		c := buf[i]
		if c != '\n' && c != '\r' {
			i++
			continue
		}
		end := i + 1
		if c == '\r' && end < len(buf) && buf[end] == '\n' {
			end++
		}
		if i == lineStart && lineStart > 0 {
			return end
		}
		i = end
		lineStart = end
	}
	return -1
}

func FuzzNextEvent(f *testing.F) {
	for _, s := range []string{"data: x\n\n", "a\r\n\r\nb", "a\r\rb", "a\n\r\n", "\r\n\r\n", "x\r", "data: [DONE]\n\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, buf []byte) {
		got := openai.NextEvent(buf)
		if want := refNextEvent(buf); got != want {
			t.Fatalf("NextEvent(%q) = %d, reference says %d", buf, got, want)
		}
		if got == -1 {
			return
		}
		if got < 2 || got > len(buf) {
			t.Fatalf("NextEvent(%q) = %d out of range", buf, got)
		}
		if last := buf[got-1]; last != '\n' && last != '\r' {
			t.Fatalf("NextEvent(%q) = %d does not end at a line terminator", buf, got)
		}
		// Feeding the rest must find events only within it, and a prefix that
		// ends before the boundary never holds a complete event... unless it
		// ends in a CR that a later LF would extend.
		if p := openai.NextEvent(buf[:got-1]); p != -1 && !(bytes.HasSuffix(buf[:got], []byte("\r\n")) && p == got-1) {
			t.Fatalf("NextEvent(%q) = %d, but the shorter prefix already gives %d", buf, got, p)
		}
	})
}

func BenchmarkNextEvent(b *testing.B) {
	ev := []byte("data: {\"id\":\"chatcmpl-8c1f\",\"object\":\"chat.completion.chunk\",\"created\":1730000000,\"model\":\"Qwen/Qwen3-8B\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n")
	b.SetBytes(int64(len(ev)))
	b.ReportAllocs()
	for b.Loop() {
		if openai.NextEvent(ev) != len(ev) {
			b.Fatal("no event")
		}
	}
}
