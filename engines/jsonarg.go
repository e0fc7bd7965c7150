package engines

import (
	"bytes"
	"encoding/json"
	"github.com/infera/infera/engargs"
	"slices"
	"strings"
)

// jsonArg is an engine flag whose value is a JSON object: vLLM's and
// ATOM's --kv-transfer-config, vLLM's and SGLang's --kv-events-config. vLLM
// also takes such objects in dotted form, one key per flag
// ("--kv-events-config.endpoint tcp://*:5557"); engargs.ParseJSON reads
// both forms into one view. The worker reads these objects and adds keys
// the user left out, never changing one they set.
type jsonArg struct {
	engargs.JSONFlag
}

// parseJSONArg reads flag name (and its dotted keys) from args. A value that
// is not a JSON object is refused: the engine would refuse it too, and the
// worker would otherwise advertise something the engine does not do.
func parseJSONArg(args []string, name string) (jsonArg, error) {
	j, err := engargs.ParseJSON(args, name)
	return jsonArg{j}, err
}

// has reports whether the user set key (even to null).
func (j *jsonArg) has(key string) bool {
	_, ok := j.Obj[key]
	return ok
}

// str returns key as a string; ok is false when absent or not a string.
func (j *jsonArg) str(key string) (string, bool) {
	s, ok := j.Obj[key].(string)
	return s, ok
}

// object returns key as an object, or nil.
func (j *jsonArg) object(key string) map[string]any {
	m, _ := j.Obj[key].(map[string]any)
	return m
}

// isFalse reports whether key is set to false (or "false"/"0").
func (j *jsonArg) isFalse(key string) bool {
	return isFalseValue(j.Obj[key])
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
	case !j.Present:
		return args, []string{"--" + j.Name, "{" + fields + "}"}
	case j.Dotted || j.At < 0:
		for _, k := range keys {
			extra = append(extra, "--"+j.Name+"."+k.key, dottedText(k.value))
		}
		return args, extra
	}
	out = slices.Clone(args)
	value := args[j.At]
	prefix := ""
	if j.Inline {
		p, v, _ := strings.Cut(value, "=")
		prefix, value = p+"=", v
	}
	brace := strings.IndexByte(value, '{') // the value decoded as an object, so it has one
	sep := ""
	if j.Keys > 0 {
		sep = ","
	}
	out[j.At] = prefix + value[:brace+1] + fields + sep + value[brace+1:]
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
