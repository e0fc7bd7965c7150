package engines

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// jsonArg is an engine flag whose value is a JSON object: vLLM's and
// ATOM's --kv-transfer-config, vLLM's and SGLang's --kv-events-config. vLLM
// also takes such objects in dotted form, one key per flag
// ("--kv-events-config.endpoint tcp://*:5557"); both forms are read into one
// view. The worker reads these objects and adds keys the user left out,
// never changing one they set.
type jsonArg struct {
	name    string
	present bool
	obj     map[string]any // the merged object; nil when absent
	at      int            // index of the argument with the last whole-object value; -1 when none
	inline  bool           // that value was written --name={...}
	keys    int            // keys in that object (whether an added key needs a comma)
	dotted  bool           // a dotted key was given
}

// parseJSONArg reads flag name (and its dotted keys) from args. A value that
// is not a JSON object is refused: the engine would refuse it too, and the
// worker would otherwise advertise something the engine does not do.
func parseJSONArg(args []string, name string) (jsonArg, error) {
	j := jsonArg{name: name, at: -1}
	for i := 0; i < len(args); i++ {
		if args[i] == "--" {
			break
		}
		flag, ok := flagName(args[i])
		if !ok {
			continue
		}
		key, value, inline := strings.Cut(flag, "=")
		path, isDotted := strings.CutPrefix(key, name+".")
		if key != name && !isDotted {
			continue
		}
		valueAt := i
		if !inline {
			if i+1 >= len(args) {
				return jsonArg{}, fmt.Errorf("%w: %s needs a value", ErrEngineArgs, args[i])
			}
			i++
			valueAt, value = i, args[i]
		}
		j.present = true
		if isDotted {
			if path == "" || slices.Contains(strings.Split(path, "."), "") {
				return jsonArg{}, fmt.Errorf("%w: %s: empty key", ErrEngineArgs, args[valueAt])
			}
			if j.obj == nil {
				j.obj = map[string]any{}
			}
			setPath(j.obj, strings.Split(path, "."), dottedValue(value))
			j.dotted = true
			continue
		}
		obj, err := decodeObject(value)
		if err != nil {
			return jsonArg{}, fmt.Errorf("%w: --%s %q: %w", ErrEngineArgs, name, clipArg(value), err)
		}
		// A later whole object replaces what came before, as in argparse.
		j.obj, j.at, j.inline, j.keys = obj, valueAt, inline, len(obj)
	}
	return j, nil
}

func decodeObject(s string) (map[string]any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if obj == nil {
		return nil, fmt.Errorf("not a JSON object")
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after the JSON object")
	}
	return obj, nil
}

// dottedValue reads a dotted key's value as vLLM does: JSON when it parses,
// else the plain string.
func dottedValue(s string) any {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err == nil && !dec.More() {
		return v
	}
	return s
}

func setPath(m map[string]any, path []string, v any) {
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

// has reports whether the user set key (even to null).
func (j *jsonArg) has(key string) bool {
	_, ok := j.obj[key]
	return ok
}

// str returns key as a string; ok is false when absent or not a string.
func (j *jsonArg) str(key string) (string, bool) {
	s, ok := j.obj[key].(string)
	return s, ok
}

// object returns key as an object, or nil.
func (j *jsonArg) object(key string) map[string]any {
	m, _ := j.obj[key].(map[string]any)
	return m
}

// isFalse reports whether key is set to false (or "false"/"0").
func (j *jsonArg) isFalse(key string) bool {
	return isFalseValue(j.obj[key])
}

func isFalseValue(v any) bool {
	switch v := v.(type) {
	case bool:
		return !v
	case string:
		return strings.EqualFold(v, "false") || v == "0"
	case json.Number:
		return v.String() == "0"
	}
	return false
}

func isTrueValue(v any) bool {
	switch v := v.(type) {
	case bool:
		return v
	case string:
		return strings.EqualFold(v, "true") || v == "1"
	case json.Number:
		return v.String() == "1"
	}
	return false
}

// jsonKey is one key the worker adds, with its value already JSON-encoded.
type jsonKey struct {
	key, value string
}

// add returns the arguments with keys added to the object, and the
// arguments to append when the flag was absent. The user's own text is kept
// byte for byte: added keys go right after the opening brace of their last
// whole object; in dotted form they become more dotted flags.
func (j *jsonArg) add(args []string, keys []jsonKey) (out, extra []string) {
	if len(keys) == 0 {
		return args, nil
	}
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(jsonString(k.key))
		b.WriteByte(':')
		b.WriteString(k.value)
	}
	fields := b.String()
	switch {
	case !j.present:
		return args, []string{"--" + j.name, "{" + fields + "}"}
	case j.dotted || j.at < 0:
		for _, k := range keys {
			extra = append(extra, "--"+j.name+"."+k.key, dottedText(k.value))
		}
		return args, extra
	}
	out = slices.Clone(args)
	value := args[j.at]
	prefix := ""
	if j.inline {
		p, v, _ := strings.Cut(value, "=")
		prefix, value = p+"=", v
	}
	brace := strings.IndexByte(value, '{') // the value decoded as an object, so it has one
	sep := ""
	if j.keys > 0 {
		sep = ","
	}
	out[j.at] = prefix + value[:brace+1] + fields + sep + value[brace+1:]
	return out, nil
}

// dottedText is how a JSON value is written as a dotted flag's value:
// strings bare, everything else as JSON.
func dottedText(jsonValue string) string {
	var s string
	if err := json.Unmarshal([]byte(jsonValue), &s); err == nil {
		return s
	}
	return jsonValue
}

// jsonString encodes s as a JSON string without HTML escaping, so that
// endpoints stay readable in the command line.
func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}
