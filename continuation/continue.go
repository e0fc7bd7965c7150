package continuation

import (
	"errors"
	"strconv"

	"github.com/infera/infera/jsonx"
)

// ErrPoisoned: the stream cannot be continued (errors.As to *PoisonError
// for the reason).
var ErrPoisoned = errors.New("continuation: stream cannot be continued")

// PoisonError is ErrPoisoned with its reason.
type PoisonError struct{ Reason Poison }

func (e *PoisonError) Error() string { return ErrPoisoned.Error() + ": " + e.Reason.String() }

// Unwrap makes errors.Is(err, ErrPoisoned) true.
func (e *PoisonError) Unwrap() error { return ErrPoisoned }

var poisonErrors = [...]*PoisonError{
	PoisonChoices:     {PoisonChoices},
	PoisonUnparseable: {PoisonUnparseable},
	PoisonPrompt:      {PoisonPrompt},
	PoisonToolCalls:   {PoisonToolCalls},
}

func poisoned(p Poison) error { return poisonErrors[p] }

// requestFields is what Build reads of a request body.
type requestFields struct {
	n, bestOf        int64 // 1 when absent
	maxTokens        int64 // -1 when absent or null
	maxCompletion    int64
	messages, prompt []byte // raw values
	chatOnly         bool   // tools, functions, tool_choice, function_call or response_format
}

func readRequest(body []byte) (requestFields, error) {
	f := requestFields{n: 1, bestOf: 1, maxTokens: -1, maxCompletion: -1}
	s := jsonx.Scanner{B: body, MaxDepth: maxDepth}
	s.SkipWS()
	if s.I >= len(body) || body[s.I] != '{' {
		return f, ErrNotObject
	}
	err := s.Object(func(ks, ke int, esc bool) error {
		key := body[ks:ke]
		vs := s.I
		if err := s.Value(); err != nil {
			return err
		}
		v := body[vs:s.I]
		switch {
		case jsonx.Equal(key, esc, "n"):
			f.n = intOr(v, 1)
		case jsonx.Equal(key, esc, "best_of"):
			f.bestOf = intOr(v, 1)
		case jsonx.Equal(key, esc, "max_tokens"):
			f.maxTokens = intOr(v, -1)
		case jsonx.Equal(key, esc, "max_completion_tokens"):
			f.maxCompletion = intOr(v, -1)
		case jsonx.Equal(key, esc, "messages"):
			f.messages = v
		case jsonx.Equal(key, esc, "prompt"):
			f.prompt = v
		case jsonx.Equal(key, esc, "tools"), jsonx.Equal(key, esc, "functions"),
			jsonx.Equal(key, esc, "tool_choice"), jsonx.Equal(key, esc, "function_call"),
			jsonx.Equal(key, esc, "response_format"):
			if string(v) != "null" {
				f.chatOnly = true
			}
		}
		return nil
	})
	if err == nil {
		err = s.End()
	}
	return f, err
}

// intOr is the integer v, or def for null and anything else.
func intOr(v []byte, def int64) int64 {
	if n, ok := jsonx.ParseInt(v); ok {
		return n
	}
	return def
}

// Continuable says whether a request's stream may ever be continued, from
// its "n" and "best_of" (1 when absent): a stream of several choices
// cannot.
func Continuable(n, bestOf int64) bool { return n <= 1 && bestOf <= 1 }

// Continuation is a request that continues a broken stream.
type Continuation struct {
	// Body is the request body; Path its endpoint ("/v1/completions" for an
	// exact continuation, else the client's).
	Body []byte
	Path string
	// Exact: prompt ids + output ids; else the delivered text was carried.
	Exact bool
	// Reshape: the answer's completion chunks must be turned into chat
	// chunks for the client (ReshapeChat).
	Reshape bool
	// Produced is the number of tokens already delivered (exact: output
	// ids; text: text chunks).
	Produced int
}

// Options are the facts about the continuation's leg Build needs.
type Options struct {
	// Chat: the client is on /v1/chat/completions (else /v1/completions).
	Chat bool
	// ChatPath and CompletionsPath are the endpoints (default
	// "/v1/chat/completions" and "/v1/completions").
	ChatPath, CompletionsPath string
	// Engine is the engine the continuation goes to: ids are asked of it
	// again (AsksIDs), so that a continuation that breaks in turn can be
	// continued exactly too, and the text path keeps the assistant's turn
	// open (continue_final_message) where the engine supports it.
	Engine Engine
}

// fields a continuation removes from the client's body on the exact path:
// chat-only fields a completion request would reject or misread, and the
// ones it sets anew.
var exactDrop = [...]string{
	"messages", "max_completion_tokens", "logprobs", "top_logprobs", "echo",
	"chat_template", "chat_template_kwargs", "add_generation_prompt",
	"continue_final_message", "return_token_ids",
}

