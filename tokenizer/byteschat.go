package tokenizer

import (
	"fmt"

	"github.com/infera/infera/jsonx"
)

// ChatAppender is implemented by tokenizers that can render a chat into a
// caller's buffer, without allocating for the chats they cover (all of them
// for Bytes; for HF, those its compiled template covers); the router's hot
// path prefers it to RenderChatRequest. The output is identical to
// RenderChatRequest's.
type ChatAppender interface {
	AppendRenderChat(dst []byte, c Chat) ([]byte, error)
}

var _ ChatAppender = Bytes{}

// AppendRenderChat appends the ChatML rendering of c.Messages (see
// RenderChat) to dst. It walks the raw JSON once and allocates nothing
// unless dst must grow (or an error is returned). It accepts and rejects
// exactly the documents RenderChat does, decoding strings as encoding/json
// does (invalid UTF-8 becomes U+FFFD); error messages may differ. On an
// error dst is returned as it was given.
func (Bytes) AppendRenderChat(dst []byte, c Chat) ([]byte, error) {
	w := newChatWalk(c.Messages)
	w.SkipWS()
	if w.I >= len(w.B) {
		return dst, fmt.Errorf("%w: empty messages", ErrInvalidMessages)
	}
	if w.B[w.I] != '[' {
		// Still a syntax error first if the value is not even JSON.
		if err := w.validate(); err != nil {
			return dst, err
		}
		return dst, fmt.Errorf("messages is not an array: %w", ErrInvalidMessages)
	}
	// One pass renders and validates: jsonx's Array, Object and String
	// check every byte they pass, and a value the render does not read is
	// checked by Value. The first message that is not one is remembered
	// (bad) and what follows it only validated, so that a syntax error
	// anywhere in the document still wins over it, as in RenderChat's
	// decoder. (A validating pass before the render cost ~1,100
	// instructions of a kv-aware pick: docs/performance.md, session 25.)
	n0 := len(dst)
	bad, badIdx, idx := chatOK, 0, 0
	err := w.Array(func() error {
		if bad != chatOK {
			return w.Value()
		}
		if w.B[w.I] != '{' {
			bad, badIdx = chatNotObject, idx
			return w.Value()
		}
		var role, content jsonSpan
		err := w.Object(func(ks, ke int, kesc bool) error {
			key := jsonSpan{start: ks - 1, end: ke + 1, plain: !kesc}
			var err error
			switch {
			case w.keyIs(key, "role"):
				role, err = w.checkedSpan()
			case w.keyIs(key, "content"):
				content, err = w.checkedSpan()
			default:
				err = w.Value()
			}
			return err
		})
		if err != nil {
			return err
		}
		if role.start == 0 || w.B[role.start] != '"' {
			bad, badIdx = chatNoRole, idx
			return nil
		}
		dst = append(dst, "<|im_start|>"...)
		dst = w.appendString(dst, role)
		dst = append(dst, '\n')
		if content.start != 0 {
			dst = w.appendContent(dst, content)
		}
		dst = append(dst, "<|im_end|>\n"...)
		idx++
		return nil
	})
	if err != nil {
		return dst[:n0], fmt.Errorf("%w: %w", ErrInvalidMessages, err)
	}
	if w.SkipWS(); w.I != len(w.B) {
		return dst[:n0], fmt.Errorf("trailing data after JSON value: %w", ErrInvalidMessages)
	}
	switch bad {
	case chatNotObject:
		return dst[:n0], fmt.Errorf("message %d is not an object: %w", badIdx, ErrInvalidMessages)
	case chatNoRole:
		return dst[:n0], fmt.Errorf("message %d has no string role: %w", badIdx, ErrInvalidMessages)
	}
	return append(dst, "<|im_start|>assistant\n"...), nil
}

// What AppendRenderChat's walk found wrong with a message (chatOK: nothing).
const (
	chatOK = iota
	chatNotObject
	chatNoRole
)

