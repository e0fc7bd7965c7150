package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ardanlabs/jinja"
)

// chatTemplate is a compiled chat template plus the special-token strings
// the template may reference. Compiled templates are safe to render
// concurrently (each render gets its own scope).
type chatTemplate struct {
	tmpl   *jinja.Template
	tokens map[string]string // bos_token, eos_token, unk_token, pad_token
	native nativeRenderer    // compiled form of a known template; nil: none
}

// jsonConfig is the part of tokenizer_config.json the chat template needs.
type jsonConfig struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
	UNKToken     json.RawMessage `json:"unk_token"`
	PADToken     json.RawMessage `json:"pad_token"`
}

// loadChatTemplate reads the template of dir: chat_template.jinja when
// present (newer transformers save it there, and it wins), else
// tokenizer_config.json's chat_template, a string or a list of
// {name, template} of which "default" is used. No template is not an error;
// RenderChat then fails with ErrNoChatTemplate.
func loadChatTemplate(dir string) (*chatTemplate, error) {
	var cfg jsonConfig
	raw, err := readLimited(filepath.Join(dir, fileConfig))
	switch {
	case err == nil:
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return nil, fmt.Errorf("decode %s: %w: %w", fileConfig, ErrInvalidTokenizer, err)
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return nil, err
	}
	source := ""
	jinjaFile, err := readLimited(filepath.Join(dir, fileChatTemplate))
	switch {
	case err == nil:
		source = string(jinjaFile)
	case errors.Is(err, os.ErrNotExist):
		if source, err = configTemplate(cfg.ChatTemplate); err != nil {
			return nil, err
		}
	default:
		return nil, err
	}
	if source == "" {
		return nil, nil
	}
	tokens := map[string]string{}
	for name, rawTok := range map[string]json.RawMessage{
		"bos_token": cfg.BOSToken, "eos_token": cfg.EOSToken,
		"unk_token": cfg.UNKToken, "pad_token": cfg.PADToken,
	} {
		s, err := tokenString(rawTok)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", fileConfig, name, err)
		}
		if s != "" {
			tokens[name] = s
		}
	}
	return compileChatTemplate(source, tokens)
}

func compileChatTemplate(source string, tokens map[string]string) (*chatTemplate, error) {
	tmpl, err := jinja.Compile(source)
	if err != nil {
		return nil, fmt.Errorf("compile chat template: %w: %w", ErrTemplate, err)
	}
	return &chatTemplate{tmpl: tmpl, tokens: tokens, native: nativeRendererFor(source)}, nil
}

func configTemplate(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("chat_template: %w: %w", ErrInvalidTokenizer, err)
		}
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("chat_template is neither a string nor a list of {name, template}: %w: %w", ErrInvalidTokenizer, err)
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", nil
}

// tokenString reads a special token given as a string, null, or an object
// with "content" (an AddedToken as transformers serializes it).
func tokenString(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("%w: %w", ErrInvalidTokenizer, err)
		}
		return s, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidTokenizer, err)
	}
	return obj.Content, nil
}

// HasChatTemplate reports whether RenderChat can render.
func (t *HF) HasChatTemplate() bool { return t.chat != nil }

// Chat is what a chat request contributes to its prompt, as raw JSON taken
// from the request body.
type Chat struct {
	// Messages is the OpenAI-style messages array (required).
	Messages []byte
	// Tools is the request's tools array, which templates such as Qwen3's
	// write into the system turn; nil or null when absent.
	Tools []byte
	// Kwargs is the request's chat_template_kwargs object (vLLM and SGLang
	// pass it to the template, e.g. {"enable_thinking": false}); nil or null
	// when absent. It may not set messages or tools.
	Kwargs []byte
}

// RenderChat renders messages, an OpenAI-style JSON array, with the model's
// chat template and add_generation_prompt=true.
func (t *HF) RenderChat(messages []byte) (string, error) {
	return t.RenderChatRequest(Chat{Messages: messages})
}

// RenderChatRequest renders a chat request with the model's chat template and
// add_generation_prompt=true (unless Kwargs sets it).
func (t *HF) RenderChatRequest(c Chat) (string, error) {
	if t.chat == nil {
		return "", ErrNoChatTemplate
	}
	return t.chat.render(c)
}

// render renders chat with the compiled form when it accepts chat, else
// with the template engine.
func (c *chatTemplate) render(chat Chat) (string, error) {
	if c.native != nil {
		if out, ok := c.native(nil, chat); ok {
			return string(out), nil
		}
	}
	return c.renderTemplate(chat)
}

var _ ChatAppender = (*HF)(nil)

// AppendRenderChat appends RenderChatRequest's rendering of c to dst. A
// template with a compiled form (Qwen3's, see qwen3chat.go) renders common
// chats straight into dst without allocating; anything else goes through
// the template engine, which allocates.
func (t *HF) AppendRenderChat(dst []byte, c Chat) ([]byte, error) {
	if t.chat == nil {
		return dst, ErrNoChatTemplate
	}
	if t.chat.native != nil {
		if out, ok := t.chat.native(dst, c); ok {
			return out, nil
		}
	}
	s, err := t.chat.renderTemplate(c)
	if err != nil {
		return dst, err
	}
	return append(dst, s...), nil
}

