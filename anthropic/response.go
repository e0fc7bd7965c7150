package anthropic

import (
	"bytes"
	"strconv"

	"github.com/infera/infera/jsonx"
)

// ErrBadResponse: the engine's answer is not a readable chat completion.
var ErrBadResponse = &RequestError{Msg: "engine answered an unreadable chat completion", err: ErrInvalidRequest}

// AppendMessage appends the Anthropic message for the engine's OpenAI chat
// completion body: id msg_…, the first choice's text and tool calls as
// content blocks (tool_use with the parsed arguments as input),
// stop_reason (stop → end_turn, or stop_sequence with the matched
// stop_sequence; length → max_tokens; tool_calls → tool_use) and usage
// (input_tokens without the cached ones, output_tokens,
// cache_read_input_tokens from prompt_tokens_details.cached_tokens).
func AppendMessage(dst, body []byte) ([]byte, error) {
	var c chunk
	if !c.read(body) {
		return dst, ErrBadResponse
	}
	dst = append(dst, `{"id":"msg_`...)
	id := body[c.id.s:c.id.e]
	if bytes.HasPrefix(id, []byte("chatcmpl-")) {
		id = id[len("chatcmpl-"):]
	}
	dst = append(dst, id...)
	dst = append(dst, `","type":"message","role":"assistant","model":"`...)
	dst = append(dst, body[c.model.s:c.model.e]...)
	dst = append(dst, `","content":[`...)
	n := 0
	if c.content.ok() {
		dst = append(dst, `{"type":"text","text":"`...)
		dst = append(dst, body[c.content.s:c.content.e]...)
		dst = append(dst, `"}`...)
		n++
	}
	if c.tools.ok() {
		sc := jsonx.Scanner{B: body[:c.tools.e], I: c.tools.s, MaxDepth: maxDepth}
		var tmp []byte
		sc.Elements(func() bool {
			var tc toolDelta
			tc.read(&sc)
			if n > 0 {
				dst = append(dst, ',')
			}
			n++
			dst = append(dst, `{"type":"tool_use","id":"`...)
			if tc.id.ok() {
				dst = append(dst, body[tc.id.s:tc.id.e]...)
			} else {
				dst = append(dst, "toolu_"...)
				dst = strconv.AppendInt(dst, int64(n), 10)
			}
			dst = append(dst, `","name":"`...)
			dst = append(dst, body[tc.name.s:tc.name.e]...)
			dst = append(dst, `","input":`...)
			tmp = jsonx.AppendUnescaped(tmp[:0], body[tc.args.s:tc.args.e])
			tmp = bytes.TrimSpace(tmp)
			if len(tmp) > 0 && tmp[0] == '{' && jsonx.Valid(tmp, maxDepth) == nil {
				dst = append(dst, tmp...)
			} else {
				dst = append(dst, "{}"...)
			}
			dst = append(dst, '}')
			return true
		})
	}
	dst = append(dst, `],"stop_reason":`...)
	stop, seq := stopEndTurn, false
	switch string(body[c.finish.s:c.finish.e]) {
	case "length":
		stop = stopMaxTokens
	case "tool_calls":
		stop = stopToolUse
	default:
		if c.stopSeq.ok() || c.stopSeqEmpty {
			stop, seq = stopSequence, true
		}
	}
	dst = append(dst, stopNames[stop]...)
	dst = append(dst, `,"stop_sequence":`...)
	if seq {
		dst = append(append(append(dst, '"'), body[c.stopSeq.s:c.stopSeq.e]...), '"')
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"usage":`...)
	dst = c.usage.appendTo(dst)
	return append(dst, '}'), nil
}
