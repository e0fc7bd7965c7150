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
	// walk, when set, records each member's spans (SetFieldsWalk).
	walk *Walk
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
	m := walkMember{ks: ks, ke: ke, vs: vs, ve: e.s.I, kesc: kesc}
	if w := e.walk; w != nil {
		if len(w.members) < maxWalkMembers {
			w.members = append(w.members, m)
		} else {
			w.over = true
		}
	}
	e.place(e.s.B, &m)
	return nil
}

// place writes the member m of b as the edits make it: set, deleted or
// copied.
func (e *editor) place(b []byte, m *walkMember) {
	fields := e.edits()
	for i := range fields {
		f := &fields[i]
		if !Equal(b[m.ks:m.ke], m.kesc, f.Key) {
			continue
		}
		e.found |= 1 << i
		if f.Value == nil {
			return
		}
		e.sep()
		e.dst = append(e.dst, b[m.ks-1:m.vs]...)
		e.dst = append(e.dst, f.Value...)
		return
	}
	e.sep()
	e.dst = append(e.dst, b[m.ks-1:m.ve]...)
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
	return e.added(), nil
}

// added appends the edits' members that were not met and closes the
// object.
func (e *editor) added() []byte {
	for i, f := range e.edits() {
		if e.found&(1<<i) == 0 && f.Value != nil && !f.Existing {
			e.sep()
			e.dst = appendKey(e.dst, f.Key)
			e.dst = append(e.dst, f.Value...)
		}
	}
	return append(e.dst, '}')
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
// copied between quotes, without AppendQuoted's byte-by-byte look (~380
// instructions for an 18-byte key, against ~220 this way).
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
	return SetFieldsWalk(dst, body, fields, maxDepth, nil)
}

// checkFields is SetFields' check of its edits.
func checkFields(fields []Field) error {
	if len(fields) > MaxFields {
		return ErrFieldsRepeat
	}
	for i, f := range fields {
		if f.Value != nil && len(f.Value) == 0 {
			return ErrEmptyValue
		}
		for _, g := range fields[:i] {
			if g.Key == f.Key {
				return ErrFieldsRepeat
			}
		}
	}
	return nil
}

// Walk is an object's top-level members as a SetFieldsWalk found them
// (each key's and value's span), so that the same body can be edited
// again without walking it: one request's two PD legs are both edits of
// the client's body. Its buffer is kept across Resets (no allocation once
// grown); Reset it before a new body, which a pooled buffer may put at
// the same address.
//
// A walk may also be recorded by another validating scan of the body
// (openai.Scan: the router's first, which the legs' edits then need not
// repeat): Reset, Add each top-level member, Finish.
type Walk struct {
	body    []byte
	deepest int // the most containers nested in body (Scanner.Deepest)
	members []walkMember
	done    bool // members hold body's whole walk, which validated it
	over    bool // more than maxWalkMembers: not recorded
}

// walkMember is one member's spans: the key's raw content [ks, ke) (with
// escapes: kesc), the value [vs, ve).
type walkMember struct {
	ks, ke, vs, ve int
	kesc           bool
}

// maxWalkMembers bounds what a Walk records (and keeps): a body with
// more members is walked every time.
const maxWalkMembers = 64

// Reset empties w for a new body.
func (w *Walk) Reset() {
	*w = Walk{members: w.members[:0]}
}

// Add records one member of the top-level object being walked: its key's
// raw content [ks, ke) with whether it has escapes, its value [vs, ve)
// (Scanner.Object's member arguments, and the value's span).
func (w *Walk) Add(ks, ke int, kesc bool, vs, ve int) {
	if len(w.members) < maxWalkMembers {
		w.members = append(w.members, walkMember{ks: ks, ke: ke, vs: vs, ve: ve, kesc: kesc})
	} else {
		w.over = true
	}
}

// Finish marks the members added since Reset as the whole walk of body:
// every top-level member in order, body a JSON object validated as
// Scanner does without Lenient (white space after it included), whose
// deepest nesting was deepest (the Scanner's Deepest). Edits of body
// under a bound of at least deepest then splice from the walk.
func (w *Walk) Finish(body []byte, deepest int) {
	if w.over || len(w.body) != 0 || w.done {
		w.members = w.members[:0]
		return
	}
	w.body, w.deepest, w.done = body, deepest, true
}

// holds reports whether w has body's whole walk and a walk under maxDepth
// would have passed too.
func (w *Walk) holds(body []byte, maxDepth int) bool {
	return w.done && len(body) == len(w.body) && len(body) > 0 && &body[0] == &w.body[0] && (maxDepth <= 0 || w.deepest <= maxDepth)
}

// SetFieldsWalk is SetFields, the same bytes and errors, with the walk of
// body kept in w (nil: none): where w holds body's walk (the same slice
// since w's Reset, nested no deeper than maxDepth) the members are spliced
// from its spans without walking body again; where w holds none, this
// walk is recorded in it. The caller must not change body's bytes while w holds its walk.
func SetFieldsWalk(dst, body []byte, fields []Field, maxDepth int, w *Walk) ([]byte, error) {
	if err := checkFields(fields); err != nil {
		return dst, err
	}
	if fields == nil {
		fields = []Field{}
	}
	e := editor{fields: fields}
	if w != nil && w.holds(body, maxDepth) {
		e.dst = append(dst, '{')
		for i := range w.members {
			e.place(body, &w.members[i])
		}
		return e.added(), nil
	}
	if w == nil || w.done || w.over || len(w.members) > 0 {
		return e.run(dst, body, maxDepth)
	}
	e.walk = w
	out, err := e.run(dst, body, maxDepth)
	if err == nil && !w.over {
		w.body, w.deepest, w.done = body, e.s.Deepest, true
	} else {
		w.members = w.members[:0]
	}
	return out, err
}
