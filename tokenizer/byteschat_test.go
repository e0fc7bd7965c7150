package tokenizer

import (
	"errors"
	"strings"
	"testing"
)

// renderBytesReference is the ChatML layout rendered from the template
// values RenderChat's HF path builds (parseMessages), the definition that
// Bytes.AppendRenderChat must reproduce byte for byte.
func renderBytesReference(messages []byte) (string, error) {
	v, err := parseJSONValueDecoder(messages)
	if err != nil {
		return "", err
	}
	msgs, err := normalizeMessages(v)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	for _, m := range msgs.AsList().Items {
		d := m.AsDict()
		role, _ := d.Get("role")
		content, _ := d.Get("content")
		sb.WriteString("<|im_start|>" + valueText(role) + "\n" + valueText(content) + "<|im_end|>\n")
	}
	sb.WriteString("<|im_start|>assistant\n")
	return sb.String(), nil
}

var bytesChatCases = []string{
	`[]`,
	` [ {"role":"system","content":"be brief"} , {"role":"user","content":"hi \u00e9 \ud83d\ude00 \ud800 x"} ] `,
	`[{"content":"c first","role":"user","role":"assistant"}]`,
	`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}},{"text":"b","type":"text"},{"type":"text"},{"type":"text","text":5}]}]`,
	`[{"role":"user","content":null},{"role":"user"},{"role":"user","content":{"x":1}},{"role":"user","content":3.5e-2}]`,
	`[{"role":"user","content":["plain",[1],{"type":"t\u0065xt","t\u0065xt":"esc"}]}]`,
	"[{\"role\":\"user\",\"content\":\"bad \xff utf8\"}]",
	`[{"r\u006fle":"user","content":"escaped key"}]`,
	// Rejected ones.
	``, `{}`, `[1]`, `[{"content":"x"}]`, `[{"role":1}]`, `[{"role":"u"}] x`, `[{"role":"u",}]`,
	"[{\"role\":\"u\",\"content\":\"a\tb\"}]", `[{"role":"u","content":01}]`, `[{"role":"u","content":"\x"}]`,
	`[` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 70) + `]`,
	`[{"role":"u","content":` + strings.Repeat(`[`, 62) + strings.Repeat(`]`, 62) + `}]`,
	`[{"role":"u","content":` + strings.Repeat(`[`, 63) + `1` + strings.Repeat(`]`, 63) + `}]`,
	// A message's fault before a syntax error, a nesting error or
	// trailing data: the latter is what is reported.
	`[1,01]`, `[{"content":"x"},{"role":"u","content":"\x"}]`, `[{"role":1},{"role":"u"}] x`,
	`[{"role":"u"},2,{"role":"u","content":"bad` + "\t" + `"}]`, `[{"role":"u"},{"x":1},{"role":"u",}]`,
	`[{"role":"u"},"m",` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 70) + `]`,
	`[{"content":[{"type":"text","text":"a"}]},{"role":"u","content":[{"type":"text","text":"b\q"}]}]`,
	`[{"role":"u","content":"a"},{"role":"u","content":"b"},{"role":null},{"role":"u"`,
}

// chatMessageError reports whether err is one of the errors of well-formed
// JSON that is not a chat.
func chatMessageError(err error) bool {
	m := err.Error()
	return strings.Contains(m, "is not an object") || strings.Contains(m, "has no string role") ||
		strings.Contains(m, "is not an array")
}

func TestBytesAppendRenderChatMatchesReference(t *testing.T) {
	for _, tc := range bytesChatCases {
		checkBytesChat(t, []byte(tc))
	}
}

func checkBytesChat(t *testing.T, msgs []byte) {
	t.Helper()
	want, werr := renderBytesReference(msgs)
	got, gerr := Bytes{}.AppendRenderChat([]byte("prefix:"), Chat{Messages: msgs})
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("%q: reference err %v, fast err %v", msgs, werr, gerr)
	}
	if gerr != nil {
		if !errors.Is(gerr, ErrInvalidMessages) {
			t.Fatalf("%q: err %v does not wrap ErrInvalidMessages", msgs, gerr)
		}
		if string(got) != "prefix:" {
			t.Fatalf("%q: err %v with dst %q, want it as given", msgs, gerr, got)
		}
		// A document that is not JSON is reported as such even where a
		// message before the fault is not one (the one-pass walk keeps
		// the message's error until the end).
		if _, perr := parseJSONValueDecoder(msgs); perr != nil && chatMessageError(gerr) {
			t.Fatalf("%q: err %v, want the syntax error (%v)", msgs, gerr, perr)
		}
		return
	}
	if string(got) != "prefix:"+want {
		t.Fatalf("%q:\n got %q\nwant %q", msgs, got, "prefix:"+want)
	}
	if s, err := (Bytes{}).RenderChat(msgs); err != nil || s != want {
		t.Fatalf("%q: RenderChat = %q, %v", msgs, s, err)
	}
}

func TestBytesAppendRenderChatAllocs(t *testing.T) {
	msgs := []byte(`[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a\nb"},{"type":"text","text":"c"}]}]`)
	dst := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() {
		dst, _ = Bytes{}.AppendRenderChat(dst[:0], Chat{Messages: msgs})
	}); n != 0 {
		t.Fatalf("%.1f allocs per render, want 0", n)
	}
}

func FuzzBytesAppendRenderChat(f *testing.F) {
	for _, tc := range bytesChatCases {
		f.Add([]byte(tc))
	}
	f.Fuzz(func(t *testing.T, msgs []byte) {
		checkBytesChat(t, msgs)
	})
}
