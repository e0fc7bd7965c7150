package anthropic

import (
	"strconv"

	"github.com/infera/infera/jsonx"
)

// maxDepth bounds nesting in the bodies read here (openai.MaxDepth's value;
// openai is not imported so that the package stays a leaf).
const maxDepth = 128

func itoa(n int) string { return strconv.Itoa(n) }

// RequestInfo is what the translation learned about the request.
type RequestInfo struct {
	// Stream is "stream".
	Stream bool
	// CacheControl counts the cache_control breakpoints; CacheLong is
	// whether one asks for the one-hour TTL.
	CacheControl int
	CacheLong    bool
}

// span is a raw value's byte range in the body; empty: absent.
type span struct{ s, e int }

func (p span) ok() bool { return p.e > p.s }

// topFields are the request members the translation reads.
type topFields struct {
	model, messages, system, maxTokens, stream, temperature, topP, topK,
	stopSequences, metadata, tools, toolChoice span
}

// translator carries one request translation.
type translator struct {
	b    []byte
	dst  []byte
	info RequestInfo
}

func invalid(msg string) error { return &RequestError{Msg: msg, err: ErrInvalidRequest} }

// RequestError is a translation error with a message meant for the client.
type RequestError struct {
	Msg string
	err error
}

func (e *RequestError) Error() string { return e.Msg }

// Unwrap makes errors.Is(err, ErrInvalidRequest) (or ErrUnsupported) hold.
func (e *RequestError) Unwrap() error { return e.err }

// AppendChatRequest appends to dst the OpenAI chat completion request for
// the Anthropic Messages request body:
//
//   - system (a string or text blocks) → a leading system message;
//   - messages: text blocks → content, tool_use blocks → the assistant's
//     tool_calls (input as the arguments string), tool_result blocks →
//     role "tool" messages (before the user's own text);
//   - tools {name, description, input_schema} → functions; tool_choice
//     auto → "auto", any → "required", tool → the named function, none →
//     "none"; disable_parallel_tool_use → parallel_tool_calls false;
//   - stop_sequences → stop; metadata.user_id → user; max_tokens,
//     temperature, top_p, top_k as they are; a stream asks for usage
//     (stream_options.include_usage);
//   - cache_control breakpoints → prompt_cache_retention ("1h" with a
//     one-hour TTL, else "long"): the prefix is worth keeping.
//
// Images, documents and server tools are rejected (ErrUnsupported): the
// engines behind the router are text-only. Other errors wrap
// ErrInvalidRequest, or jsonx.ErrSyntax for malformed JSON.
func AppendChatRequest(dst, body []byte) ([]byte, RequestInfo, error) {
	if err := jsonx.Valid(body, maxDepth); err != nil {
		return dst, RequestInfo{}, err
	}
	t := translator{b: body, dst: dst}
	var f topFields
	s := jsonx.Scanner{B: body, MaxDepth: maxDepth}
	s.SkipWS()
	if s.I >= len(body) || body[s.I] != '{' {
		return dst, RequestInfo{}, invalid("request body must be a JSON object")
	}
	s.Members(func(ks, ke int, kesc bool) bool {
		st := s.I
		_ = s.Value()
		v := span{st, s.I}
		if string(body[st:s.I]) == "null" {
			v = span{}
		}
		switch key := body[ks:ke]; string(key) {
		case "model":
			f.model = v
		case "messages":
			f.messages = v
		case "system":
			f.system = v
		case "max_tokens":
			f.maxTokens = v
		case "stream":
			f.stream = v
		case "temperature":
			f.temperature = v
		case "top_p":
			f.topP = v
		case "top_k":
			f.topK = v
		case "stop_sequences":
			f.stopSequences = v
		case "metadata":
			f.metadata = v
		case "tools":
			f.tools = v
		case "tool_choice":
			f.toolChoice = v
		}
		return true
	})
	if err := t.run(&f); err != nil {
		return dst, RequestInfo{}, err
	}
	return t.dst, t.info, nil
}

func (t *translator) raw(p span) []byte { return t.b[p.s:p.e] }

func (t *translator) kind(p span) byte {
	if !p.ok() {
		return 0
	}
	return t.b[p.s]
}

func (t *translator) isNumber(p span) bool {
	c := t.kind(p)
	return c == '-' || (c >= '0' && c <= '9')
}

func (t *translator) member(key string, p span) {
	t.dst = append(t.dst, ',', '"')
	t.dst = append(t.dst, key...)
	t.dst = append(t.dst, '"', ':')
	t.dst = append(t.dst, t.raw(p)...)
}

