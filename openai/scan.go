package openai

import (
	"encoding/binary"
	"errors"
	"strconv"
	"unicode/utf8"
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
	ErrInvalidJSON = errors.New("invalid JSON")
	// ErrTooDeep: nesting exceeds MaxDepth. Always also ErrInvalidJSON.
	ErrTooDeep = errors.New("JSON nested too deeply")
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

	scratch []byte
}

// FieldError reports a known field with the wrong type or value.
type FieldError struct {
	Field string // JSON path of the field, e.g. "stream_options.include_usage"
	Want  string // what the field must be
}

func (e *FieldError) Error() string { return "field " + e.Field + " must be " + e.Want }

// Unwrap makes errors.Is(err, ErrBadField) true.
func (e *FieldError) Unwrap() error { return ErrBadField }

// SyntaxError reports malformed JSON at a byte offset.
type SyntaxError struct {
	Offset int    // byte offset of the problem
	Msg    string // what is wrong there
	cause  error  // an extra sentinel (ErrTooDeep), or nil
}

func (e *SyntaxError) Error() string {
	return "invalid JSON at byte " + strconv.Itoa(e.Offset) + ": " + e.Msg
}

// Unwrap makes errors.Is(err, ErrInvalidJSON) true, and ErrTooDeep for
// nesting errors.
func (e *SyntaxError) Unwrap() []error {
	if e.cause != nil {
		return []error{ErrInvalidJSON, e.cause}
	}
	return []error{ErrInvalidJSON}
}

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
	r.scratch = r.scratch[:0]

	s := scanner{b: body}
	s.skipWS()
	if s.i >= len(s.b) {
		return s.fail("empty body")
	}
	if s.b[s.i] != '{' {
		if err := s.value(); err != nil {
			return err
		}
		if err := s.end(); err != nil {
			return err
		}
		return ErrNotObject
	}
	st := topState{maxTokens: -1, maxCompletion: -1}
	if err := s.topObject(r, &st); err != nil {
		return err
	}
	if err := s.end(); err != nil {
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
		r.scratch = appendUnescaped(r.scratch[:0], raw)
		r.Model = r.scratch
	} else {
		r.Model = raw
	}
	if len(r.Model) == 0 {
		return ErrMissingModel
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
	bad           uint16 // bit per field whose last value had the wrong type
	model         Span   // raw (still escaped) string content of the last model
	modelEscaped  bool
	maxTokens     int64
	maxCompletion int64
}

func (st *topState) setBad(f int, bad bool) {
	if bad {
		st.bad |= 1 << f
	} else {
		st.bad &^= 1 << f
	}
}

// scanner is the single-pass JSON validator. Every method starts at s.i on
// the first byte of its construct and leaves s.i just past it.
type scanner struct {
	b     []byte
	i     int
	depth int
}

func (s *scanner) fail(msg string) error {
	return &SyntaxError{Offset: s.i, Msg: msg}
}

func (s *scanner) skipWS() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// end checks that only whitespace follows the top-level value.
func (s *scanner) end() error {
	s.skipWS()
	if s.i != len(s.b) {
		return s.fail("unexpected data after the top-level value")
	}
	return nil
}

func (s *scanner) topObject(r *Request, st *topState) error {
	s.depth = 1
	s.i++ // '{'
	s.skipWS()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	for {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return s.fail("expected a string key")
		}
		ks, ke, kesc, err := s.str()
		if err != nil {
			return err
		}
		field := lookupField(s.b[ks:ke], kesc)
		s.skipWS()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return s.fail("expected ':' after object key")
		}
		s.i++
		s.skipWS()
		if s.i >= len(s.b) {
			return s.fail("unexpected end of input, expected a value")
		}
		if err := s.topField(field, r, st); err != nil {
			return err
		}
		s.skipWS()
		if s.i >= len(s.b) {
			return s.fail("unexpected end of input in object")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.skipWS()
		case '}':
			s.i++
			return nil
		default:
			return s.fail("expected ',' or '}' in object")
		}
	}
}

