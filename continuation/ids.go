package continuation

import (
	"errors"

	"github.com/infera/infera/jsonx"
)

// Engine is the kind of engine a leg goes to, as far as token ids go.
type Engine uint8

// The engines that answer with token ids when asked, and the rest.
const (
	EngineOther Engine = iota // ATOM and anything unknown: never asked
	EngineVLLM
	EngineSGLang
)

// maxDepth bounds the nesting of the bodies and chunks read here.
const maxDepth = 64

// ErrNotObject: a body or chunk is not a JSON object.
var ErrNotObject = errors.New("continuation: not a JSON object")

// AsksIDs reports whether engine e accepts "return_token_ids" on the chat
// (chat) or completions endpoint. SGLang rejects the field on streaming
// chat outright, so asking there would turn requests into 400s.
func AsksIDs(e Engine, chat bool) bool {
	switch e {
	case EngineVLLM:
		return true
	case EngineSGLang:
		return !chat
	}
	return false
}

// AskIDs appends to dst the request body with "return_token_ids": true
// as its first member. body is a JSON object without the field (the
// caller's scan of it says so: a client that set the field wants the ids
// and gets them unstripped), so nothing is parsed: a streamed request pays
// one copy of its body, not a read of it.
func AskIDs(dst, body []byte) ([]byte, error) {
	at, field, err := AskIDsAt(body)
	if err != nil {
		return dst, err
	}
	dst = append(dst, body[:at]...)
	dst = append(dst, field...)
	return append(dst, body[at:]...), nil
}

// askIDsField is the member AskIDs puts first; with a comma when others follow.
const askIDsField = `"return_token_ids":true,`

// AskIDsAt is AskIDs without the copy: the body asks for ids with field
// written at offset at (body[:at], field, body[at:]), for a caller that
// writes the three where the body goes (the relay: into the upstream
// connection's writer).
func AskIDsAt(body []byte) (at int, field string, err error) {
	i := jsonx.SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, "", ErrNotObject
	}
	field = askIDsField
	if j := jsonx.SkipSpace(body, i+1); j >= len(body) || body[j] == '}' {
		field = askIDsField[:len(askIDsField)-1]
	}
	return i + 1, field, nil
}