func (t *translator) run(f *topFields) error {
	if t.kind(f.model) != '"' || f.model.e-f.model.s <= 2 {
		return invalid("model: a non-empty string is required")
	}
	if !t.isNumber(f.maxTokens) {
		return invalid("max_tokens: an integer is required")
	}
	if n, ok := jsonx.ParseInt(t.raw(f.maxTokens)); !ok || n < 1 {
		return invalid("max_tokens: must be a positive integer")
	}
	if t.kind(f.messages) != '[' {
		return invalid("messages: an array is required")
	}
	t.dst = append(t.dst, `{"model":`...)
	t.dst = append(t.dst, t.raw(f.model)...)
	t.dst = append(t.dst, `,"messages":[`...)
	n := 0
	if f.system.ok() {
		if err := t.system(f.system); err != nil {
			return err
		}
		n++
	}
	if err := t.messages(f.messages, n); err != nil {
		return err
	}
	t.dst = append(t.dst, ']')
	t.member("max_tokens", f.maxTokens)
	if f.stream.ok() {
		switch string(t.raw(f.stream)) {
		case "true":
			t.info.Stream = true
			t.dst = append(t.dst, `,"stream":true,"stream_options":{"include_usage":true}`...)
		case "false":
		default:
			return invalid("stream: must be a boolean")
		}
	}
	for _, num := range [...]struct {
		key string
		p   span
	}{{"temperature", f.temperature}, {"top_p", f.topP}, {"top_k", f.topK}} {
		if !num.p.ok() {
			continue
		}
		if !t.isNumber(num.p) {
			return invalid(num.key + ": must be a number")
		}
		t.member(num.key, num.p)
	}
	if f.stopSequences.ok() {
		if err := t.stop(f.stopSequences); err != nil {
			return err
		}
	}
	if f.metadata.ok() {
		if err := t.metadata(f.metadata); err != nil {
			return err
		}
	}
	if f.tools.ok() {
		if err := t.tools(f.tools); err != nil {
			return err
		}
	}
	if f.toolChoice.ok() {
		if err := t.toolChoice(f.toolChoice); err != nil {
			return err
		}
	}
	if t.info.CacheControl > 0 {
		if t.info.CacheLong {
			t.dst = append(t.dst, `,"prompt_cache_retention":"1h"`...)
		} else {
			t.dst = append(t.dst, `,"prompt_cache_retention":"long"`...)
		}
	}
	t.dst = append(t.dst, '}')
	return nil
}

// scanner returns a scanner on the value p.
func (t *translator) scanner(p span) jsonx.Scanner {
	return jsonx.Scanner{B: t.b[:p.e], I: p.s, MaxDepth: maxDepth}
}

// block is one content block's members.
type block struct {
	typ, text, id, name, input, toolUseID, content, isError, cacheControl span
}

// readBlock reads the content block object at p.
func (t *translator) readBlock(p span) (block, error) {
	var bl block
	if t.kind(p) != '{' {
		return bl, invalid("content blocks must be objects")
	}
	s := t.scanner(p)
	b := t.b
	s.Members(func(ks, ke int, _ bool) bool {
		st := s.I
		_ = s.Value()
		v := span{st, s.I}
		if string(b[st:s.I]) == "null" {
			v = span{}
		}
		switch string(b[ks:ke]) {
		case "type":
			bl.typ = v
		case "text":
			bl.text = v
		case "id":
			bl.id = v
		case "name":
			bl.name = v
		case "input":
			bl.input = v
		case "tool_use_id":
			bl.toolUseID = v
		case "content":
			bl.content = v
		case "is_error":
			bl.isError = v
		case "cache_control":
			bl.cacheControl = v
		}
		return true
	})
	if t.kind(bl.typ) != '"' {
		return bl, invalid("content block: type is required")
	}
	if bl.cacheControl.ok() {
		t.cacheControl(bl.cacheControl)
	}
	return bl, nil
}

// cacheControl notes a breakpoint {"type":"ephemeral","ttl":…}.
func (t *translator) cacheControl(p span) {
	t.info.CacheControl++
	if t.kind(p) != '{' {
		return
	}
	s := t.scanner(p)
	b := t.b
	s.Members(func(ks, ke int, _ bool) bool {
		st := s.I
		_ = s.Value()
		if string(b[ks:ke]) == "ttl" && string(b[st:s.I]) == `"1h"` {
			t.info.CacheLong = true
		}
		return true
	})
}