// appendContent renders a content value: a string as is, a list of parts as
// its text parts joined with "\n" (a text part without a string text adds
// an empty line), anything else as nothing — what the template prints for
// RenderChat's values, and what vLLM does with a list of text parts.
func (w *chatWalk) appendContent(dst []byte, v jsonSpan) []byte {
	switch w.B[v.start] {
	case '"':
		return w.appendString(dst, v)
	case '[':
	default:
		return dst
	}
	save := w.I
	w.I = v.start
	n := 0
	_ = w.Array(func() error {
		if w.B[w.I] != '{' {
			w.skip()
			return nil
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
		if typ.start == 0 || w.B[typ.start] != '"' || !w.stringIs(typ, "text") {
			return nil
		}
		if n > 0 {
			dst = append(dst, '\n')
		}
		if text.start != 0 && w.B[text.start] == '"' {
			dst = w.appendString(dst, text)
		}
		n++
		return nil
	})
	w.I = save
	return dst
}

// jsonSpan is a value's byte range; start 0 means absent (a value never
// starts at byte 0 inside an array). plain marks a string whose content
// decodes to its raw bytes (no escape, every byte ASCII: String's escaped
// false), which is then copied and compared as is rather than scanned
// again (issue 36, docs/performance.md); false decodes.
type jsonSpan struct {
	start, end int
	plain      bool
}

// chatWalk reads a messages (or tools, or kwargs) document with jsonx's
// scanner: validate checks it as encoding/json's decoder would (invalid
// UTF-8 accepted, nesting bounded by maxJSONDepth containers), the rest
// walk a document validate has accepted, but checkedSpan and
// AppendRenderChat's walk, which check as they go.
type chatWalk struct {
	jsonx.Scanner
}

func newChatWalk(b []byte) chatWalk {
	return chatWalk{jsonx.Scanner{B: b, MaxDepth: maxJSONDepth, Lenient: true}}
}

// validate checks that the document is one JSON value.
func (w *chatWalk) validate() error {
	w.SkipWS()
	err := w.Value()
	if err == nil {
		if w.SkipWS(); w.I != len(w.B) {
			return fmt.Errorf("trailing data after JSON value: %w", ErrInvalidMessages)
		}
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidMessages, err)
}

// The walkers below run only over a document validate accepted.

// span returns the value at w.I and moves past it.
func (w *chatWalk) span() jsonSpan {
	w.SkipWS()
	start := w.I
	if w.I < len(w.B) && w.B[w.I] == '"' {
		_, _, esc, _ := w.String()
		return jsonSpan{start: start, end: w.I, plain: !esc}
	}
	w.skip()
	return jsonSpan{start: start, end: w.I}
}

func (w *chatWalk) skip() { _ = w.Value() }

// checkedSpan is span for a document not yet validated: it checks the
// value at w.I (no leading white space) as it moves past it.
func (w *chatWalk) checkedSpan() (jsonSpan, error) {
	start := w.I
	if w.B[w.I] == '"' {
		_, _, esc, err := w.String()
		return jsonSpan{start: start, end: w.I, plain: !esc}, err
	}
	err := w.Value()
	return jsonSpan{start: start, end: w.I}, err
}

// members calls fn for each key (a span with its quotes) of the object at
// w.I with w.I on the value; fn must consume the value.
func (w *chatWalk) members(fn func(key jsonSpan)) {
	_ = w.Object(func(ks, ke int, kesc bool) error {
		fn(jsonSpan{start: ks - 1, end: ke + 1, plain: !kesc})
		return nil
	})
}

// keyIs compares a string value (with quotes) with name after decoding.
func (w *chatWalk) keyIs(s jsonSpan, name string) bool { return w.stringIs(s, name) }

func (w *chatWalk) stringIs(s jsonSpan, name string) bool {
	return jsonx.Equal(w.B[s.start+1:s.end-1], !s.plain, name)
}

func (w *chatWalk) appendString(dst []byte, s jsonSpan) []byte {
	if s.plain {
		return append(dst, w.B[s.start+1:s.end-1]...)
	}
	return jsonx.AppendUnescaped(dst, w.B[s.start+1:s.end-1])
}
