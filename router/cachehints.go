package router

import (
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/openai"
)

// Cache hints, as Infera injects them: the request's retention class
// (openai.Request.Retention; a request without a hint is long, Infera's
// default so that plain traffic still caches) goes to the engines that
// take it. SGLang gets "priority" (none 0, short 50, long 100: its
// priority radix eviction keeps higher longer) and "infera_retention";
// vLLM gets kv_transfer_params.infera_retention (read by Infera's KV
// connector) and the older top-level "_infera_retention". A field the
// client set itself is left as it is. Other engines get the body as is.

// sglangPriority is the SGLang priority of each retention class.
var sglangPriority = [...]string{
	openai.RetentionNone:  "0",
	openai.RetentionShort: "50",
	openai.RetentionLong:  "100",
}

// retentionJSON is each class as a JSON string.
var retentionJSON = [...]string{
	openai.RetentionNone:  `"none"`,
	openai.RetentionShort: `"short"`,
	openai.RetentionLong:  `"long"`,
}

// retentionValue is retentionJSON as jsonx.SetField values.
var retentionValue = [...][]byte{
	openai.RetentionNone:  []byte(`"none"`),
	openai.RetentionShort: []byte(`"short"`),
	openai.RetentionLong:  []byte(`"long"`),
}

// appendCacheHints appends to dst the body for a worker of engine, with the
// cache hints of scan (the body's scan) injected; ok is false when the
// engine takes none or the client set them all (send body as it is). tmp
// is a scratch buffer, returned for reuse. body is a valid object with at
// least one member (Scan accepted it).
func appendCacheHints(dst, tmp, body []byte, scan *openai.Request, engine string) (out, tmpOut []byte, ok bool) {
	// The body's open object first, the tail after it: the common bodies'
	// tails follow it as they are (the body copied once). Where the body
	// itself changes (end 0), the tail is the whole body, moved down over
	// the prefix.
	start := len(dst)
	open := objectEnd(body)
	out, tmp, end, ok := appendHintTail(append(dst, body[:open]...), tmp, body, scan, engine)
	if !ok {
		return dst[:start], tmp, false
	}
	if end == 0 {
		n := copy(out[start:], out[start+open:])
		out = out[:start+n]
	}
	return out, tmp, true
}

// appendHintTail is appendCacheHints without the copy of the body: the
// body for the worker is body[:end] followed by what it appends to dst
// (the hints and the closing brace), so that a request that writes
// itself copies the client's body once, into what goes out
// (ownRequest). end is 0 where the body itself changes (a
// kv_transfer_params of the client's gains a member): what it appends is
// then the whole body. ok false: as appendCacheHints's, dst as it was.
func appendHintTail(dst, tmp, body []byte, scan *openai.Request, engine string) (out, tmpOut []byte, end int, ok bool) {
	ret := scan.Retention
	if ret == openai.RetentionUnset {
		ret = openai.RetentionLong
	}
	switch engine {
	case discovery.EngineSGLang:
		if scan.HasPriority && scan.HasInferaRetention {
			return dst, tmp, 0, false
		}
		end = objectEnd(body)
		if !scan.HasPriority && !scan.HasInferaRetention {
			return append(dst, sglangHintTails[ret]...), tmp, end, true
		}
		if !scan.HasPriority {
			dst = appendMember(dst, "priority", sglangPriority[ret])
		}
		if !scan.HasInferaRetention {
			dst = appendMember(dst, "infera_retention", retentionJSON[ret])
		}
		return append(dst, '}'), tmp, end, true
	case discovery.EngineVLLM:
		kv := scan.KVTransferParams
		if !kv.Empty() && scan.KVTransferRetention && scan.HasLegacyRetention {
			return dst, tmp, 0, false
		}
		start := len(dst)
		switch {
		case kv.Empty() && !scan.HasLegacyRetention:
			return append(dst, vllmHintTails[ret]...), tmp, objectEnd(body), true
		case kv.Empty():
			end = objectEnd(body)
			dst = appendVLLMHint(dst, ret)
		case scan.KVTransferRetention:
			end = objectEnd(body)
		default:
			// An object gains the member; another value (null) is replaced.
			tmp = tmp[:0]
			if v := body[kv.Start:kv.End]; v[0] == '{' {
				var err error
				if tmp, err = jsonx.SetField(tmp, v, "infera_retention", retentionValue[ret], openai.MaxDepth); err != nil {
					return dst[:start], tmp, 0, false // unreachable: Scan validated it
				}
			} else {
				tmp = append(append(append(tmp, `{"infera_retention":`...), retentionJSON[ret]...), '}')
			}
			var err error
			if dst, err = jsonx.SetField(dst, body, "kv_transfer_params", tmp, openai.MaxDepth); err != nil {
				return dst[:start], tmp, 0, false // unreachable: Scan validated it
			}
			dst = dst[:len(dst)-1] // reopen the object
		}
		if !scan.HasLegacyRetention {
			dst = appendMember(dst, "_infera_retention", retentionJSON[ret])
		}
		return append(dst, '}'), tmp, end, true
	}
	return dst, tmp, 0, false
}

// appendVLLMHint appends vLLM's kv_transfer_params member of class ret.
func appendVLLMHint(dst []byte, ret openai.Retention) []byte {
	dst = append(appendMember(dst, "kv_transfer_params", `{"infera_retention":`), retentionJSON[ret]...)
	return append(dst, '}')
}

// The tails of the common bodies, where the client set no hint: every
// hint and the closing brace, made once (a request appends one string
// where it appended each member in pieces).
var (
	sglangHintTails = hintTails(func(b []byte, ret openai.Retention) []byte {
		b = appendMember(b, "priority", sglangPriority[ret])
		return appendMember(b, "infera_retention", retentionJSON[ret])
	})
	vllmHintTails = hintTails(func(b []byte, ret openai.Retention) []byte {
		return appendMember(appendVLLMHint(b, ret), "_infera_retention", retentionJSON[ret])
	})
)

// hintTails makes a tail for each retention class from members, which
// appends its hints.
func hintTails(members func(b []byte, ret openai.Retention) []byte) (t [len(retentionJSON)]string) {
	for r := range t {
		if retentionJSON[r] != "" {
			t[r] = string(append(members(nil, openai.Retention(r)), '}'))
		}
	}
	return t
}

// objectEnd is where body, an object, ends without its closing brace (and
// the white space before it): members can follow it, each after a comma.
func objectEnd(body []byte) int {
	end := len(body)
	for end > 0 && body[end-1] != '}' {
		end--
	}
	end--
	for end > 0 && isSpace(body[end-1]) {
		end--
	}
	return end
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// appendMember appends `,"key":value` to an open object.
func appendMember(dst []byte, key, value string) []byte {
	dst = append(dst, ',', '"')
	dst = append(dst, key...)
	dst = append(dst, '"', ':')
	return append(dst, value...)
}