func (t *translator) typeIs(bl *block, name string) bool {
	return string(t.raw(bl.typ)) == `"`+name+`"`
}

// unsupported answers a block the engines cannot take.
func (t *translator) unsupported(bl *block) error {
	typ := t.raw(bl.typ)
	return &RequestError{Msg: "content blocks of type " + string(typ) + " are not supported: the engines serving this model are text-only", err: ErrUnsupported}
}

// each calls fn on each element of the array at p.
func (t *translator) each(p span, fn func(el span) error) error {
	s := t.scanner(p)
	var err error
	s.Elements(func() bool {
		st := s.I
		_ = s.Value()
		err = fn(span{st, s.I})
		return err == nil
	})
	return err
}

// system appends the leading system message.
func (t *translator) system(p span) error {
	t.dst = append(t.dst, `{"role":"system","content":`...)
	switch t.kind(p) {
	case '"':
		t.dst = append(t.dst, t.raw(p)...)
	case '[':
		if err := t.textParts(p, "system"); err != nil {
			return err
		}
	default:
		return invalid("system: must be a string or an array of text blocks")
	}
	t.dst = append(t.dst, '}')
	return nil
}

// textParts appends the text blocks of the array at p as one string
// (joined by newlines; a single block's string is copied as it is).
func (t *translator) textParts(p span, what string) error {
	var texts [8]span
	list := texts[:0]
	err := t.each(p, func(el span) error {
		bl, err := t.readBlock(el)
		if err != nil {
			return err
		}
		if !t.typeIs(&bl, "text") {
			if t.typeIs(&bl, "image") || t.typeIs(&bl, "document") {
				return t.unsupported(&bl)
			}
			return invalid(what + ": only text blocks are allowed here")
		}
		if t.kind(bl.text) != '"' {
			return invalid(what + ": text block without text")
		}
		list = append(list, bl.text)
		return nil
	})
	if err != nil {
		return err
	}
	t.joinTexts(list)
	return nil
}

// joinTexts appends the texts as one JSON string.
func (t *translator) joinTexts(list []span) {
	if len(list) == 1 {
		t.dst = append(t.dst, t.raw(list[0])...)
		return
	}
	t.dst = append(t.dst, '"')
	for i, p := range list {
		if i > 0 {
			t.dst = append(t.dst, `\n`...)
		}
		t.dst = append(t.dst, t.b[p.s+1:p.e-1]...)
	}
	t.dst = append(t.dst, '"')
}

// messages appends the conversation; n messages precede it.
func (t *translator) messages(p span, n int) error {
	count := 0
	err := t.each(p, func(el span) error {
		if t.kind(el) != '{' {
			return invalid("messages: each message must be an object")
		}
		var role, content span
		s := t.scanner(el)
		b := t.b
		s.Members(func(ks, ke int, _ bool) bool {
			st := s.I
			_ = s.Value()
			switch string(b[ks:ke]) {
			case "role":
				role = span{st, s.I}
			case "content":
				content = span{st, s.I}
			}
			return true
		})
		count++
		switch string(t.raw(role)) {
		case `"user"`:
			return t.userMessage(content, &n)
		case `"assistant"`:
			return t.assistantMessage(content, &n)
		}
		return invalid(`messages: role must be "user" or "assistant"`)
	})
	if err == nil && count == 0 {
		return invalid("messages: at least one message is required")
	}
	return err
}

func (t *translator) sep(n *int) {
	if *n > 0 {
		t.dst = append(t.dst, ',')
	}
	*n++
}

