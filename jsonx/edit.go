package jsonx

import "errors"

// ErrNotObject: the document edited is not a JSON object.
var ErrNotObject = errors.New("not a JSON object")

// ErrEmptyValue: SetField was given no value.
var ErrEmptyValue = errors.New("empty JSON value")

// editor walks the members of a top-level object and copies the kept ones.
type editor struct {
	s     Scanner
	dst   []byte
	key   string
	value []byte // nil: delete
	n     int    // members written
	found bool
}

func (e *editor) member(ks, ke int, kesc bool) error {
	vs := e.s.I
	if err := e.s.Value(); err != nil {
		return err
	}
	b := e.s.B
	if Equal(b[ks:ke], kesc, e.key) {
		e.found = true
		if e.value == nil {
			return nil
		}
		e.sep()
		e.dst = append(e.dst, b[ks-1:vs]...)
		e.dst = append(e.dst, e.value...)
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
	if !e.found && e.value != nil {
		e.sep()
		e.dst = AppendQuoted(e.dst, e.key)
		e.dst = append(e.dst, ':')
		e.dst = append(e.dst, e.value...)
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
	e := editor{key: key, value: value}
	return e.run(dst, body, maxDepth)
}

// DeleteField appends to dst the object body without its top-level
// members named key (unchanged when there is none); see SetField.
func DeleteField(dst, body []byte, key string, maxDepth int) ([]byte, error) {
	e := editor{key: key}
	return e.run(dst, body, maxDepth)
}
