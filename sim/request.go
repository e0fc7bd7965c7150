package sim

import (
	"errors"
	"fmt"

	"github.com/infera/infera/jsonx"
)

// Request errors; each is answered with HTTP 400 in the OpenAI envelope.
var (
	ErrBadJSON    = errors.New("invalid JSON body")
	ErrBadRequest = errors.New("bad request")
)

// span is a byte range of the request body; empty when start == end.
type span struct{ start, end int }

func (p span) empty() bool { return p.start == p.end }

// request holds what the simulator needs from an OpenAI request body. Spans
// point into the body, which must outlive the request value.
type request struct {
	model        span // raw string contents, may contain escapes
	modelEsc     bool
	hasModel     bool
	stream       bool
	hasStreamOpt bool
	includeUsage bool
	maxTokens    int64 // -1 when absent or null
	maxCompl     int64 // max_completion_tokens; -1 when absent or null
	n            int64
	messages     span // raw array value
	prompt       span // raw value
	tools        span // raw value of "tools" (chat templates may render it)
	kwargs       span // raw value of "chat_template_kwargs"
	addGenPrompt bool
	input        span  // raw value of "input" (embeddings)
	base64       bool  // "encoding_format": "base64" (embeddings)
	dimensions   int64 // "dimensions" (embeddings); -1 when absent or null
	stop         span  // raw value of "stop": a string or a list of strings
	returnIDs    bool  // "return_token_ids": answer with token ids (ids.go)
}

// requestError is an ErrBadRequest with a message meant for the client.
type requestError struct{ msg string }

func (e *requestError) Error() string { return "bad request: " + e.msg }
func (e *requestError) Unwrap() error { return ErrBadRequest }

// badRequest builds a requestError. Only the error path formats; valid
// requests never reach it.
func badRequest(format string, args ...any) error {
	return &requestError{msg: fmt.Sprintf(format, args...)}
}

// clientMessage is the text sent to the client for a request error.
func clientMessage(err error) string {
	var re *requestError
	if errors.As(err, &re) {
		return re.msg
	}
	if errors.Is(err, ErrBadJSON) {
		return "invalid JSON body"
	}
	return err.Error()
}

// parseRequest scans a chat, completion or tokenize body in one pass. It
// validates the whole document and the types of the fields it reads;
// unknown fields are skipped.
func parseRequest(body []byte, r *request) error {
	*r = request{maxTokens: -1, maxCompl: -1, n: 1, addGenPrompt: true, dimensions: -1}
	s := newScanner(body, 0)
	var fieldErr error
	ok := s.object(func(ks, ke int, kesc bool) bool {
		key := body[ks:ke]
		if kesc {
			// Rare: decode the key once and match the decoded form.
			var buf [64]byte
			if ke-ks > len(buf) {
				return s.skip()
			}
			key = jsonx.AppendUnescaped(buf[:0], key)
		}
		switch string(key) {
		case "model":
			return s.nullOr(func() bool {
				st, en, esc, ok := s.str()
				if !ok {
					return s.typeErr(&fieldErr, "model", "a string")
				}
				r.model, r.modelEsc, r.hasModel = span{st, en}, esc, true
				return true
			})
		case "stream":
			return s.nullOr(func() bool { return s.boolean(&r.stream, &fieldErr, "stream") })
		case "stream_options":
			return s.nullOr(func() bool {
				r.hasStreamOpt = true
				if s.peek() != '{' {
					return s.typeErr(&fieldErr, "stream_options", "an object")
				}
				return s.object(func(ks, ke int, kesc bool) bool {
					if keyIs(body, ks, ke, kesc, "include_usage") {
						return s.nullOr(func() bool {
							return s.boolean(&r.includeUsage, &fieldErr, "stream_options.include_usage")
						})
					}
					return s.skip()
				})
			})
		case "max_tokens":
			return s.nullOr(func() bool { return s.integer(&r.maxTokens, &fieldErr, "max_tokens") })
		case "max_completion_tokens":
			return s.nullOr(func() bool { return s.integer(&r.maxCompl, &fieldErr, "max_completion_tokens") })
		case "n":
			return s.nullOr(func() bool { return s.integer(&r.n, &fieldErr, "n") })
		case "return_token_ids":
			return s.nullOr(func() bool { return s.boolean(&r.returnIDs, &fieldErr, "return_token_ids") })
		case "add_generation_prompt":
			return s.nullOr(func() bool { return s.boolean(&r.addGenPrompt, &fieldErr, "add_generation_prompt") })
		case "messages":
			st := s.peekPos()
			if s.peek() != '[' {
				if s.peek() == 'n' && s.lit("null") {
					return true
				}
				return s.typeErr(&fieldErr, "messages", "an array")
			}
			if !s.skip() {
				return false
			}
			r.messages = span{st, s.I}
			return true
		case "tools", "chat_template_kwargs":
			st := s.peekPos()
			if !s.skip() {
				return false
			}
			if string(key) == "tools" {
				r.tools = span{st, s.I}
			} else {
				r.kwargs = span{st, s.I}
			}
			return true
		case "input":
			st := s.peekPos()
			if s.peek() == 'n' {
				return s.lit("null")
			}
			if !s.skip() {
				return false
			}
			r.input = span{st, s.I}
			return true
		case "encoding_format":
			return s.nullOr(func() bool {
				st, en, esc, ok := s.str()
				if !ok {
					return s.typeErr(&fieldErr, "encoding_format", `"float" or "base64"`)
				}
				switch {
				case jsonx.Equal(body[st:en], esc, "base64"):
					r.base64 = true
				case jsonx.Equal(body[st:en], esc, "float"):
					r.base64 = false
				default:
					return s.typeErr(&fieldErr, "encoding_format", `"float" or "base64"`)
				}
				return true
			})
		case "stop":
			st := s.peekPos()
			switch s.peek() {
			case 'n':
				return s.lit("null")
			case '"':
			case '[':
				ok := s.array(func() bool {
					if s.peek() != '"' {
						return s.typeErr(&fieldErr, "stop", "a string or a list of strings")
					}
					return s.skip()
				})
				if ok {
					r.stop = span{st, s.I}
				}
				return ok
			default:
				return s.typeErr(&fieldErr, "stop", "a string or a list of strings")
			}
			if !s.skip() {
				return false
			}
			r.stop = span{st, s.I}
			return true
		case "dimensions":
			return s.nullOr(func() bool { return s.integer(&r.dimensions, &fieldErr, "dimensions") })
		case "prompt":
			st := s.peekPos()
			if s.peek() == 'n' {
				return s.lit("null")
			}
			if !s.skip() {
				return false
			}
			r.prompt = span{st, s.I}
			return true
		}
		return s.skip()
	})
	if fieldErr != nil {
		return fieldErr
	}
	if s.ws(); !ok || s.I != len(s.B) {
		return ErrBadJSON
	}
	return nil
}

