package openai

import (
	"bytes"
	"errors"

	"github.com/infera/infera/jsonx"
)

// MaxDepth bounds how deeply objects and arrays may nest in a request body.
// Real requests (messages → content parts → image_url, tool JSON schemas)
// stay far below it; the bound keeps a hostile body from driving the
// scanner's recursion deep.
const MaxDepth = 128

// Sentinel errors returned (wrapped) by Scan.
var (
	// ErrInvalidJSON: the body is not well-formed JSON (syntax, invalid
	// UTF-8, or nesting deeper than MaxDepth).
	ErrInvalidJSON = jsonx.ErrSyntax
	// ErrTooDeep: nesting exceeds MaxDepth. Always also ErrInvalidJSON.
	ErrTooDeep = jsonx.ErrTooDeep
	// ErrNotObject: well-formed JSON whose top-level value is not an object.
	ErrNotObject = errors.New("request body is not a JSON object")
	// ErrBadField: a field the router reads has the wrong type or value; the
	// concrete error is a *FieldError naming the field.
	ErrBadField = errors.New("bad field")
	// ErrMissingModel: no "model" (or null, or the empty string).
	ErrMissingModel = errors.New("model is required")
)

// Span is a byte range [Start, End) of a raw JSON value inside the scanned
// body; it is empty when Start == End (field absent or null).
type Span struct{ Start, End int }

// Len is the length of the span in bytes.
func (s Span) Len() int { return s.End - s.Start }

// Empty reports whether the span covers nothing.
func (s Span) Empty() bool { return s.End <= s.Start }

// Request is what the router needs from an OpenAI completion request; Scan
// fills it. A Request may be reused across Scan calls (it keeps its scratch
// buffer), but not shared between goroutines.
type Request struct {
	// Model is the "model" value, unescaped. It aliases the body when the
	// value has no escape sequences, otherwise the Request's own scratch
	// buffer; it is valid until the body is modified or the next Scan.
	Model []byte
	// Stream is "stream"; IncludeUsage is "stream_options.include_usage".
	Stream       bool
	IncludeUsage bool
	// MaxTokens is "max_completion_tokens" if present, else "max_tokens"
	// (the precedence vLLM applies), or -1 when neither is given.
	MaxTokens int64
	// Messages and Prompt are the raw spans of the "messages" array (chat)
	// and the "prompt" value (completions).
	Messages Span
	Prompt   Span
	// Tools is the raw "tools" array and ChatTemplateKwargs the raw
	// "chat_template_kwargs" object: both change the prompt a chat template
	// renders, so exact tokenization needs them. A value of another type
	// leaves the span empty; it is the engine's to reject.
	Tools              Span
	ChatTemplateKwargs Span
	// Cache hints, as Infera reads them: Retention is what
	// "prompt_cache_retention" asks ("24h", "1h", "long": long; "5m",
	// "short": short; "none", "off", "disabled": none; case and white space
	// ignored), or short when only a non-empty "prompt_cache_key" is given,
	// else RetentionUnset.
	Retention Retention
	// The engine hint fields the client set itself (Infera never overrides
	// them): "priority", "infera_retention", "_infera_retention", and the
	// raw "kv_transfer_params" value with whether it is an object holding
	// "infera_retention".
	HasPriority, HasInferaRetention, HasLegacyRetention bool
	KVTransferParams                                    Span
	KVTransferRetention                                 bool
	// N and BestOf are "n" and "best_of" (1 when absent, null or not an
	// integer); HasReturnTokenIDs: the client set "return_token_ids"
	// itself (stream continuation asks engines for ids otherwise).
	N, BestOf         int64
	HasReturnTokenIDs bool

	// Walk, when set, receives the body's top-level members as Scan
	// walks them (Reset, then Finished when Scan accepts the body), so
	// that edits of the same body (jsonx.SetFieldsWalk: the router's PD
	// legs) splice from it without walking it again. It is the caller's,
	// and kept by Reset.
	Walk *jsonx.Walk

	scratch []byte
}

// Reset empties r as a new Request, keeping its scratch buffer and Walk.
func (r *Request) Reset() {
	scratch, walk := r.scratch[:0], r.Walk
	*r = Request{}
	r.scratch, r.Walk = scratch, walk
}

// Retention is a request's cache-retention class.
type Retention uint8

// The retention classes; RetentionUnset: the client gave no hint.
const (
	RetentionUnset Retention = iota
	RetentionNone
	RetentionShort
	RetentionLong
)

// String is the class's name in Infera's infera_retention field ("" when
// unset).
func (r Retention) String() string {
	switch r {
	case RetentionNone:
		return "none"
	case RetentionShort:
		return "short"
	case RetentionLong:
		return "long"
	}
	return ""
}

