package tokenizer

import (
	"fmt"
	"unicode/utf8"
)

// ChatAppender is implemented by tokenizers that can render a chat into a
// caller's buffer without allocating; the router's hot path prefers it to
// RenderChatRequest. The output is identical to RenderChatRequest's.
type ChatAppender interface {
	AppendRenderChat(dst []byte, c Chat) ([]byte, error)
}

var _ ChatAppender = Bytes{}

// AppendRenderChat appends the ChatML rendering of c.Messages (see
// RenderChat) to dst. It walks the raw JSON once and allocates nothing
// unless dst must grow (or an error is returned). It accepts and rejects
// exactly the documents RenderChat does, decoding strings as encoding/json
// does (invalid UTF-8 becomes U+FFFD); error messages may differ.
func (Bytes) AppendRenderChat(dst []byte, c Chat) ([]byte, error) {
	w := chatWalk{b: c.Messages}
	w.ws()
	if w.i >= len(w.b) {
		return dst, fmt.Errorf("%w: empty messages", ErrInvalidMessages)
	}
	if w.b[w.i] != '[' {
		// Still a syntax error first if the value is not even JSON.
		if err := w.value(0); err != nil {
			return dst, err
		}
		return dst, fmt.Errorf("messages is not an array: %w", ErrInvalidMessages)
	}
	// First pass: validate the whole document as the decoder of
	// RenderChat would, so that the result (success or failure) agrees.
	if err := w.value(0); err != nil {
		return dst, err
	}
	w.ws()
	if w.i != len(w.b) {
		return dst, fmt.Errorf("trailing data after JSON value: %w", ErrInvalidMessages)
	}
	// Second pass: render.
	w.i = 0
	w.ws()
	w.i++ // '['
	for idx := 0; ; idx++ {
		w.ws()
		if w.b[w.i] == ']' {
			break
		}
		if w.b[w.i] == ',' {
			w.i++
			w.ws()
		}
		if w.b[w.i] != '{' {
			return dst, fmt.Errorf("message %d is not an object: %w", idx, ErrInvalidMessages)
		}
		var role, content jsonSpan
		w.members(func(key jsonSpan) {
			switch {
			case w.keyIs(key, "role"):
				role = w.span()
			case w.keyIs(key, "content"):
				content = w.span()
			default:
				w.skip()
			}
		})
		if role.start == 0 || w.b[role.start] != '"' {
			return dst, fmt.Errorf("message %d has no string role: %w", idx, ErrInvalidMessages)
		}
		dst = append(dst, "<|im_start|>"...)
		dst = w.appendString(dst, role)
		dst = append(dst, '\n')
		if content.start != 0 {
			dst = w.appendContent(dst, content)
		}
		dst = append(dst, "<|im_end|>\n"...)
	}
	return append(dst, "<|im_start|>assistant\n"...), nil
}

// appendContent renders a content value: a string as is, a list of parts as
// its text parts joined with "\n" (a text part without a string text adds
// an empty line), anything else as nothing — what the template prints for
// RenderChat's values.
func (w *chatWalk) appendContent(dst []byte, v jsonSpan) []byte {
	switch w.b[v.start] {
	case '"':
		return w.appendString(dst, v)
	case '[':
	default:
		return dst
	}
	save := w.i
	w.i = v.start + 1
	n := 0
	for {
		w.ws()
		if w.b[w.i] == ']' {
			break
		}
		if w.b[w.i] == ',' {
			w.i++
			w.ws()
		}
		if w.b[w.i] != '{' {
			w.skip()
			continue
		}
		var typ, text jsonSpan
		w.members(func(key jsonSpan) {
			switch {
			case w.keyIs(key, "type"):
				typ = w.span()
			case w.keyIs(key, "text"):
				text = w.span()
			default:
				w.skip()
			}
		})
		if typ.start == 0 || w.b[typ.start] != '"' || !w.stringIs(typ, "text") {
			continue
		}
		if n > 0 {
			dst = append(dst, '\n')
		}
		if text.start != 0 && w.b[text.start] == '"' {
			dst = w.appendString(dst, text)
		}
		n++
	}
	w.i = save
	return dst
}

// jsonSpan is a value's byte range; start 0 means absent (a value never
// starts at byte 0 inside an array).
type jsonSpan struct{ start, end int }

// chatWalk is a small JSON reader over a messages array: value validates
// (like encoding/json's decoder, with RenderChat's depth bound), the rest
// walk a document value has accepted.
type chatWalk struct {
	b []byte
	i int
}