// Build makes the request that continues t's stream, from the client's
// (router-side) body. It fails with a *PoisonError when the stream cannot
// be continued.
func Build(body []byte, t *Tracker, o Options) (Continuation, error) {
	if o.ChatPath == "" {
		o.ChatPath = "/v1/chat/completions"
	}
	if o.CompletionsPath == "" {
		o.CompletionsPath = "/v1/completions"
	}
	if t.Poisoned != PoisonNone {
		return Continuation{}, poisoned(t.Poisoned)
	}
	f, err := readRequest(body)
	if err != nil {
		return Continuation{}, err
	}
	if !Continuable(f.n, f.bestOf) {
		return Continuation{}, poisoned(PoisonChoices)
	}
	exact := t.HasPrompt && t.IDChunks == t.TextChunks && !f.chatOnly &&
		len(t.OutIDs) >= t.TextChunks
	if exact {
		// The prompt's ids are read only now; ids an engine garbled
		// leave the text path.
		if prompt, err := t.PromptIDs(nil); err == nil {
			return buildExact(body, t, prompt, f, o)
		}
	}
	return buildText(body, t, f, o)
}

// limit is the reduced token limit: what was asked minus what was
// produced, at least 1; -1 (none) stays -1.
func limit(asked int64, produced int) int64 {
	if asked < 0 {
		return -1
	}
	return max(asked-int64(produced), 1)
}

func buildExact(body []byte, t *Tracker, prompt []uint32, f requestFields, o Options) (Continuation, error) {
	c := Continuation{Path: o.CompletionsPath, Exact: true, Reshape: o.Chat, Produced: len(t.OutIDs)}
	asked := f.maxTokens
	if o.Chat && f.maxCompletion >= 0 {
		asked = f.maxCompletion
	}
	ids := make([]byte, 0, 8*(len(prompt)+len(t.OutIDs))+2)
	ids = append(ids, '[')
	for i, id := range prompt {
		if i > 0 {
			ids = append(ids, ',')
		}
		ids = strconv.AppendUint(ids, uint64(id), 10)
	}
	for i, id := range t.OutIDs {
		if i > 0 || len(prompt) > 0 {
			ids = append(ids, ',')
		}
		ids = strconv.AppendUint(ids, uint64(id), 10)
	}
	ids = append(ids, ']')
	e := editor{b: body}
	for _, k := range exactDrop {
		e.del(k)
	}
	e.set("prompt", ids)
	if n := limit(asked, c.Produced); n >= 0 {
		e.set("max_tokens", strconv.AppendInt(nil, n, 10))
	}
	if AsksIDs(o.Engine, false) {
		e.set("return_token_ids", []byte("true"))
	}
	c.Body = e.b
	return c, e.err
}

func buildText(body []byte, t *Tracker, f requestFields, o Options) (Continuation, error) {
	if t.ToolsOrReasoning {
		return Continuation{}, poisoned(PoisonToolCalls)
	}
	c := Continuation{Path: o.CompletionsPath, Produced: t.TextChunks}
	e := editor{b: body}
	e.del("return_token_ids")
	if o.Chat {
		c.Path = o.ChatPath
		msgs, err := appendAssistant(f.messages, t.Text)
		if err != nil {
			return Continuation{}, err
		}
		e.set("messages", msgs)
		if o.Engine == EngineVLLM || o.Engine == EngineSGLang {
			// Continue the assistant's message rather than open a new turn.
			e.set("continue_final_message", []byte("true"))
			e.set("add_generation_prompt", []byte("false"))
		}
		if f.maxCompletion >= 0 {
			e.set("max_completion_tokens", strconv.AppendInt(nil, limit(f.maxCompletion, c.Produced), 10))
		}
	} else {
		prompt, err := extendPrompt(f.prompt, t.Text)
		if err != nil {
			return Continuation{}, err
		}
		e.set("prompt", prompt)
		e.del("echo")
	}
	if f.maxTokens >= 0 {
		e.set("max_tokens", strconv.AppendInt(nil, limit(f.maxTokens, c.Produced), 10))
	}
	if AsksIDs(o.Engine, o.Chat) {
		e.set("return_token_ids", []byte("true"))
	}
	c.Body = e.b
	return c, e.err
}

// editor applies top-level field edits one after the other, keeping the
// first error.
type editor struct {
	b   []byte
	err error
}

func (e *editor) set(key string, value []byte) {
	if e.err == nil {
		e.b, e.err = jsonx.SetField(nil, e.b, key, value, maxDepth)
	}
}

func (e *editor) del(key string) {
	if e.err == nil {
		e.b, e.err = jsonx.DeleteField(nil, e.b, key, maxDepth)
	}
}