// nullOr consumes null, or else runs f on the value.
func (s *scanner) nullOr(f func() bool) bool {
	if s.peek() == 'n' {
		return s.lit("null")
	}
	return f()
}

// typeErr records a wrong-type field; it returns false to stop the scan.
func (s *scanner) typeErr(dst *error, field, want string) bool {
	if *dst == nil {
		*dst = badRequest("%s must be %s", field, want)
	}
	return false
}

func (s *scanner) boolean(dst *bool, errp *error, field string) bool {
	switch s.peek() {
	case 't':
		*dst = true
		return s.lit("true")
	case 'f':
		*dst = false
		return s.lit("false")
	}
	return s.typeErr(errp, field, "a boolean")
}

func (s *scanner) integer(dst *int64, errp *error, field string) bool {
	c := s.peek()
	if c != '-' && !isDigit(c) {
		return s.typeErr(errp, field, "an integer")
	}
	st, en, integer, ok := s.num()
	if !ok {
		return false
	}
	v, fits := jsonx.ParseInt(s.B[st:en])
	if !integer || !fits {
		return s.typeErr(errp, field, "an integer")
	}
	*dst = v
	return true
}

// vocabSize is the size of the bytes tokenizer's vocabulary: token ids in a
// prompt must be byte values.
const vocabSize = 256

// appendPromptTokens appends the tokens of a /v1/completions "prompt": a
// string, a list with one string, a list of token ids, or a list with one
// list of token ids. Batches of several prompts are not simulated. text is
// scratch space for decoding escaped strings; it is returned for reuse.
// Strings are encoded with hf, or the bytes tokenizer when hf is nil.
func appendPromptTokens(dst []uint32, text []byte, body []byte, p span, hf *hfCodec) ([]uint32, []byte, error) {
	s := newScanner(body[:p.end], p.start)
	vocab := vocabSize
	if hf != nil {
		vocab = hf.vocab
	}
	switch s.peek() {
	case '"':
		dst, text = appendStringTokens(dst, text, &s, hf)
		return dst, text, nil
	case '[':
	default:
		return dst, text, badRequest("prompt must be a string or a list")
	}
	var err error
	elems := 0
	s.array(func() bool {
		elems++
		switch s.peek() {
		case '"', '[':
			if elems > 1 {
				err = badRequest("the simulator serves one prompt per request")
				return false
			}
			if s.peek() == '"' {
				dst, text = appendStringTokens(dst, text, &s, hf)
				return true
			}
			return s.array(func() bool {
				dst, err = appendTokenID(&s, dst, vocab)
				return err == nil
			})
		}
		dst, err = appendTokenID(&s, dst, vocab)
		return err == nil
	})
	return dst, text, err
}

func appendTokenID(s *scanner, dst []uint32, vocab int) ([]uint32, error) {
	c := s.peek()
	if c != '-' && !isDigit(c) {
		return dst, badRequest("prompt token ids must be integers")
	}
	st, en, integer, _ := s.num()
	v, fits := jsonx.ParseInt(s.B[st:en])
	if !integer || !fits || v < 0 || v >= int64(vocab) {
		return dst, badRequest("token id %s is out of vocabulary (size %d)", s.B[st:en], vocab)
	}
	return append(dst, uint32(v)), nil
}

// appendStringTokens consumes a (validated) string at the scanner and
// tokenizes it (hf, or bytes when nil), decoding escapes into text first
// when there are any.
func appendStringTokens(dst []uint32, text []byte, s *scanner, hf *hfCodec) ([]uint32, []byte) {
	st, en, esc, _ := s.str()
	raw := s.B[st:en]
	if esc {
		text = jsonx.AppendUnescaped(text[:0], raw)
		raw = text
	}
	if hf != nil {
		return hf.encode(dst, raw), text
	}
	return TokenizeBytes(dst, raw), text
}
