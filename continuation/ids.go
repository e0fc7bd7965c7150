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

// AskIDs appends to dst the request body with "return_token_ids": true,
// unless the client set the field itself: then the body is copied
// unchanged and added is false (the client wants the ids, so they must not
// be stripped from its chunks).
func AskIDs(dst, body []byte) (out []byte, added bool, err error) {
	has, err := hasField(body, "return_token_ids")
	if err != nil {
		return dst, false, err
	}
	if has {
		return append(dst, body...), false, nil
	}
	out, err = jsonx.SetField(dst, body, "return_token_ids", []byte("true"), maxDepth)
	return out, err == nil, err
}

// hasField reports whether the object body has a top-level member key.
func hasField(body []byte, key string) (bool, error) {
	s := jsonx.Scanner{B: body, MaxDepth: maxDepth}
	s.SkipWS()
	if s.I >= len(body) || body[s.I] != '{' {
		return false, ErrNotObject
	}
	found := false
	err := s.Object(func(ks, ke int, esc bool) error {
		if jsonx.Equal(body[ks:ke], esc, key) {
			found = true
		}
		return s.Value()
	})
	if err == nil {
		err = s.End()
	}
	return found, err
}