// appendAssistant returns the messages array msgs with one more message:
// the assistant's delivered text.
func appendAssistant(msgs, text []byte) ([]byte, error) {
	end := len(msgs) - 1
	for end >= 0 && msgs[end] != ']' {
		end--
	}
	if len(msgs) == 0 || msgs[0] != '[' || end <= 0 {
		return nil, poisoned(PoisonUnparseable)
	}
	out := make([]byte, 0, len(msgs)+len(text)+48)
	out = append(out, msgs[:end]...)
	if jsonx.SkipSpace(msgs, 1) != end { // not empty
		out = append(out, ',')
	}
	out = append(out, `{"role":"assistant","content":`...)
	out = jsonx.AppendQuoted(out, text)
	return append(out, "}]"...), nil
}

// extendPrompt returns a completion prompt (a string, or a list of one
// string) with text appended. Token-id prompts cannot take text: the
// stream continues only exactly, with ids.
func extendPrompt(prompt, text []byte) ([]byte, error) {
	s := jsonx.Scanner{B: prompt, MaxDepth: maxDepth}
	var str []byte
	switch {
	case len(prompt) > 0 && prompt[0] == '"':
		st, en, esc, err := s.String()
		if err != nil {
			return nil, err
		}
		str = appendRaw(nil, prompt[st:en], esc)
	case len(prompt) > 0 && prompt[0] == '[':
		n, ok := 0, true
		err := s.Array(func() error {
			n++
			if s.I >= len(prompt) || prompt[s.I] != '"' {
				ok = false
				return s.Value()
			}
			st, en, esc, err := s.String()
			str = appendRaw(str[:0], prompt[st:en], esc)
			return err
		})
		if err != nil {
			return nil, err
		}
		if !ok || n != 1 { // token ids, or a batch of prompts
			return nil, poisoned(PoisonPrompt)
		}
	default:
		return nil, poisoned(PoisonPrompt)
	}
	str = append(str, text...)
	return jsonx.AppendQuoted(nil, str), nil
}

func appendRaw(dst, raw []byte, esc bool) []byte {
	if esc {
		return jsonx.AppendUnescaped(dst, raw)
	}
	return append(dst, raw...)
}

// ReshapeChat appends to dst the chat chunk for a continuation's
// completion chunk (already observed, so without id fields): the stream's
// first id, created and model, the choice's text as delta.content, its
// finish_reason, and the chunk's usage. A chunk that is not a completion
// chunk is appended unchanged.
func ReshapeChat(dst, data []byte, t *Tracker) []byte {
	var text, finish, usage, created, model []byte
	s := jsonx.Scanner{B: data, MaxDepth: maxDepth, Lenient: true}
	s.SkipWS()
	if s.I >= len(data) || data[s.I] != '{' {
		return append(dst, data...)
	}
	hasChoice := false
	err := s.Object(func(ks, ke int, esc bool) error {
		key := data[ks:ke]
		vs := s.I
		if !jsonx.Equal(key, esc, "choices") {
			if err := s.Value(); err != nil {
				return err
			}
			switch v := data[vs:s.I]; {
			case jsonx.Equal(key, esc, "usage"):
				usage = v
			case jsonx.Equal(key, esc, "created"):
				created = v
			case jsonx.Equal(key, esc, "model"):
				model = v
			}
			return nil
		}
		if s.I >= len(data) || data[s.I] != '[' {
			return s.Value()
		}
		return s.Array(func() error {
			if s.I >= len(data) || data[s.I] != '{' || hasChoice {
				return s.Value()
			}
			hasChoice = true
			return s.Object(func(ks, ke int, esc bool) error {
				vs := s.I
				if err := s.Value(); err != nil {
					return err
				}
				switch k := data[ks:ke]; {
				case jsonx.Equal(k, esc, "text"):
					text = data[vs:s.I]
				case jsonx.Equal(k, esc, "finish_reason"):
					finish = data[vs:s.I]
				}
				return nil
			})
		})
	})
	if err != nil {
		return append(dst, data...)
	}
	dst = append(dst, `{"id":`...)
	dst = appendOr(dst, t.ID, `"cmpl-continued"`)
	dst = append(dst, `,"object":"chat.completion.chunk","created":`...)
	dst = appendOr(dst, t.Created, string(orDefault(created, "0")))
	dst = append(dst, `,"model":`...)
	dst = appendOr(dst, t.Model, string(orDefault(model, `""`)))
	dst = append(dst, `,"choices":[`...)
	if hasChoice {
		dst = append(dst, `{"index":0,"delta":{"content":`...)
		dst = append(dst, orDefault(text, `""`)...)
		dst = append(dst, `},"logprobs":null,"finish_reason":`...)
		dst = append(dst, orDefault(finish, "null")...)
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	if usage != nil {
		dst = append(dst, `,"usage":`...)
		dst = append(dst, usage...)
	}
	return append(dst, '}')
}

func appendOr(dst, v []byte, def string) []byte {
	if len(v) > 0 {
		return append(dst, v...)
	}
	return append(dst, def...)
}

func orDefault(v []byte, def string) []byte {
	if len(v) > 0 {
		return v
	}
	return []byte(def)
}
