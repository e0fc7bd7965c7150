package sim

import "github.com/infera/infera/openai"

// The simulator tokenizes with the "bytes" tokenizer: every byte of the text
// is one token whose id is the byte value (vocabulary size 256). Chat
// messages are first rendered with a fixed ChatML-like template:
//
//	<|im_start|>{role}\n{content}<|im_end|>\n      for each message
//	<|im_start|>assistant\n                        when add_generation_prompt (default true)
//
// content is a string, null (empty) or a list of {"type":"text","text":...}
// parts, which are concatenated. The rendering is deterministic, so equal
// conversation prefixes give equal token prefixes and hit the prefix cache,
// as they do with a real model's chat template. --tokenizer DIR replaces
// both with a Hugging Face tokenizer and its template (hftok.go).

// TokenizeBytes appends the bytes-tokenizer token ids of text to dst.
func TokenizeBytes(dst []uint32, text []byte) []uint32 {
	n := len(dst)
	if cap(dst)-n < len(text) {
		grown := make([]uint32, n, n+len(text)+len(text)/2)
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:n+len(text)]
	out := dst[n:]
	for i, c := range text {
		out[i] = uint32(c)
	}
	return dst
}

const (
	imStart = "<|im_start|>"
	imEnd   = "<|im_end|>\n"
)

// renderChat appends the template rendering of a validated "messages" array
// to text.
func renderChat(text, body []byte, msgs span, addGenPrompt bool) ([]byte, error) {
	s := scanner{b: body[:msgs.end], i: msgs.start}
	var err error
	count := 0
	s.array(func() bool {
		count++
		if s.peek() != '{' {
			err = badRequest("messages[%d] must be an object", count-1)
			return false
		}
		var role, content span
		var roleEsc, hasRole bool
		s.object(func(ks, ke int, kesc bool) bool {
			switch {
			case keyIs(body, ks, ke, kesc, "role"):
				st, en, esc, ok := s.str()
				if !ok {
					err = badRequest("messages[%d].role must be a string", count-1)
					return false
				}
				role, roleEsc, hasRole = span{st, en}, esc, true
				return true
			case keyIs(body, ks, ke, kesc, "content"):
				st := s.peekPos()
				if !s.skip() {
					return false
				}
				content = span{st, s.i}
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
		text = append(text, imStart...)
		text = appendRaw(text, body[role.start:role.end], roleEsc)
		text = append(text, '\n')
		if !content.empty() {
			text, err = appendContent(text, body, content, count-1)
			if err != nil {
				return false
			}
		}
		text = append(text, imEnd...)
		return true
	})
	if err != nil {
		return text, err
	}
	if count == 0 {
		return text, badRequest("messages must not be empty")
	}
	if addGenPrompt {
		text = append(text, imStart+"assistant\n"...)
	}
	return text, nil
}

// appendContent renders one message's content value.
func appendContent(text, body []byte, v span, idx int) ([]byte, error) {
	s := scanner{b: body[:v.end], i: v.start}
	switch s.peek() {
	case '"':
		st, en, esc, _ := s.str()
		return appendRaw(text, body[st:en], esc), nil
	case 'n':
		return text, nil
	case '[':
	default:
		return text, badRequest("messages[%d].content must be a string, null or a list of parts", idx)
	}
	var err error
	s.array(func() bool {
		if s.peek() != '{' {
			err = badRequest("messages[%d].content parts must be objects", idx)
			return false
		}
		var partText span
		var textEsc, isText, hasText bool
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
				st, en, esc, ok := s.str()
				if !ok {
					err = badRequest("messages[%d].content[].text must be a string", idx)
					return false
				}
				partText, textEsc, hasText = span{st, en}, esc, true
				return true
			}
			return s.skip()
		})
		if err != nil {
			return false
		}
		if !isText || !hasText {
			err = badRequest("messages[%d].content: the simulator accepts only text parts", idx)
			return false
		}
		text = appendRaw(text, body[partText.start:partText.end], textEsc)
		return true
	})
	return text, err
}

// appendRaw appends a raw JSON string's contents, decoding escapes if any.
func appendRaw(dst, raw []byte, esc bool) []byte {
	if esc {
		return openai.AppendUnescaped(dst, raw)
	}
	return append(dst, raw...)
}
