package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

// parseJSONValueDecoder is the encoding/json-based decoding that
// parseJSONValue must reproduce value for value.
func parseJSONValueDecoder(raw []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValueRef(dec, 0)
	if err != nil {
		return v, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return v, fmt.Errorf("trailing data after JSON value: %w", ErrInvalidMessages)
	}
	return v, nil
}

func decodeValueRef(dec *json.Decoder, depth int) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), fmt.Errorf("%w: %w", ErrInvalidMessages, err)
	}
	switch x := tok.(type) {
	case json.Delim:
		if depth >= maxJSONDepth { // at most maxJSONDepth nested containers
			return jinja.Undefined(), fmt.Errorf("nesting over %d: %w", maxJSONDepth, ErrInvalidMessages)
		}
		switch x {
		case '[':
			var items []jinja.Value
			for dec.More() {
				it, err := decodeValueRef(dec, depth+1)
				if err != nil {
					return it, err
				}
				items = append(items, it)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), fmt.Errorf("%w: %w", ErrInvalidMessages, err)
			}
			return jinja.NewList(items), nil
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), fmt.Errorf("%w: %w", ErrInvalidMessages, err)
				}
				key, _ := kt.(string)
				val, err := decodeValueRef(dec, depth+1)
				if err != nil {
					return val, err
				}
				d.AsDict().Set(key, val)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), fmt.Errorf("%w: %w", ErrInvalidMessages, err)
			}
			return d, nil
		}
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(x), nil
	case string:
		return jinja.NewString(x), nil
	case json.Number:
		return jinja.FromGoValue(x), nil
	}
	return jinja.Undefined(), fmt.Errorf("unexpected JSON token %v: %w", tok, ErrInvalidMessages)
}

var jsonValueCases = []string{
	`[]`, `{}`, `null`, `true`, ` false `, `0`, `-1.5e+3`, `"a\u00e9\ud83d\ude00\ud800"`, "\"\xff\"",
	`[1,[2,[3]],{"a":{"b":[]}},"x",null,true]`,
	`{"k":1,"k":2,"j":[1,2],"\u006b":3}`,
	`{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}}]}`,
	`[1,]`, `{"a"}`, `[1] 2`, `01`, `"\x"`, "\"a\tb\"", `[` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 70) + `]`,
	``, `   `, `nul`, `{"a":1,}`,
}

func TestParseJSONValueMatchesDecoder(t *testing.T) {
	for _, c := range jsonValueCases {
		checkJSONValue(t, []byte(c))
	}
}

func checkJSONValue(t *testing.T, raw []byte) {
	t.Helper()
	want, werr := parseJSONValueDecoder(raw)
	got, gerr := parseJSONValue(raw)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("%q: decoder err %v, fast err %v", raw, werr, gerr)
	}
	if gerr != nil {
		if !errors.Is(gerr, ErrInvalidMessages) {
			t.Fatalf("%q: %v does not wrap ErrInvalidMessages", raw, gerr)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\n got %#v\nwant %#v", raw, got, want)
	}
}

func FuzzParseJSONValue(f *testing.F) {
	for _, c := range jsonValueCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkJSONValue(t, raw) })
}