// FieldError reports a known field with the wrong type or value.
type FieldError struct {
	Field string // JSON path of the field, e.g. "stream_options.include_usage"
	Want  string // what the field must be
}

func (e *FieldError) Error() string { return "field " + e.Field + " must be " + e.Want }

// Unwrap makes errors.Is(err, ErrBadField) true.
func (e *FieldError) Unwrap() error { return ErrBadField }

// SyntaxError reports malformed JSON at a byte offset (jsonx's, so that
// errors.Is(err, ErrInvalidJSON) and ErrTooDeep hold).
type SyntaxError = jsonx.SyntaxError

// The fields Scan understands. Their errors are preallocated so that a
// rejected request costs no allocation either.
const (
	fieldOther = iota
	fieldModel
	fieldStream
	fieldStreamOptions
	fieldMaxTokens
	fieldMaxCompletionTokens
	fieldMessages
	fieldPrompt
	fieldTools
	fieldChatTemplateKwargs
	fieldPromptCacheRetention
	fieldPromptCacheKey
	fieldPriority
	fieldInferaRetention
	fieldLegacyRetention
	fieldKVTransferParams
	fieldN
	fieldBestOf
	fieldReturnTokenIDs
	numFields
)

var fieldErrors = [numFields]*FieldError{
	fieldModel:               {Field: "model", Want: "a string"},
	fieldStream:              {Field: "stream", Want: "a boolean"},
	fieldStreamOptions:       {Field: "stream_options", Want: "an object with a boolean include_usage"},
	fieldMaxTokens:           {Field: "max_tokens", Want: "a non-negative integer"},
	fieldMaxCompletionTokens: {Field: "max_completion_tokens", Want: "a non-negative integer"},
	fieldMessages:            {Field: "messages", Want: "an array"},
	fieldPrompt:              {Field: "prompt", Want: "a string or an array"},
}

// Scan makes one pass over body: it validates that body is well-formed JSON
// (strings with escapes and UTF-8, numbers, literals, nesting up to
// MaxDepth) and records the fields routing needs into r. It does not
// allocate (an escaped model name is unescaped into r's reused scratch
// buffer). Duplicate keys behave as in encoding/json: the last one wins.
//
// Errors: *SyntaxError (ErrInvalidJSON, maybe ErrTooDeep), ErrNotObject,
// *FieldError (ErrBadField), ErrMissingModel — checked in that order, so a
// body that is not JSON is always reported as such.
func Scan(body []byte, r *Request) error {
	r.Model = nil
	r.Stream = false
	r.IncludeUsage = false
	r.MaxTokens = -1
	r.Messages = Span{}
	r.Prompt = Span{}
	r.Tools = Span{}
	r.ChatTemplateKwargs = Span{}
	r.Retention = RetentionUnset
	r.HasPriority, r.HasInferaRetention, r.HasLegacyRetention = false, false, false
	r.KVTransferParams, r.KVTransferRetention = Span{}, false
	r.N, r.BestOf, r.HasReturnTokenIDs = 1, 1, false
	r.scratch = r.scratch[:0]
	if r.Walk != nil {
		r.Walk.Reset()
	}

	s := newScanner(body)
	s.SkipWS()
	if s.I >= len(s.B) {
		return s.Fail("empty body")
	}
	if s.B[s.I] != '{' {
		if err := s.Value(); err != nil {
			return err
		}
		if err := s.End(); err != nil {
			return err
		}
		return ErrNotObject
	}
	st := topState{maxTokens: -1, maxCompletion: -1}
	if r.Walk != nil {
		if err := s.topObjectWalk(r, &st); err != nil {
			return err
		}
	} else if err := s.topObject(r, &st); err != nil {
		return err
	}
	if err := s.End(); err != nil {
		return err
	}
	if st.bad != 0 {
		for f := fieldModel; f < numFields; f++ {
			if st.bad&(1<<f) != 0 {
				return fieldErrors[f]
			}
		}
	}
	if st.model.Empty() { // absent, null or ""
		return ErrMissingModel
	}
	raw := body[st.model.Start:st.model.End]
	if st.modelEscaped {
		r.scratch = jsonx.AppendUnescaped(r.scratch[:0], raw)
		r.Model = r.scratch
	} else {
		r.Model = raw
	}
	if len(r.Model) == 0 {
		return ErrMissingModel
	}
	if r.Walk != nil {
		r.Walk.Finish(body, s.Deepest)
	}
	r.Retention = st.retention
	if r.Retention == RetentionUnset && st.cacheKey {
		r.Retention = RetentionShort
	}
	r.MaxTokens = st.maxTokens
	if st.maxCompletion >= 0 {
		r.MaxTokens = st.maxCompletion
	}
	return nil
}