// topField scans the value of one top-level member, recording it when the
// field is known. s.i is on the value's first byte.
func (s *scanner) topField(field int, r *Request, st *topState) error {
	c := s.b[s.i]
	switch field {
	case fieldModel:
		if c == '"' {
			vs, ve, esc, err := s.str()
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
		return s.value()
	case fieldStream:
		switch c {
		case 't', 'f', 'n':
			if err := s.value(); err != nil {
				return err
			}
			r.Stream = c == 't'
			st.setBad(field, false)
			return nil
		}
		r.Stream = false
		st.setBad(field, true)
		return s.value()
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
		return s.value()
	case fieldMaxTokens, fieldMaxCompletionTokens:
		start := s.i
		if err := s.value(); err != nil {
			return err
		}
		v, bad := int64(-1), false
		switch {
		case c == 'n':
		case c == '-' || (c >= '0' && c <= '9'):
			n, ok := parseUint(s.b[start:s.i])
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
		start := s.i
		if err := s.value(); err != nil {
			return err
		}
		sp := Span{start, s.i}
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
		start := s.i
		if err := s.value(); err != nil {
			return err
		}
		sp := Span{}
		if (field == fieldTools && c == '[') || (field == fieldChatTemplateKwargs && c == '{') {
			sp = Span{start, s.i}
		}
		if field == fieldTools {
			r.Tools = sp
		} else {
			r.ChatTemplateKwargs = sp
		}
		return nil
	}
	return s.value()
}

// streamOptions scans the stream_options object and returns its
// include_usage (last one wins) and whether it had the wrong type.
func (s *scanner) streamOptions() (usage, bad bool, err error) {
	s.depth++ // depth 2: cannot exceed MaxDepth
	s.i++
	s.skipWS()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		s.depth--
		return false, false, nil
	}
	for {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return false, false, s.fail("expected a string key")
		}
		ks, ke, kesc, err := s.str()
		if err != nil {
			return false, false, err
		}
		isUsage := keyEquals(s.b[ks:ke], kesc, "include_usage")
		s.skipWS()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false, false, s.fail("expected ':' after object key")
		}
		s.i++
		s.skipWS()
		if s.i >= len(s.b) {
			return false, false, s.fail("unexpected end of input, expected a value")
		}
		c := s.b[s.i]
		if err := s.value(); err != nil {
			return false, false, err
		}
		if isUsage {
			usage = c == 't'
			bad = c != 't' && c != 'f' && c != 'n'
		}
		s.skipWS()
		if s.i >= len(s.b) {
			return false, false, s.fail("unexpected end of input in object")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.skipWS()
		case '}':
			s.i++
			s.depth--
			return usage, bad, nil
		default:
			return false, false, s.fail("expected ',' or '}' in object")
		}
	}
}

// value validates any JSON value at s.i.
func (s *scanner) value() error {
	if s.i >= len(s.b) {
		return s.fail("unexpected end of input, expected a value")
	}
	switch c := s.b[s.i]; c {
	case '{':
		return s.object()
	case '[':
		return s.array()
	case '"':
		_, _, _, err := s.str()
		return err
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return s.number()
		}
		return s.fail("invalid character at start of value")
	}
}

func (s *scanner) literal(lit string) error {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return s.fail("invalid literal")
	}
	s.i += len(lit)
	return nil
}

func (s *scanner) object() error {
	s.depth++
	if s.depth > MaxDepth {
		return &SyntaxError{Offset: s.i, Msg: "nested too deeply", cause: ErrTooDeep}
	}
	s.i++
	s.skipWS()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		s.depth--
		return nil
	}
	for {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return s.fail("expected a string key")
		}
		if _, _, _, err := s.str(); err != nil {
			return err
		}
		s.skipWS()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return s.fail("expected ':' after object key")
		}
		s.i++
		s.skipWS()
		if err := s.value(); err != nil {
			return err
		}
		s.skipWS()
		if s.i >= len(s.b) {
			return s.fail("unexpected end of input in object")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.skipWS()
		case '}':
			s.i++
			s.depth--
			return nil
		default:
			return s.fail("expected ',' or '}' in object")
		}
	}
}

func (s *scanner) array() error {
	s.depth++
	if s.depth > MaxDepth {
		return &SyntaxError{Offset: s.i, Msg: "nested too deeply", cause: ErrTooDeep}
	}
	s.i++
	s.skipWS()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		s.depth--
		return nil
	}
	for {
		if err := s.value(); err != nil {
			return err
		}
		s.skipWS()
		if s.i >= len(s.b) {
			return s.fail("unexpected end of input in array")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.skipWS()
		case ']':
			s.i++
			s.depth--
			return nil
		default:
			return s.fail("expected ',' or ']' in array")
		}
	}
}

