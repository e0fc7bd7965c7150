package engargs

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ErrArgs wraps every command-line problem found here.
var ErrArgs = errors.New("invalid engine arguments")

// IsFlag reports whether arg is a flag rather than a value, as argparse
// decides: "-" and "--" are not flags, nor is a negative number ("-1",
// "-0.5", "-1e3").
func IsFlag(arg string) bool {
	if len(arg) < 2 || arg[0] != '-' || arg == "--" {
		return false
	}
	_, err := strconv.ParseFloat(arg, 64)
	return err != nil
}

// Split takes a flag argument apart: the name without its dashes, with "_"
// written "-" in the flag's own name (not in a dotted JSON key after it, nor
// in an inline value), and the inline value of --name=value. ok is false
// when arg is not a flag (see IsFlag).
func Split(arg string) (name, value string, inline, ok bool) {
	if !IsFlag(arg) {
		return "", "", false, false
	}
	body, found := strings.CutPrefix(arg, "--")
	if !found {
		body = arg[1:]
	}
	if body == "" {
		return "", "", false, false
	}
	name, value, inline = strings.Cut(body, "=")
	// Only the flag's own name: in "--kv-transfer-config.kv_role" the part
	// after the dot is a JSON key and keeps its underscores.
	head, path, dotted := strings.Cut(name, ".")
	name = strings.ReplaceAll(head, "_", "-")
	if dotted {
		name += "." + path
	}
	return name, value, inline, true
}

// Value returns the value of the flag at args[i]: its inline value, or the
// next argument whatever it looks like ("--model --weird-name" names the
// model "--weird-name"; the engine, not the worker, is the judge of
// that), and the index of the argument holding it.
func Value(args []string, i int, value string, inline bool) (string, int, error) {
	if inline {
		return value, i, nil
	}
	if i+1 >= len(args) {
		return "", i, fmt.Errorf("%w: %s needs a value", ErrArgs, args[i])
	}
	return args[i+1], i + 1, nil
}

// Flag is one flag occurrence.
type Flag struct {
	Name    string // normalised (see Split)
	Value   string // its value, when read
	At      int    // index of the argument holding the value (the flag itself when inline)
	Inline  bool
	HasArgs bool // Value was read (the flag takes a value)
}

// Walk calls fn for each flag before "--" whose name takes reports true,
// with its value read (see Value). fn may stop the walk with an error.
func Walk(args []string, takes func(name string) bool, fn func(Flag) error) error {
	for i := 0; i < len(args); i++ {
		if args[i] == "--" {
			return nil
		}
		name, value, inline, ok := Split(args[i])
		if !ok || !takes(name) {
			continue
		}
		v, at, err := Value(args, i, value, inline)
		if err != nil {
			return err
		}
		if err := fn(Flag{Name: name, Value: v, At: at, Inline: inline, HasArgs: true}); err != nil {
			return err
		}
		i = at
	}
	return nil
}

// Names returns a takes function for Walk matching any of names.
func Names(names ...string) func(string) bool {
	return func(n string) bool { return slices.Contains(names, n) }
}

// DecodeObject decodes a JSON object flag value (numbers as json.Number).
func DecodeObject(s string) (map[string]any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if obj == nil {
		return nil, errors.New("not a JSON object")
	}
	if dec.More() {
		return nil, errors.New("trailing data after the JSON object")
	}
	return obj, nil
}

// DottedValue reads a dotted key's value as vLLM does: JSON when it parses,
// else the plain string.
func DottedValue(s string) any {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err == nil && !dec.More() {
		return v
	}
	return s
}

// SetPath sets m[path[0]][path[1]]… = v, making the objects on the way.
func SetPath(m map[string]any, path []string, v any) {
	for _, k := range path[:len(path)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[path[len(path)-1]] = v
}

// SetDotted applies one dotted key ("endpoint", "a.b") of a JSON flag to
// obj (made when nil) and returns it.
func SetDotted(obj map[string]any, key, value string) (map[string]any, error) {
	path := strings.Split(key, ".")
	if key == "" || slices.Contains(path, "") {
		return obj, fmt.Errorf("%w: %q: empty key", ErrArgs, key)
	}
	if obj == nil {
		obj = map[string]any{}
	}
	SetPath(obj, path, DottedValue(value))
	return obj, nil
}

// JSONFlag is a JSON-object flag read from a command line: a whole object
// (the last one wins, as in argparse) merged with the dotted keys given.
type JSONFlag struct {
	Name    string
	Present bool
	Obj     map[string]any // the merged object; nil when absent
	At      int            // index of the argument with the last whole-object value; -1 when none
	Inline  bool           // that value was written --name={...}
	Keys    int            // keys in that object
	Dotted  bool           // a dotted key was given
}

// ParseJSON reads flag name (and its dotted keys) from args. A value that
// is not a JSON object is refused, as the engines refuse it.
func ParseJSON(args []string, name string) (JSONFlag, error) {
	j := JSONFlag{Name: name, At: -1}
	takes := func(n string) bool { return n == name || strings.HasPrefix(n, name+".") }
	err := Walk(args, takes, func(f Flag) error {
		j.Present = true
		if path, dotted := strings.CutPrefix(f.Name, name+"."); dotted {
			var err error
			if j.Obj, err = SetDotted(j.Obj, path, f.Value); err != nil {
				return err
			}
			j.Dotted = true
			return nil
		}
		obj, err := DecodeObject(f.Value)
		if err != nil {
			return fmt.Errorf("%w: --%s %q: %w", ErrArgs, name, Clip(f.Value), err)
		}
		j.Obj, j.At, j.Inline, j.Keys = obj, f.At, f.Inline, len(obj)
		return nil
	})
	if err != nil {
		return JSONFlag{}, err
	}
	return j, nil
}

// Clip shortens a value quoted in an error.
func Clip(s string) string {
	const n = 80
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