// topState is what the top-level object pass remembers until the end, so that
// a later duplicate key can override an earlier (possibly bad) value.
type topState struct {
	bad           uint32 // bit per field whose last value had the wrong type
	model         Span   // raw (still escaped) string content of the last model
	modelEscaped  bool
	maxTokens     int64
	maxCompletion int64
	retention     Retention // the last prompt_cache_retention's class
	cacheKey      bool      // the last prompt_cache_key is a non-empty string
}

func (st *topState) setBad(f int, bad bool) {
	if bad {
		st.bad |= 1 << f
	} else {
		st.bad &^= 1 << f
	}
}

// scanner is the single-pass JSON validator (jsonx's, bounded by
// MaxDepth). Every method starts at s.I on the first byte of its construct
// and leaves s.I just past it.
type scanner struct {
	jsonx.Scanner
}

func newScanner(b []byte) scanner { return scanner{jsonx.Scanner{B: b, MaxDepth: MaxDepth}} }

func (s *scanner) topObject(r *Request, st *topState) error {
	return s.Object(func(ks, ke int, kesc bool) error {
		return s.topField(lookupField(s.B[ks:ke], kesc), r, st)
	})
}

// topObjectWalk is topObject recording each member into r.Walk: a second
// closure rather than a test in topObject's, which every request runs.
func (s *scanner) topObjectWalk(r *Request, st *topState) error {
	return s.Object(func(ks, ke int, kesc bool) error {
		vs := s.I
		if err := s.topField(lookupField(s.B[ks:ke], kesc), r, st); err != nil {
			return err
		}
		r.Walk.Add(ks, ke, kesc, vs, s.I)
		return nil
	})
}

// topField scans the value of one top-level member, recording it when the
// field is known. s.I is on the value's first byte.
func (s *scanner) topField(field int, r *Request, st *topState) error {
	c := s.B[s.I]
	switch field {
	case fieldModel:
		if c == '"' {
			vs, ve, esc, err := s.String()
			if err != nil {
				return err
			}
			st.model = Span{vs, ve}
			st.modelEscaped = esc
			st.setBad(field, false)
			return nil
		}
		st.model = Span{}
		st.setBad(field, c != 'n')
		return s.Value()
	case fieldStream:
		switch c {
		case 't', 'f', 'n':
			if err := s.Value(); err != nil {
				return err
			}
			r.Stream = c == 't'
			st.setBad(field, false)
			return nil
		}
		r.Stream = false
		st.setBad(field, true)
		return s.Value()
	case fieldStreamOptions:
		r.IncludeUsage = false
		if c == '{' {
			usage, bad, err := s.streamOptions()
			if err != nil {
				return err
			}
			r.IncludeUsage = usage
			st.setBad(field, bad)
			return nil
		}
		st.setBad(field, c != 'n')
		return s.Value()
	case fieldMaxTokens, fieldMaxCompletionTokens:
		start := s.I
		if err := s.Value(); err != nil {
			return err
		}
		v, bad := int64(-1), false
		switch {
		case c == 'n':
		case c == '-' || (c >= '0' && c <= '9'):
			n, ok := jsonx.ParseUint(s.B[start:s.I])
			v, bad = n, !ok
			if !ok {
				v = -1
			}
		default:
			bad = true
		}
		if field == fieldMaxTokens {
			st.maxTokens = v
		} else {
			st.maxCompletion = v
		}
		st.setBad(field, bad)
		return nil
	case fieldMessages, fieldPrompt:
		start := s.I
		if err := s.Value(); err != nil {
			return err
		}
		sp := Span{start, s.I}
		ok := c == '[' || c == 'n' || (field == fieldPrompt && c == '"')
		if c == 'n' || !ok {
			sp = Span{}
		}
		if field == fieldMessages {
			r.Messages = sp
		} else {
			r.Prompt = sp
		}
		st.setBad(field, !ok)
		return nil
	case fieldTools, fieldChatTemplateKwargs:
		start := s.I
		if err := s.Value(); err != nil {
			return err
		}
		sp := Span{}
		if (field == fieldTools && c == '[') || (field == fieldChatTemplateKwargs && c == '{') {
			sp = Span{start, s.I}
		}
		if field == fieldTools {
			r.Tools = sp
		} else {
			r.ChatTemplateKwargs = sp
		}
		return nil
	case fieldPromptCacheRetention, fieldPromptCacheKey:
		if c != '"' {
			if field == fieldPromptCacheRetention {
				st.retention = RetentionUnset
			} else {
				st.cacheKey = false
			}
			return s.Value()
		}
		vs, ve, esc, err := s.String()
		if err != nil {
			return err
		}
		if field == fieldPromptCacheRetention {
			st.retention = parseRetention(s.B[vs:ve], esc)
		} else {
			st.cacheKey = ve > vs
		}
		return nil
	case fieldN, fieldBestOf:
		start := s.I
		if err := s.Value(); err != nil {
			return err
		}
		v, ok := jsonx.ParseInt(s.B[start:s.I])
		if !ok {
			v = 1
		}
		if field == fieldN {
			r.N = v
		} else {
			r.BestOf = v
		}
		return nil
	case fieldReturnTokenIDs:
		r.HasReturnTokenIDs = true
	case fieldPriority:
		r.HasPriority = true
	case fieldInferaRetention:
		r.HasInferaRetention = true
	case fieldLegacyRetention:
		r.HasLegacyRetention = true
	case fieldKVTransferParams:
		start := s.I
		has := false
		if c == '{' {
			err := s.Object(func(ks, ke int, kesc bool) error {
				if keyEquals(s.B[ks:ke], kesc, "infera_retention") {
					has = true
				}
				return s.Value()
			})
			if err != nil {
				return err
			}
		} else if err := s.Value(); err != nil {
			return err
		}
		r.KVTransferParams, r.KVTransferRetention = Span{start, s.I}, has
		return nil
	}
	return s.Value()
}