func isNullJSON(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || bytes.Equal(b, []byte("null"))
}

// renderTemplate renders chat with the template engine.
func (c *chatTemplate) renderTemplate(chat Chat) (string, error) {
	msgs, err := parseMessages(chat.Messages)
	if err != nil {
		return "", err
	}
	data := make(map[string]jinja.Value, 8)
	data["add_generation_prompt"] = jinja.NewBool(true)
	for k, v := range c.tokens {
		data[k] = jinja.NewString(v)
	}
	if !isNullJSON(chat.Kwargs) {
		kw, err := parseJSONValue(chat.Kwargs)
		if err != nil {
			return "", fmt.Errorf("chat_template_kwargs: %w", err)
		}
		if !kw.IsDict() {
			return "", fmt.Errorf("chat_template_kwargs is not an object: %w", ErrInvalidMessages)
		}
		d := kw.AsDict()
		for _, k := range d.Keys {
			if k == "messages" || k == "tools" {
				return "", fmt.Errorf("chat_template_kwargs may not set %q: %w", k, ErrInvalidMessages)
			}
			data[k] = d.Data[k]
		}
	}
	data["messages"] = msgs
	if !isNullJSON(chat.Tools) {
		tv, err := parseJSONValue(chat.Tools)
		if err != nil {
			return "", fmt.Errorf("tools: %w", err)
		}
		if !tv.IsList() {
			return "", fmt.Errorf("tools is not an array: %w", ErrInvalidMessages)
		}
		data["tools"] = tv
	}
	out, err := c.tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("render chat template: %w: %w", ErrTemplate, err)
	}
	return out, nil
}

// maxJSONDepth bounds nesting in messages and tools, which come from clients.
const maxJSONDepth = 64

// parseMessages decodes a messages array into template values, keeping the
// key order of objects (tojson output must match Python's) and flattening
// content given as parts: text parts are joined with "\n" as vLLM does for
// templates that expect string content; other parts (images) carry no text.
func parseMessages(raw []byte) (jinja.Value, error) {
	v, err := parseJSONValue(raw)
	if err != nil {
		return v, err
	}
	return normalizeMessages(v)
}

// normalizeMessages checks decoded messages and flattens list contents.
func normalizeMessages(v jinja.Value) (jinja.Value, error) {
	if !v.IsList() {
		return v, fmt.Errorf("messages is not an array: %w", ErrInvalidMessages)
	}
	for i, m := range v.AsList().Items {
		if !m.IsDict() {
			return v, fmt.Errorf("message %d is not an object: %w", i, ErrInvalidMessages)
		}
		d := m.AsDict()
		role, ok := d.Get("role")
		if !ok || !role.IsString() {
			return v, fmt.Errorf("message %d has no string role: %w", i, ErrInvalidMessages)
		}
		content, ok := d.Get("content")
		if ok && content.IsList() {
			d.Set("content", jinja.NewString(joinTextParts(content.AsList())))
		}
	}
	return v, nil
}

func joinTextParts(parts *jinja.List) string {
	var sb strings.Builder
	n := 0
	for _, p := range parts.Items {
		if !p.IsDict() {
			continue
		}
		d := p.AsDict()
		if typ, _ := d.Get("type"); !typ.IsString() || typ.AsString() != "text" {
			continue
		}
		text, _ := d.Get("text")
		if n > 0 {
			sb.WriteByte('\n')
		}
		sb.WriteString(valueText(text))
		n++
	}
	return sb.String()
}

// valueText is a value as the template would print it when it is a string,
// and empty otherwise.
func valueText(v jinja.Value) string {
	if v.IsString() {
		return v.AsString()
	}
	return ""
}

// parseJSONValue decodes raw into template values exactly as
// encoding/json's decoder would (json.Number for numbers, invalid UTF-8 as
// U+FFFD, up to maxJSONDepth nested objects and arrays, key order kept, the last of duplicate
// keys winning), in one validating pass and one building pass: a chat
// request is decoded on every routing decision, so this is hot.
func parseJSONValue(raw []byte) (jinja.Value, error) {
	w := newChatWalk(raw)
	if err := w.validate(); err != nil {
		return jinja.Undefined(), err
	}
	w.I = 0
	return w.build(), nil
}

// build returns the validated value at w.i as a template value.
func (w *chatWalk) build() jinja.Value {
	w.SkipWS()
	switch c := w.B[w.I]; c {
	case '[':
		var items []jinja.Value
		_ = w.Array(func() error {
			items = append(items, w.build())
			return nil
		})
		return jinja.NewList(items)
	case '{':
		d := jinja.NewDict()
		dict := d.AsDict()
		w.members(func(key jsonSpan) {
			k := string(w.appendString(nil, key))
			dict.Set(k, w.build())
		})
		return d
	case '"':
		start := w.I
		_, _, _, _ = w.String()
		return jinja.NewString(string(w.appendString(nil, jsonSpan{start: start, end: w.I})))
	case 't':
		w.I += 4
		return jinja.NewBool(true)
	case 'f':
		w.I += 5
		return jinja.NewBool(false)
	case 'n':
		w.I += 4
		return jinja.None()
	}
	start := w.I
	_ = w.Number()
	return jinja.FromGoValue(json.Number(w.B[start:w.I]))
}
