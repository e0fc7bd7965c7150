package kube

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// reprJSON writes a JSON value as Python's repr writes what json.loads
// makes of it (the reference puts repr(value) in its scaling messages):
// None, True, 3, 3.0, 'text', [1, 2], {'a': 1}. An absent value is None.
func reprJSON(raw json.RawMessage) string {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "None"
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return string(raw)
	}
	var b strings.Builder
	writeRepr(&b, v, raw)
	return b.String()
}

func writeRepr(b *strings.Builder, v any, raw json.RawMessage) {
	switch x := v.(type) {
	case nil:
		b.WriteString("None")
	case bool:
		if x {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case json.Number:
		if n, ok := intLiteral(json.RawMessage(x)); ok {
			b.WriteString(n.String())
		} else {
			b.WriteString(pyFloat(string(x)))
		}
	case string:
		b.WriteString(pyRepr(x))
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, e, nil)
		}
		b.WriteByte(']')
	case map[string]any:
		// A Python dict keeps the document's order; Go's map does not.
		keys := objectKeys(raw)
		if len(keys) != len(x) {
			keys = keys[:0]
			for k := range x {
				keys = append(keys, k)
			}
			slices.Sort(keys)
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyRepr(k))
			b.WriteString(": ")
			var sub json.RawMessage
			if ms, ok := objectMembers(raw); ok {
				for _, m := range ms {
					if m.key == k {
						sub = m.val
					}
				}
			}
			writeRepr(b, x[k], sub)
		}
		b.WriteByte('}')
	default:
		fmt.Fprint(b, x)
	}
}

func objectKeys(raw json.RawMessage) []string {
	ms, ok := objectMembers(raw)
	if !ok {
		return nil
	}
	keys := make([]string, len(ms))
	for i, m := range ms {
		keys[i] = m.key
	}
	return keys
}

// pyFloat writes a JSON number literal as Python's repr of the float
// json.loads makes of it: shortest round trip, ".0" on integral values,
// exponent form below 1e-4 and from 1e16 on, inf for overflow.
func pyFloat(lit string) string {
	f, _ := new(big.Float).SetPrec(53).SetString(lit)
	var x float64
	if f != nil {
		x, _ = f.Float64()
	}
	switch {
	case math.IsInf(x, 1):
		return "inf"
	case math.IsInf(x, -1):
		return "-inf"
	case x == 0:
		if math.Signbit(x) || strings.HasPrefix(lit, "-") {
			return "-0.0"
		}
		return "0.0"
	}
	// The decimal exponent of the shortest form decides, as in Python.
	e := strconv.FormatFloat(x, 'e', -1, 64)
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return e
	}
	s := strconv.FormatFloat(x, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// pyRepr writes a string as Python's repr does: single quotes unless the
// text holds a single quote and no double quote; backslash escapes for the
// quote, backslash, \t \n \r and other unprintable characters.
func pyRepr(s string) string {
	q := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x80 || unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xff:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte(q)
	return b.String()
}