// userMessage: tool results first (each a "tool" message), then the text.
func (t *translator) userMessage(content span, n *int) error {
	switch t.kind(content) {
	case '"':
		t.sep(n)
		t.dst = append(t.dst, `{"role":"user","content":`...)
		t.dst = append(t.dst, t.raw(content)...)
		t.dst = append(t.dst, '}')
		return nil
	case '[':
	default:
		return invalid("messages: content must be a string or an array of blocks")
	}
	var texts [8]span
	list := texts[:0]
	err := t.each(content, func(el span) error {
		bl, err := t.readBlock(el)
		if err != nil {
			return err
		}
		switch {
		case t.typeIs(&bl, "text"):
			if t.kind(bl.text) != '"' {
				return invalid("messages: text block without text")
			}
			list = append(list, bl.text)
		case t.typeIs(&bl, "tool_result"):
			if t.kind(bl.toolUseID) != '"' {
				return invalid("messages: tool_result without tool_use_id")
			}
			t.sep(n)
			t.dst = append(t.dst, `{"role":"tool","tool_call_id":`...)
			t.dst = append(t.dst, t.raw(bl.toolUseID)...)
			t.dst = append(t.dst, `,"content":`...)
			switch t.kind(bl.content) {
			case '"':
				t.dst = append(t.dst, t.raw(bl.content)...)
			case '[':
				if err := t.textParts(bl.content, "tool_result"); err != nil {
					return err
				}
			case 0:
				t.dst = append(t.dst, `""`...)
			default:
				return invalid("messages: tool_result content must be a string or text blocks")
			}
			t.dst = append(t.dst, '}')
		case t.typeIs(&bl, "image"), t.typeIs(&bl, "document"):
			return t.unsupported(&bl)
		default:
			return invalid("messages: user content block of type " + string(t.raw(bl.typ)) + " is not supported")
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(list) > 0 {
		t.sep(n)
		t.dst = append(t.dst, `{"role":"user","content":`...)
		t.joinTexts(list)
		t.dst = append(t.dst, '}')
	}
	return nil
}

// assistantMessage: text blocks → content, tool_use blocks → tool_calls.
func (t *translator) assistantMessage(content span, n *int) error {
	t.sep(n)
	t.dst = append(t.dst, `{"role":"assistant","content":`...)
	switch t.kind(content) {
	case '"':
		t.dst = append(t.dst, t.raw(content)...)
		t.dst = append(t.dst, '}')
		return nil
	case '[':
	default:
		return invalid("messages: content must be a string or an array of blocks")
	}
	var texts, tools [8]span
	list, calls := texts[:0], tools[:0]
	err := t.each(content, func(el span) error {
		bl, err := t.readBlock(el)
		if err != nil {
			return err
		}
		switch {
		case t.typeIs(&bl, "text"):
			if t.kind(bl.text) != '"' {
				return invalid("messages: text block without text")
			}
			list = append(list, bl.text)
		case t.typeIs(&bl, "tool_use"):
			if t.kind(bl.id) != '"' || t.kind(bl.name) != '"' {
				return invalid("messages: tool_use needs an id and a name")
			}
			if k := t.kind(bl.input); k != '{' && k != 0 {
				return invalid("messages: tool_use input must be an object")
			}
			calls = append(calls, el)
		case t.typeIs(&bl, "thinking"), t.typeIs(&bl, "redacted_thinking"):
			// Reasoning of an earlier turn: not part of the prompt.
		case t.typeIs(&bl, "image"), t.typeIs(&bl, "document"):
			return t.unsupported(&bl)
		default:
			return invalid("messages: assistant content block of type " + string(t.raw(bl.typ)) + " is not supported")
		}
		return nil
	})
	if err != nil {
		return err
	}
	switch {
	case len(list) > 0:
		t.joinTexts(list)
	case len(calls) > 0:
		t.dst = append(t.dst, "null"...)
	default:
		t.dst = append(t.dst, `""`...)
	}
	if len(calls) > 0 {
		t.dst = append(t.dst, `,"tool_calls":[`...)
		for i, el := range calls {
			bl, _ := t.readBlock(el)
			t.info.CacheControl -= btoi(bl.cacheControl.ok()) // counted once
			if i > 0 {
				t.dst = append(t.dst, ',')
			}
			t.dst = append(t.dst, `{"id":`...)
			t.dst = append(t.dst, t.raw(bl.id)...)
			t.dst = append(t.dst, `,"type":"function","function":{"name":`...)
			t.dst = append(t.dst, t.raw(bl.name)...)
			t.dst = append(t.dst, `,"arguments":`...)
			if bl.input.ok() {
				t.dst = jsonx.AppendQuoted(t.dst, t.raw(bl.input))
			} else {
				t.dst = append(t.dst, `"{}"`...)
			}
			t.dst = append(t.dst, "}}"...)
		}
		t.dst = append(t.dst, ']')
	}
	t.dst = append(t.dst, '}')
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// stop: stop_sequences (an array of strings) → stop.
func (t *translator) stop(p span) error {
	if t.kind(p) != '[' {
		return invalid("stop_sequences: must be an array of strings")
	}
	err := t.each(p, func(el span) error {
		if t.kind(el) != '"' {
			return invalid("stop_sequences: must be an array of strings")
		}
		return nil
	})
	if err != nil {
		return err
	}
	t.member("stop", p)
	return nil
}

// metadata: user_id → user.
func (t *translator) metadata(p span) error {
	if t.kind(p) != '{' {
		return invalid("metadata: must be an object")
	}
	s := t.scanner(p)
	b := t.b
	var user span
	s.Members(func(ks, ke int, _ bool) bool {
		st := s.I
		_ = s.Value()
		if string(b[ks:ke]) == "user_id" {
			user = span{st, s.I}
		}
		return true
	})
	switch t.kind(user) {
	case 0, 'n':
	case '"':
		t.member("user", user)
	default:
		return invalid("metadata.user_id: must be a string")
	}
	return nil
}

// tools: {name, description, input_schema} → {"type":"function","function":{…}}.
func (t *translator) tools(p span) error {
	if t.kind(p) != '[' {
		return invalid("tools: must be an array")
	}
	t.dst = append(t.dst, `,"tools":[`...)
	i := 0
	err := t.each(p, func(el span) error {
		if t.kind(el) != '{' {
			return invalid("tools: each tool must be an object")
		}
		var name, desc, schema, typ, cc span
		s := t.scanner(el)
		b := t.b
		s.Members(func(ks, ke int, _ bool) bool {
			st := s.I
			_ = s.Value()
			v := span{st, s.I}
			switch string(b[ks:ke]) {
			case "name":
				name = v
			case "description":
				desc = v
			case "input_schema":
				schema = v
			case "type":
				typ = v
			case "cache_control":
				cc = v
			}
			return true
		})
		if typ.ok() && string(t.raw(typ)) != `"custom"` && string(t.raw(typ)) != "null" {
			return &RequestError{Msg: "tools: server tools (type " + string(t.raw(typ)) + ") are not supported", err: ErrUnsupported}
		}
		if t.kind(name) != '"' {
			return invalid("tools: each tool needs a name")
		}
		if t.kind(schema) != '{' {
			return invalid("tools: each tool needs an input_schema object")
		}
		if cc.ok() && string(t.raw(cc)) != "null" {
			t.cacheControl(cc)
		}
		if i > 0 {
			t.dst = append(t.dst, ',')
		}
		i++
		t.dst = append(t.dst, `{"type":"function","function":{"name":`...)
		t.dst = append(t.dst, t.raw(name)...)
		if t.kind(desc) == '"' {
			t.dst = append(t.dst, `,"description":`...)
			t.dst = append(t.dst, t.raw(desc)...)
		}
		t.dst = append(t.dst, `,"parameters":`...)
		t.dst = append(t.dst, t.raw(schema)...)
		t.dst = append(t.dst, "}}"...)
		return nil
	})
	if err != nil {
		return err
	}
	t.dst = append(t.dst, ']')
	return nil
}

// toolChoice: auto → "auto", any → "required", tool → the named function,
// none → "none"; disable_parallel_tool_use → parallel_tool_calls false.
func (t *translator) toolChoice(p span) error {
	if t.kind(p) != '{' {
		return invalid("tool_choice: must be an object")
	}
	var typ, name, dis span
	s := t.scanner(p)
	b := t.b
	s.Members(func(ks, ke int, _ bool) bool {
		st := s.I
		_ = s.Value()
		v := span{st, s.I}
		switch string(b[ks:ke]) {
		case "type":
			typ = v
		case "name":
			name = v
		case "disable_parallel_tool_use":
			dis = v
		}
		return true
	})
	switch string(t.raw(typ)) {
	case `"auto"`:
		t.dst = append(t.dst, `,"tool_choice":"auto"`...)
	case `"any"`:
		t.dst = append(t.dst, `,"tool_choice":"required"`...)
	case `"none"`:
		t.dst = append(t.dst, `,"tool_choice":"none"`...)
	case `"tool"`:
		if t.kind(name) != '"' {
			return invalid("tool_choice: type tool needs a name")
		}
		t.dst = append(t.dst, `,"tool_choice":{"type":"function","function":{"name":`...)
		t.dst = append(t.dst, t.raw(name)...)
		t.dst = append(t.dst, "}}"...)
	default:
		return invalid(`tool_choice: type must be "auto", "any", "tool" or "none"`)
	}
	switch string(t.raw(dis)) {
	case "true":
		t.dst = append(t.dst, `,"parallel_tool_calls":false`...)
	case "", "false", "null":
	default:
		return invalid("tool_choice.disable_parallel_tool_use: must be a boolean")
	}
	return nil
}
