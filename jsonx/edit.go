package jsonx

import (
	"bytes"
	"errors"
	"strings"
	"unsafe"
)

// ErrNotObject: the document edited is not a JSON object.
var ErrNotObject = errors.New("not a JSON object")

// ErrEmptyValue: SetField was given no value.
var ErrEmptyValue = errors.New("empty JSON value")

// Field is one top-level edit of SetFields: Key set to Value, a raw JSON
// value the caller has made valid, or deleted when Value is nil. With
// Existing only the members already there are set: none is added.
type Field struct {
	Key      string
	Value    []byte
	Existing bool
}

// MaxFields is the most edits SetFields applies in one pass.
const MaxFields = 64

// editor walks the members of a top-level object and copies the kept ones.
type editor struct {
	s   Scanner
	dst []byte
	// one is SetField's and DeleteField's edit; SetFields' are in fields
	// (one edit kept in the editor itself does not make its caller's
	// escape: the editor's content leaks through the scanner's errors).
	one    [1]Field
	fields []Field
	n      int    // members written
	found  uint64 // bit i: a member named edit i's key was met
}

// edits returns the editor's edits.
func (e *editor) edits() []Field {
	if e.fields == nil {
		return e.one[:]
	}
	return e.fields
}

func (e *editor) member(ks, ke int, kesc bool) error {
	vs := e.s.I
	if err := e.s.Value(); err != nil {
		return err
	}
	b := e.s.B
	fields := e.edits()
	for i := range fields {
		f := &fields[i]
		if !Equal(b[ks:ke], kesc, f.Key) {
			continue
		}
		e.found |= 1 << i
		if f.Value == nil {
			return nil
		}
		e.sep()
		e.dst = append(e.dst, b[ks-1:vs]...)
		e.dst = append(e.dst, f.Value...)
		return nil
	}
	e.sep()
	e.dst = append(e.dst, b[ks-1:e.s.I]...)
	return nil
}

func (e *editor) sep() {
	if e.n > 0 {
		e.dst = append(e.dst, ',')
	}
	e.n++
}

func (e *editor) run(dst, body []byte, maxDepth int) ([]byte, error) {
	e.s = Scanner{B: body, MaxDepth: maxDepth}
	e.dst = append(dst, '{')
	e.s.SkipWS()
	if e.s.I >= len(body) || body[e.s.I] != '{' {
		if err := e.s.Value(); err != nil {
			return dst, err
		}
		return dst, ErrNotObject
	}
	if err := e.s.Object(e.member); err != nil {
		return dst, err
	}
	if err := e.s.End(); err != nil {
		return dst, err
	}
	for i, f := range e.edits() {
		if e.found&(1<<i) == 0 && f.Value != nil && !f.Existing {
			e.sep()
			e.dst = appendKey(e.dst, f.Key)
			e.dst = append(e.dst, f.Value...)
		}
	}
	return append(e.dst, '}'), nil
}

// SetField appends to dst the object body with its top-level member key
// set to value, a raw JSON value the caller has made valid: every member of
// that name gets value, or the member is added at the end. Other members
// are copied byte for byte (white space between members is dropped). The
// body is validated on the way (maxDepth as Scanner.MaxDepth). It does not
// allocate when dst has room; on error dst is returned unchanged.
func SetField(dst, body []byte, key string, value []byte, maxDepth int) ([]byte, error) {
	if len(value) == 0 {
		return dst, ErrEmptyValue
	}
	e := editor{one: [1]Field{{Key: key, Value: value}}}
	return e.run(dst, body, maxDepth)
}

// SetFieldValid is SetField for an object obj the caller has made valid
// (built so, or checked by Valid or a Scanner with the same maxDepth): the
// same bytes and errors. Where obj has no white space, no escape and no
// occurrence of key's bytes (a compact object without that member: an
// engine's kv_transfer_params hand-off, a constant) SetField would copy it
// whole and add the member at the end, so that is done without walking
// obj; otherwise SetField walks it.
func SetFieldValid(dst, obj []byte, key string, value []byte, maxDepth int) ([]byte, error) {
	n := len(obj)
	if len(value) == 0 || n < 2 || obj[0] != '{' || obj[n-1] != '}' || !compactUnescaped(obj) || strings.Contains(unsafe.String(unsafe.SliceData(obj), n), key) {
		return SetField(dst, obj, key, value, maxDepth)
	}
	dst = append(dst, obj[:n-1]...)
	if n > 2 {
		dst = append(dst, ',')
	}
	dst = appendKey(dst, key)
	dst = append(dst, value...)
	return append(dst, '}'), nil
}

// appendKey appends key as a member's key: AppendQuoted's bytes and a
// colon. A key with nothing to escape (every key the router adds) is
// copied between quotes, without AppendQuoted's byte-by-byte look (~100
// instructions a key of 18 bytes).
func appendKey(dst []byte, key string) []byte {
	if plainString(key) {
		dst = append(dst, '"')
		dst = append(dst, key...)
		return append(dst, '"', ':')
	}
	dst = AppendQuoted(dst, key)
	return append(dst, ':')
}

// plainString reports whether s is all plain string content (String's
// sense: no control character, '"', '\\' or byte from 0x80), so that
// AppendQuoted would write it between quotes unchanged.
func plainString(s string) bool {
	b := unsafe.Slice(unsafe.StringData(s), len(s))
	for _, c := range b[plainEnd(b, 0):] {
		if c >= 0x80 || !strSafe[c] {
			return false
		}
	}
	return true
}

// compactUnescaped reports whether b has no JSON white space and no
// backslash: a valid object's members then lie as SetField writes them,
// and a member's key is its bytes between quotes.
func compactUnescaped(b []byte) bool {
	for _, c := range [...]byte{' ', '\\', '\n', '\t', '\r'} {
		if bytes.IndexByte(b, c) >= 0 {
			return false
		}
	}
	return true
}

// DeleteField appends to dst the object body without its top-level
// members named key (unchanged when there is none); see SetField.
func DeleteField(dst, body []byte, key string, maxDepth int) ([]byte, error) {
	e := editor{one: [1]Field{{Key: key}}}
	return e.run(dst, body, maxDepth)
}

// ErrFieldsRepeat: SetFields was given a key twice, or more than MaxFields
// edits.
var ErrFieldsRepeat = errors.New("a key edited twice, or too many edits")

// SetFields appends to dst the object body with every edit of fields
// applied in one pass: the bytes SetField and DeleteField would give
// applied one after the other in the order of fields (members set in
// place, those not found added at the end in that order; an Existing
// field's SetField only when body has the member). Keys must be
// distinct (ErrFieldsRepeat), values non-empty or nil (ErrEmptyValue). It
// does not allocate when dst has room; on error dst is returned unchanged.
func SetFields(dst, body []byte, fields []Field, maxDepth int) ([]byte, error) {
	if len(fields) > MaxFields {
		return dst, ErrFieldsRepeat
	}
	for i, f := range fields {
		if f.Value != nil && len(f.Value) == 0 {
			return dst, ErrEmptyValue
		}
		for _, g := range fields[:i] {
			if g.Key == f.Key {
				return dst, ErrFieldsRepeat
			}
		}
	}
	if fields == nil {
		fields = []Field{}
	}
	e := editor{fields: fields}
	return e.run(dst, body, maxDepth)
}