func (w *chatWalk) ws() {
	for w.i < len(w.b) {
		switch w.b[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

func (w *chatWalk) fail(msg string) error {
	return fmt.Errorf("%w: %s at byte %d", ErrInvalidMessages, msg, w.i)
}

// value validates the value at w.i (after whitespace) and moves past it.
func (w *chatWalk) value(depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("nesting over %d: %w", maxJSONDepth, ErrInvalidMessages)
	}
	w.ws()
	if w.i >= len(w.b) {
		return w.fail("unexpected end of input")
	}
	switch c := w.b[w.i]; {
	case c == '[':
		w.i++
		w.ws()
		if w.i < len(w.b) && w.b[w.i] == ']' {
			w.i++
			return nil
		}
		for {
			if err := w.value(depth + 1); err != nil {
				return err
			}
			w.ws()
			if w.i >= len(w.b) {
				return w.fail("unexpected end of input in array")
			}
			switch w.b[w.i] {
			case ',':
				w.i++
			case ']':
				w.i++
				return nil
			default:
				return w.fail("expected , or ]")
			}
		}
	case c == '{':
		w.i++
		w.ws()
		if w.i < len(w.b) && w.b[w.i] == '}' {
			w.i++
			return nil
		}
		for {
			w.ws()
			if w.i >= len(w.b) || w.b[w.i] != '"' {
				return w.fail("expected a string key")
			}
			if err := w.str(); err != nil {
				return err
			}
			w.ws()
			if w.i >= len(w.b) || w.b[w.i] != ':' {
				return w.fail("expected :")
			}
			w.i++
			if err := w.value(depth + 1); err != nil {
				return err
			}
			w.ws()
			if w.i >= len(w.b) {
				return w.fail("unexpected end of input in object")
			}
			switch w.b[w.i] {
			case ',':
				w.i++
			case '}':
				w.i++
				return nil
			default:
				return w.fail("expected , or }")
			}
		}
	case c == '"':
		return w.str()
	case c == 't':
		return w.literal("true")
	case c == 'f':
		return w.literal("false")
	case c == 'n':
		return w.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return w.number()
	}
	return w.fail("invalid character")
}

func (w *chatWalk) literal(lit string) error {
	if len(w.b)-w.i < len(lit) || string(w.b[w.i:w.i+len(lit)]) != lit {
		return w.fail("invalid literal")
	}
	w.i += len(lit)
	return nil
}

func (w *chatWalk) number() error {
	b, i := w.b, w.i
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case digits() == 0:
		w.i = i
		return w.fail("invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			w.i = i
			return w.fail("invalid number")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			w.i = i
			return w.fail("invalid number")
		}
	}
	w.i = i
	return nil
}

// str validates the string at w.i. Invalid UTF-8 is accepted (the decoder
// replaces it); control characters and bad escapes are not.
func (w *chatWalk) str() error {
	w.i++
	for w.i < len(w.b) {
		c := w.b[w.i]
		switch {
		case c == '"':
			w.i++
			return nil
		case c < 0x20:
			return w.fail("control character in string")
		case c == '\\':
			if w.i+1 >= len(w.b) {
				return w.fail("unterminated escape")
			}
			switch w.b[w.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				w.i += 2
			case 'u':
				if w.i+6 > len(w.b) || hexVal(w.b[w.i+2])|hexVal(w.b[w.i+3])|hexVal(w.b[w.i+4])|hexVal(w.b[w.i+5]) < 0 {
					return w.fail("invalid \\u escape")
				}
				w.i += 6
			default:
				return w.fail("invalid escape")
			}
		default:
			w.i++
		}
	}
	return w.fail("unterminated string")
}

func hexVal(c byte) rune {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0')
	case c >= 'a' && c <= 'f':
		return rune(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1 << 16
}

// The walkers below run only over a document value accepted.

// span returns the value at w.i and moves past it.
func (w *chatWalk) span() jsonSpan {
	w.ws()
	start := w.i
	w.skip()
	return jsonSpan{start, w.i}
}

func (w *chatWalk) skip() {
	_ = w.value(0) // validated already; depth is irrelevant here
}

// members calls fn for each key of the object at w.i with w.i on the
// value; fn must consume the value.
func (w *chatWalk) members(fn func(key jsonSpan)) {
	w.i++ // '{'
	for {
		w.ws()
		switch w.b[w.i] {
		case '}':
			w.i++
			return
		case ',':
			w.i++
			w.ws()
		}
		ks := w.i
		_ = w.str()
		key := jsonSpan{ks, w.i}
		w.ws()
		w.i++ // ':'
		w.ws()
		fn(key)
	}
}

// keyIs compares a string value (with quotes) with name after decoding.
func (w *chatWalk) keyIs(s jsonSpan, name string) bool { return w.stringIs(s, name) }

func (w *chatWalk) stringIs(s jsonSpan, name string) bool {
	raw := w.b[s.start+1 : s.end-1]
	if len(raw) == len(name) && string(raw) == name {
		return true
	}
	if len(raw) > 6*len(name)+6 {
		return false
	}
	var buf [64]byte
	dec := appendJSONString(buf[:0], raw)
	return string(dec) == name
}

func (w *chatWalk) appendString(dst []byte, s jsonSpan) []byte {
	return appendJSONString(dst, w.b[s.start+1:s.end-1])
}

// appendJSONString appends the decoded content of a validated JSON string
// (without quotes) as encoding/json decodes it: unpaired surrogate escapes
// and invalid UTF-8 bytes become U+FFFD.
func appendJSONString(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c == '\\' {
			switch raw[i+1] {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				r := hex4(raw[i+2:])
				i += 6
				if r >= 0xD800 && r < 0xE000 {
					if r < 0xDC00 && i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
						if r2 := hex4(raw[i+2:]); r2 >= 0xDC00 && r2 < 0xE000 {
							dst = utf8.AppendRune(dst, (r-0xD800)<<10|(r2-0xDC00)+0x10000)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				dst = utf8.AppendRune(dst, r)
				continue
			default: // '"', '\\', '/'
				dst = append(dst, raw[i+1])
			}
			i += 2
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(raw[i:])
		if r == utf8.RuneError && size == 1 {
			dst = utf8.AppendRune(dst, utf8.RuneError)
		} else {
			dst = append(dst, raw[i:i+size]...)
		}
		i += size
	}
	return dst
}

func hex4(b []byte) rune {
	return hexVal(b[0])<<12 | hexVal(b[1])<<8 | hexVal(b[2])<<4 | hexVal(b[3])
}
