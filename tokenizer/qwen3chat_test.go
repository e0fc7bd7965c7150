package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"
)

// qwen3NativeCases are chats the compiled Qwen3 rendering accepts, each
// aimed at one branch of the template.
var qwen3NativeCases = []string{
	`[{"role":"user","content":"Hi"}]`,
	`[{"role":"system","content":"S"},{"role":"user","content":"Hi"}]`,
	`[{"role":"system","content":"S"},{"role":"system","content":"S2"},{"role":"user","content":"Hi"}]`,
	`[{"role":"user","content":"Hi"},{"role":"system","content":"late"}]`,
	`[{"role":"user","content":"Q"},{"role":"assistant","content":"A"}]`,
	`[{"role":"user","content":"Q"},{"role":"assistant","content":"\n\nA\n"}]`,
	`[{"role":"user","content":"Q"},{"role":"assistant","content":"<think>\nr1\n</think>\n\nA1"}]`,
	`[{"role":"user","content":"Q"},{"role":"assistant","content":"<think>\nr1\n</think>\n\nA1"},{"role":"user","content":"Q2"}]`,
	`[{"role":"user","content":"Q"},{"role":"assistant","content":"a</think>b</think>\n\nc"},{"role":"assistant","content":"x<think>y<think>\nz\n\n</think>w"}]`,
	`[{"role":"user","content":"Q"},{"role":"assistant","content":"</think>"}]`,
	`[{"role":"user","content":"Q"},{"role":"assistant","content":"no think"},{"role":"assistant","content":"last"}]`,
	`[{"role":"user","content":"Q"},{"role":"assistant","content":"<think>r</think>a"},{"role":"tool","content":"t1"},{"role":"tool","content":"t2"},{"role":"assistant","content":"<think>\n\n</think>done"}]`,
	`[{"role":"tool","content":"first"},{"role":"user","content":"Q"}]`,
	`[{"role":"user","content":"Q"},{"role":"user","content":"<tool_response>\nx\n</tool_response>"},{"role":"assistant","content":"<think>r</think>a"}]`,
	`[{"role":"user","content":"<tool_response>only</tool_response>"},{"role":"assistant","content":"<think>r</think>a"}]`,
	`[{"role":"assistant","content":"<think>r</think>a"}]`,
	`[{"role":"developer","content":"ignored"},{"role":"user","content":"Q"}]`,
	`[{"role":"us\u0065r","content":"esc\u0061ped \"quotes\" \\ \n tab\t \u00e9 \ud83d\ude00"}]`,
	`[{"role":"user","content":"\u003ctool_response>x\u003c/tool_response>"},{"role":"assistant","content":"\u003cthink>r\u003c/think>a"}]`,
	`[{"role":"user","content":"dup","content":"second wins","role":"user"}]`,
	`[{"role":"user","content":"bad utf8 ` + "\xff\xfe" + `"}]`,
	`[{"role":"user","content":"Q","name":"n","extra":{"a":[1,2]}}]`,
	` [ {"role" : "user" , "content" : "spaces"} ] `,
	`[{"role":"user","content":"<|im_start|>special<|im_end|> inside"}]`,
}

// qwen3DeclinedCases go to the template engine.
var qwen3DeclinedCases = []string{
	`[]`,
	`{}`,
	`[{"role":"user","content":[{"type":"text","text":"a"}]}]`,
	`[{"role":"user","content":null}]`,
	`[{"role":"user"}]`,
	`[{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}]`,
	`[{"role":"assistant","content":"a","reasoning_content":"r"}]`,
	`[{"role":1,"content":"x"}]`,
	`[1]`,
	`[{"role":"user","content":"x"}] trailing`,
	`[{"role":"user","content":"x"`,
}

func qwen3Template(t testing.TB) *chatTemplate {
	t.Helper()
	tk := loadModel(t, "qwen3")
	if tk.chat == nil || tk.chat.native == nil {
		t.Fatal("the Qwen3 template was not recognized")
	}
	return tk.chat
}

// checkQwen3Native fails when the compiled rendering of c differs from the
// template engine's, or accepts a chat the engine rejects; it reports
// whether the compiled rendering accepted c.
func checkQwen3Native(t testing.TB, ct *chatTemplate, c Chat) bool {
	t.Helper()
	got, ok := ct.native([]byte("prefix:"), c)
	if !ok {
		if string(got) != "prefix:" {
			t.Fatalf("declined but wrote %q", got)
		}
		return false
	}
	want, err := ct.renderTemplate(c)
	if err != nil {
		t.Fatalf("%q: accepted, but the template engine fails: %v", c.Messages, err)
	}
	if string(got) != "prefix:"+want {
		t.Fatalf("%q:\ncompiled %q\ntemplate %q", c.Messages, got, "prefix:"+want)
	}
	return true
}