// number validates -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() error {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i++; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		}
	default:
		s.i = i
		return s.fail("invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.i = i
			return s.fail("invalid number: digit expected after '.'")
		}
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.i = i
			return s.fail("invalid number: digit expected in exponent")
		}
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		}
	}
	s.i = i
	return nil
}

// parseUint parses a validated JSON number that must be a non-negative
// integer literal fitting in int64.
func parseUint(num []byte) (int64, bool) {
	if len(num) == 0 || num[0] == '-' {
		return 0, false
	}
	var v int64
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false // fraction or exponent
		}
		d := int64(c - '0')
		if v > (1<<63-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// strSafe marks ASCII bytes that may appear unescaped inside a string and
// need no further look: everything from 0x20 except '"' and '\\'.
var strSafe = func() (t [128]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// hexVal maps a byte to its hex digit value, or 0xff.
var hexVal = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = byte(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = byte(c - 'a' + 10)
		t[c-'a'+'A'] = byte(c - 'a' + 10)
	}
	return t
}()

// str validates the string starting at s.i (on the opening quote) and
// returns the span of its raw content (without quotes) and whether the
// content contains escape sequences.
func (s *scanner) str() (start, end int, escaped bool, err error) {
	b := s.b
	i := s.i + 1
	start = i
	for i < len(b) {
		// Skip eight plain ASCII bytes at a time; string content is most of
		// a request's bytes.
		for i+8 <= len(b) && plain8(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		if c < utf8.RuneSelf {
			if strSafe[c] {
				i++
				continue
			}
			switch c {
			case '"':
				s.i = i + 1
				return start, i, escaped, nil
			case '\\':
				escaped = true
				if i+1 >= len(b) {
					s.i = i
					return 0, 0, false, s.fail("unterminated escape")
				}
				switch b[i+1] {
				case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
					i += 2
				case 'u':
					if i+6 > len(b) || hexVal[b[i+2]]|hexVal[b[i+3]]|hexVal[b[i+4]]|hexVal[b[i+5]] == 0xff {
						s.i = i
						return 0, 0, false, s.fail("invalid \\u escape")
					}
					i += 6
				default:
					s.i = i
					return 0, 0, false, s.fail("invalid escape character")
				}
			default:
				s.i = i
				return 0, 0, false, s.fail("control character in string")
			}
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			s.i = i
			return 0, 0, false, s.fail("invalid UTF-8 in string")
		}
		i += size
	}
	s.i = i
	return 0, 0, false, s.fail("unterminated string")
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// plain8 reports whether none of the eight bytes in x needs a closer look:
// no control character, '"', '\\' or non-ASCII byte. The zero-byte test
// (v-lsb)&^v&msb has false positives only above a real match, so a false
// result is exact.
func plain8(x uint64) bool {
	q := x ^ (lsb * '"')
	e := x ^ (lsb * '\\')
	return ((x-lsb*0x20)&^x|(q-lsb)&^q|(e-lsb)&^e|x)&msb == 0
}

// lookupField maps a top-level key (raw string content) to a known field.
func lookupField(raw []byte, escaped bool) int {
	if escaped {
		// Unescaping never grows a string, and known keys are at most 21
		// bytes (max_completion_tokens, chat_template_kwargs), each at most
		// 6 raw bytes as \uXXXX.
		if len(raw) > 6*21 {
			return fieldOther
		}
		var kb [6 * 21]byte
		raw = appendUnescaped(kb[:0], raw)
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
	}
	return fieldOther
}

func keyEquals(raw []byte, escaped bool, key string) bool {
	if !escaped {
		return string(raw) == key
	}
	if len(raw) > 6*len("include_usage") {
		return false
	}
	var kb [6 * len("include_usage")]byte
	return string(appendUnescaped(kb[:0], raw)) == key
}

// appendUnescaped appends the decoded form of a validated string's raw
// content to dst. It decodes exactly like encoding/json: a \u escape of a
// surrogate that does not form a valid pair becomes U+FFFD.
func appendUnescaped(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		switch raw[i+1] {
		case '"', '\\', '/':
			dst = append(dst, raw[i+1])
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
		}
		i += 2
	}
	return dst
}

func hex4(b []byte) rune {
	return rune(hexVal[b[0]])<<12 | rune(hexVal[b[1]])<<8 | rune(hexVal[b[2]])<<4 | rune(hexVal[b[3]])
}
