package sim

import "github.com/infera/infera/tokenizer"

// The simulator tokenizes with the "bytes" tokenizer: every byte of the text
// is one token whose id is the byte value (vocabulary size 256). Chat
// messages are first rendered with a fixed ChatML-like template:
//
//	<|im_start|>{role}\n{content}<|im_end|>\n      for each message
//	<|im_start|>assistant\n                        when add_generation_prompt (default true)
//
// content is a string, null (empty) or a list of {"type":"text","text":...}
// parts, which are joined with "\n" as vLLM does. The rendering is the
// router's bytes tokenizer's (tokenizer.Bytes). The rendering is deterministic, so equal
// conversation prefixes give equal token prefixes and hit the prefix cache,
// as they do with a real model's chat template. --tokenizer DIR replaces
// both with a Hugging Face tokenizer and its template (hftok.go).

// TokenizeBytes appends the bytes-tokenizer token ids of text to dst (the
// router's tokenizer.Bytes ids).
func TokenizeBytes(dst []uint32, text []byte) []uint32 { return tokenizer.AppendByteIDs(dst, text) }

// genPrompt is what add_generation_prompt appends; the bytes tokenizer's
// rendering always ends with it.
const genPrompt = "<|im_start|>assistant\n"

// renderChat appends the template rendering of a validated "messages" array
// to text. It renders with the router's bytes tokenizer
// (tokenizer.Bytes.AppendRenderChat), so that the router's kv-aware policy
// and the simulator's prefix cache see the same tokens; checkChat first
// rejects what the simulator does not serve, with OpenAI-style messages.
func renderChat(text, body []byte, msgs span, addGenPrompt bool) ([]byte, error) {
	if err := checkChat(body, msgs); err != nil {
		return text, err
	}
	n := len(text)
	out, err := tokenizer.Bytes{}.AppendRenderChat(text, tokenizer.Chat{Messages: body[msgs.start:msgs.end]})
	if err != nil {
		return text[:n], badRequest("messages: %v", err)
	}
	if !addGenPrompt {
		out = out[:len(out)-len(genPrompt)]
	}
	return out, nil
}

// checkChat validates a "messages" array: objects with a string role and a
// content that is a string, null or a list of text parts.
func checkChat(body []byte, msgs span) error {
	s := newScanner(body[:msgs.end], msgs.start)
	var err error
	count := 0
	s.array(func() bool {
		count++
		if s.peek() != '{' {
			err = badRequest("messages[%d] must be an object", count-1)
			return false
		}
		var content span
		var hasRole bool
		s.object(func(ks, ke int, kesc bool) bool {
			switch {
			case keyIs(body, ks, ke, kesc, "role"):
				if _, _, _, ok := s.str(); !ok {
					err = badRequest("messages[%d].role must be a string", count-1)
					return false
				}
				hasRole = true
				return true
			case keyIs(body, ks, ke, kesc, "content"):
				st := s.peekPos()
				if !s.skip() {
					return false
				}
				content = span{st, s.I}
				return true
			}
			return s.skip()
		})
		if err != nil {
			return false
		}
		if !hasRole {
			err = badRequest("messages[%d].role is required", count-1)
			return false
		}
		if !content.empty() {
			err = checkContent(body, content, count-1)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	if count == 0 {
		return badRequest("messages must not be empty")
	}
	return nil
}

// checkContent validates one message's content value.
func checkContent(body []byte, v span, idx int) error {
	s := newScanner(body[:v.end], v.start)
	switch s.peek() {
	case '"', 'n':
		return nil
	case '[':
	default:
		return badRequest("messages[%d].content must be a string, null or a list of parts", idx)
	}
	var err error
	s.array(func() bool {
		if s.peek() != '{' {
			err = badRequest("messages[%d].content parts must be objects", idx)
			return false
		}
		var isText, hasText bool
		s.object(func(ks, ke int, kesc bool) bool {
			switch {
			case keyIs(body, ks, ke, kesc, "type"):
				st, en, esc, ok := s.str()
				if !ok {
					err = badRequest("messages[%d].content[].type must be a string", idx)
					return false
				}
				isText = keyIs(body, st, en, esc, "text")
				return true
			case keyIs(body, ks, ke, kesc, "text"):
				if _, _, _, ok := s.str(); !ok {
					err = badRequest("messages[%d].content[].text must be a string", idx)
					return false
				}
				hasText = true
				return true
			}
			return s.skip()
		})
		if err == nil && (!isText || !hasText) {
			err = badRequest("messages[%d].content: the simulator accepts only text parts", idx)
		}
		return err == nil
	})
	return err
}