// TestQwen3ChatMatchesTemplate: the compiled Qwen3 rendering is the template
// engine's, byte for byte, on every golden chat and every hand-made case,
// and declines what it does not cover; the goldens' ids follow.
func TestQwen3ChatMatchesTemplate(t *testing.T) {
	ct := qwen3Template(t)
	tk := loadModel(t, "qwen3")
	for i, g := range readGolden(t, goldenPath(t, "qwen3", "golden-chat.jsonl")) {
		if !checkQwen3Native(t, ct, Chat{Messages: g.Messages}) {
			t.Errorf("golden %d declined", i)
		}
		out, err := tk.AppendRenderChat(nil, Chat{Messages: g.Messages})
		if err != nil || string(out) != g.Text {
			t.Errorf("golden %d: AppendRenderChat %q (%v)\nwant %q", i, out, err, g.Text)
		}
	}
	for _, m := range qwen3NativeCases {
		if !checkQwen3Native(t, ct, Chat{Messages: []byte(m)}) {
			t.Errorf("declined %s", m)
		}
	}
	for _, m := range qwen3DeclinedCases {
		if checkQwen3Native(t, ct, Chat{Messages: []byte(m)}) {
			t.Errorf("accepted %s", m)
		}
	}
	for _, c := range qwen3Cases {
		chat := Chat{Messages: []byte(c.messages)}
		if c.tools != "" {
			chat.Tools = []byte(c.tools)
		}
		if c.kwargs != "" {
			chat.Kwargs = []byte(c.kwargs)
		}
		checkQwen3Native(t, ct, chat)
		out, err := tk.AppendRenderChat([]byte("p"), chat)
		if err != nil || string(out) != "p"+c.want {
			t.Errorf("%s: AppendRenderChat %q (%v)", c.name, out, err)
		}
	}
	// An edited template is not the compiled one.
	if nativeRendererFor(strings.Replace(qwen3SourceForTest(t), "<tool_response>", "<tool_result>", 1)) != nil {
		t.Error("an edited template was recognized as Qwen3's")
	}
	if nativeRendererFor(qwen3SourceForTest(t)) == nil {
		t.Error("the Qwen3 source was not recognized")
	}
}

func qwen3SourceForTest(t testing.TB) string {
	t.Helper()
	raw, err := readLimited(tokenizerDir(t, "qwen3") + "/" + fileConfig)
	if err != nil {
		t.Fatal(err)
	}
	var cfg jsonConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	s, err := configTemplate(cfg.ChatTemplate)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestQwen3ChatAllocs: the compiled rendering allocates nothing into a
// buffer that is large enough.
func TestQwen3ChatAllocs(t *testing.T) {
	tk := loadModel(t, "qwen3")
	c := Chat{Messages: []byte(qwen3NativeCases[11])}
	dst, err := tk.AppendRenderChat(nil, c)
	if err != nil {
		t.Fatal(err)
	}
	long := Chat{Messages: []byte(`[{"role":"system","content":"be brief"},{"role":"user","content":"` + strings.Repeat("word ", 4000) + `"},{"role":"assistant","content":"ok"},{"role":"user","content":"more"}]`)}
	buf := make([]byte, 0, 1<<16)
	if n := testing.AllocsPerRun(100, func() {
		dst, _ = tk.AppendRenderChat(dst[:0], c)
		buf, _ = tk.AppendRenderChat(buf[:0], long)
	}); n != 0 {
		t.Fatalf("%v allocs per render, want 0", n)
	}
}

// FuzzQwen3Chat: on any messages document, the compiled rendering either
// declines or renders exactly what the template engine renders; the
// structured half builds chats from the template's own markers so that
// every branch (think splits, wrapped tool responses, tool runs) is reached.
func FuzzQwen3Chat(f *testing.F) {
	for _, m := range qwen3NativeCases {
		f.Add([]byte(m), []byte{})
	}
	for _, m := range qwen3DeclinedCases {
		f.Add([]byte(m), []byte{})
	}
	f.Add([]byte{}, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte{}, []byte{2, 7, 9, 2, 3, 1, 8, 0, 4, 3, 5, 6, 2, 2, 9, 9, 1, 4, 4, 0, 3, 3, 7})
	ct := qwen3Template(f)
	roles := []string{"user", "assistant", "tool", "system", "developer"}
	frags := []string{"<think>", "</think>", `\n`, "x", "<tool_response>", "</tool_response>", `\u003c`, "é", " ", "</", "think>", `\"`}
	f.Fuzz(func(t *testing.T, raw, plan []byte) {
		checkQwen3Native(t, ct, Chat{Messages: raw})
		if len(plan) == 0 {
			return
		}
		var sb strings.Builder
		sb.WriteByte('[')
		for i := 0; i < len(plan); {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(`{"role":"` + roles[int(plan[i])%len(roles)] + `","content":"`)
			i++
			n := 0
			if i < len(plan) {
				n = int(plan[i]) % 8
				i++
			}
			for ; n > 0 && i < len(plan); n-- {
				sb.WriteString(frags[int(plan[i])%len(frags)])
				i++
			}
			sb.WriteString(`"}`)
		}
		sb.WriteByte(']')
		if !checkQwen3Native(t, ct, Chat{Messages: []byte(sb.String())}) {
			t.Fatalf("declined a plain chat %s", sb.String())
		}
	})
}
