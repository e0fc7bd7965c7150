package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDeepSeekV3Template(t *testing.T) {
	ct, err := loadChatTemplate(filepath.Join("testdata", "chat", "deepseek_v3"))
	if err != nil {
		t.Fatal(err)
	}
	if ct == nil {
		t.Fatal("no template loaded")
	}
	const bos = "<｜begin▁of▁sentence｜>"
	cases := []struct {
		name, messages, want string
	}{
		{
			name:     "single user",
			messages: `[{"role":"user","content":"Hi"}]`,
			want:     bos + "<｜User｜>Hi<｜Assistant｜>",
		},
		{
			name: "systems joined, multi-turn",
			messages: `[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hello"},
				{"role":"assistant","content":"Hi! How can I help?"},{"role":"system","content":"Be brief."},{"role":"user","content":"2+2?"}]`,
			want: bos + "You are helpful.\n\nBe brief.<｜User｜>Hello<｜Assistant｜>Hi! How can I help?<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜>",
		},
		{
			name: "tool calls and outputs",
			messages: `[{"role":"user","content":"What is 2+2?"},
				{"role":"assistant","content":null,"tool_calls":[
					{"type":"function","function":{"name":"calc","arguments":"{\"x\": \"2+2\"}"}},
					{"type":"function","function":{"name":"log","arguments":"{}"}}]},
				{"role":"tool","content":"4"},{"role":"tool","content":"ok"},
				{"role":"assistant","content":"It is 4."},{"role":"user","content":"Thanks"}]`,
			want: bos + "<｜User｜>What is 2+2?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{\"x\": \"2+2\"}\n```<｜tool▁call▁end｜>" +
				"\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>log\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>" +
				"<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>4<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>ok<｜tool▁output▁end｜><｜tool▁outputs▁end｜>" +
				"It is 4.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜>",
		},
		{
			name: "ends in tool output: no generation prompt",
			messages: `[{"role":"user","content":"Go"},
				{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"run","arguments":"{}"}}]},
				{"role":"tool","content":"done"}]`,
			want: bos + "<｜User｜>Go<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>run\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>" +
				"<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>done<｜tool▁output▁end｜><｜tool▁outputs▁end｜>",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ct.render(Chat{Messages: []byte(c.messages)})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("rendered\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

// TestDeepSeekV3TemplateMatchesModel compares the authored template with the
// model's own on plain conversations, when the DeepSeek V3 files are present.
func TestDeepSeekV3TemplateMatchesModel(t *testing.T) {
	dir := filepath.Join(moduleRoot(t), "testdata", "tokenizers", "deepseek_v3")
	if _, err := os.Stat(filepath.Join(dir, fileConfig)); err != nil {
		t.Skip("deepseek_v3 tokenizer files not fetched")
	}
	model, err := loadChatTemplate(dir)
	if err != nil {
		t.Fatal(err)
	}
	ours, err := loadChatTemplate(filepath.Join("testdata", "chat", "deepseek_v3"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range readGolden(t, goldenPath(t, "qwen3", "golden-chat.jsonl")) {
		a, errA := model.render(Chat{Messages: c.Messages})
		b, errB := ours.render(Chat{Messages: c.Messages})
		if errA != nil || errB != nil || a != b {
			t.Errorf("model %q (%v)\nours  %q (%v)", a, errA, b, errB)
		}
	}
}

// qwen3Cases are rendered by hand from the Qwen3 template's Jinja source.
var qwen3Cases = []struct {
	name, messages, tools, kwargs, want string
}{
	{
		name:     "enable_thinking false through chat_template_kwargs",
		messages: `[{"role":"user","content":"Hi"}]`,
		kwargs:   `{"enable_thinking": false}`,
		want:     "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
	},
	{
		name: "tools, calls with dict arguments, grouped tool responses",
		messages: `[{"role":"system","content":"You are Qwen."},{"role":"user","content":"Weather in Paris?"},
			{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},
			{"role":"tool","content":"{\"temp\": 21}"},{"role":"tool","content":"sunny"}]`,
		tools: `[{"type":"function","function":{"name":"get_weather","description":"Get weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`,
		want: "<|im_start|>system\nYou are Qwen.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
			"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
			`{"type": "function", "function": {"name": "get_weather", "description": "Get weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}` +
			"\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n" +
			`{"name": <function-name>, "arguments": <args-json-object>}` + "\n</tool_call><|im_end|>\n" +
			"<|im_start|>user\nWeather in Paris?<|im_end|>\n" +
			"<|im_start|>assistant\n<tool_call>\n" + `{"name": "get_weather", "arguments": {"city": "Paris"}}` + "\n</tool_call><|im_end|>\n" +
			"<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" +
			"<|im_start|>assistant\n",
	},
	{
		name: "reasoning dropped before the last query",
		messages: `[{"role":"user","content":"Hi"},{"role":"assistant","content":"<think>\nplan\n</think>\n\nHello!"},
			{"role":"user","content":"Again"}]`,
		want: "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n",
	},
	{
		name:     "reasoning kept after the last query",
		messages: `[{"role":"user","content":"Q"},{"role":"assistant","content":"<think>\nr1\n</think>\n\nA1"}]`,
		want:     "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\nA1<|im_end|>\n<|im_start|>assistant\n",
	},
	{
		name:     "text parts joined, image parts dropped",
		messages: `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x/y.png"}},{"type":"text","text":"b"}]}]`,
		want:     "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n",
	},
}

func TestQwen3Template(t *testing.T) {
	tk := loadModel(t, "qwen3")
	for _, c := range qwen3Cases {
		t.Run(c.name, func(t *testing.T) {
			chat := Chat{Messages: []byte(c.messages)}
			if c.tools != "" {
				chat.Tools = []byte(c.tools)
			}
			if c.kwargs != "" {
				chat.Kwargs = []byte(c.kwargs)
			}
			got, err := tk.RenderChatRequest(chat)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("rendered\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

func TestChatTemplateSources(t *testing.T) {
	msgs := []byte(`[{"role":"user","content":"x"}]`)
	write := func(t *testing.T, files map[string]string) string {
		dir := t.TempDir()
		for name, body := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	cases := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"string", map[string]string{fileConfig: `{"chat_template":"S{{ messages[0].content }}{{ eos_token }}","eos_token":"</s>"}`}, "Sx</s>"},
		{"named list", map[string]string{fileConfig: `{"chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":"D{{ bos_token }}"}],"bos_token":{"content":"<s>"}}`}, "D<s>"},
		{"jinja file wins", map[string]string{fileConfig: `{"chat_template":"S"}`, fileChatTemplate: "J{{ add_generation_prompt }}"}, "JTrue"},
		{"jinja file alone", map[string]string{fileChatTemplate: "J"}, "J"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ct, err := loadChatTemplate(write(t, c.files))
			if err != nil {
				t.Fatal(err)
			}
			got, err := ct.render(Chat{Messages: msgs})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got %q want %q", got, c.want)
			}
		})
	}
	t.Run("none", func(t *testing.T) {
		ct, err := loadChatTemplate(write(t, map[string]string{fileConfig: `{"eos_token":"</s>"}`}))
		if err != nil || ct != nil {
			t.Fatalf("got %v, %v; want no template", ct, err)
		}
	})
	t.Run("bad config", func(t *testing.T) {
		_, err := loadChatTemplate(write(t, map[string]string{fileConfig: `{"chat_template":42}`}))
		if !errors.Is(err, ErrInvalidTokenizer) {
			t.Fatalf("got %v, want ErrInvalidTokenizer", err)
		}
	})
	t.Run("bad template", func(t *testing.T) {
		_, err := loadChatTemplate(write(t, map[string]string{fileChatTemplate: "{% if %}"}))
		if !errors.Is(err, ErrTemplate) {
			t.Fatalf("got %v, want ErrTemplate", err)
		}
	})
}

func TestRenderChatInvalidMessages(t *testing.T) {
	ct, err := compileChatTemplate("{{ messages | length }}", nil)
	if err != nil {
		t.Fatal(err)
	}
	deep := strings.Repeat("[", 200) + strings.Repeat("]", 200)
	for _, in := range []string{``, `{}`, `[1]`, `[{"content":"x"}]`, `[{"role":1}]`, `[{"role":"user"}] x`, `[{"role":"user"`, `[{"role":"user","content":` + deep + `}]`} {
		if _, err := ct.render(Chat{Messages: []byte(in)}); !errors.Is(err, ErrInvalidMessages) {
			t.Errorf("%.40q: got %v, want ErrInvalidMessages", in, err)
		}
	}
	for _, bad := range []Chat{
		{Messages: []byte(`[]`), Tools: []byte(`{"not":"a list"}`)},
		{Messages: []byte(`[]`), Kwargs: []byte(`[1]`)},
		{Messages: []byte(`[]`), Kwargs: []byte(`{"messages":[]}`)},
		{Messages: []byte(`[]`), Kwargs: []byte(`{"x":`)},
	} {
		if _, err := ct.render(bad); !errors.Is(err, ErrInvalidMessages) {
			t.Errorf("%s / %s: got %v, want ErrInvalidMessages", bad.Tools, bad.Kwargs, err)
		}
	}
	ct, err = compileChatTemplate("{{ raise_exception('nope') }}", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ct.render(Chat{Messages: []byte(`[]`)}); !errors.Is(err, ErrTemplate) {
		t.Errorf("raise_exception: got %v, want ErrTemplate", err)
	}
}

func TestBytesRenderChat(t *testing.T) {
	got, err := Bytes{}.RenderChat([]byte(`[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"U"}]}]`))
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Errorf("got %q want %q", got, want)
	}
	if _, err := (Bytes{}).RenderChat([]byte(`{}`)); !errors.Is(err, ErrInvalidMessages) {
		t.Errorf("got %v, want ErrInvalidMessages", err)
	}
}
