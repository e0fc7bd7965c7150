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