// streamOptions scans the stream_options object and returns its
// include_usage (last one wins) and whether it had the wrong type.
func (s *scanner) streamOptions() (usage, bad bool, err error) {
	err = s.Object(func(ks, ke int, kesc bool) error {
		isUsage := keyEquals(s.B[ks:ke], kesc, "include_usage")
		c := s.B[s.I]
		if err := s.Value(); err != nil {
			return err
		}
		if isUsage {
			usage = c == 't'
			bad = c != 't' && c != 'f' && c != 'n'
		}
		return nil
	})
	if err != nil {
		return false, false, err
	}
	return usage, bad, nil
}

// lookupField maps a top-level key (raw string content) to a known field.
func lookupField(raw []byte, escaped bool) int {
	if escaped {
		// Unescaping never grows a string, and known keys are at most 22
		// bytes (prompt_cache_retention), each at most 6 raw bytes as
		// \uXXXX.
		if len(raw) > 6*22 {
			return fieldOther
		}
		var kb [6 * 22]byte
		raw = jsonx.AppendUnescaped(kb[:0], raw)
	}
	switch string(raw) {
	case "model":
		return fieldModel
	case "stream":
		return fieldStream
	case "stream_options":
		return fieldStreamOptions
	case "max_tokens":
		return fieldMaxTokens
	case "max_completion_tokens":
		return fieldMaxCompletionTokens
	case "messages":
		return fieldMessages
	case "prompt":
		return fieldPrompt
	case "tools":
		return fieldTools
	case "chat_template_kwargs":
		return fieldChatTemplateKwargs
	case "prompt_cache_retention":
		return fieldPromptCacheRetention
	case "prompt_cache_key":
		return fieldPromptCacheKey
	case "priority":
		return fieldPriority
	case "infera_retention":
		return fieldInferaRetention
	case "_infera_retention":
		return fieldLegacyRetention
	case "n":
		return fieldN
	case "best_of":
		return fieldBestOf
	case "return_token_ids":
		return fieldReturnTokenIDs
	case "kv_transfer_params":
		return fieldKVTransferParams
	}
	return fieldOther
}

func keyEquals(raw []byte, escaped bool, key string) bool {
	return jsonx.Equal(raw, escaped, key)
}

// parseRetention maps a prompt_cache_retention string (raw content) to its
// class, as Infera does: trimmed, case-insensitive; RetentionUnset when
// unknown.
func parseRetention(raw []byte, escaped bool) Retention {
	var vb [32]byte
	if escaped {
		if len(raw) > 6*len(vb) {
			return RetentionUnset
		}
		var ub [6 * len(vb)]byte
		raw = jsonx.AppendUnescaped(ub[:0], raw)
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) > len(vb) {
		return RetentionUnset
	}
	v := vb[:len(raw)]
	for i, c := range raw {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		v[i] = c
	}
	switch string(v) {
	case "24h", "1h", "long":
		return RetentionLong
	case "5m", "short":
		return RetentionShort
	case "none", "off", "disabled":
		return RetentionNone
	}
	return RetentionUnset
}
