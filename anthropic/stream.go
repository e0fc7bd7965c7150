package anthropic

import (
	"bytes"
	"strconv"

	"github.com/infera/infera/jsonx"
)

// Stream translates an engine's OpenAI chat chunk stream (SSE) into
// Anthropic's Messages event stream, one complete SSE event at a time:
//
//	first chunk        → message_start, ping
//	delta.content      → content_block_start (text) once, content_block_delta (text_delta)
//	delta.tool_calls   → content_block_start (tool_use, id, name) per call,
//	                     content_block_delta (input_json_delta) per arguments piece
//	finish_reason      → content_block_stop; the stop reason is kept
//	usage chunk        → the usage is kept
//	[DONE]             → message_delta (stop_reason, stop_sequence, usage), message_stop
//	{"error":…}        → error
//
// A block is closed (content_block_stop) before the next one starts.
// Strings are copied in their raw JSON form: both APIs escape them alike,
// so nothing is decoded. The zero value is ready; Reset readies it for
// another stream. Once stopSeq has grown, Event allocates nothing.
type Stream struct {
	started, finished bool
	// tailAt is where the last chunk's "choices" member began: an engine
	// writes the same head (id, created, model) before it every time.
	tailAt     int
	open       blockKind
	next       int   // index of the next content block
	toolIndex  int64 // the OpenAI tool call index of the open tool block
	stop       stopReason
	stopSeq    []byte // raw JSON string content of the matched stop sequence
	hasStopSeq bool
	usage      usage
}

type blockKind uint8

const (
	blockNone blockKind = iota
	blockText
	blockTool
)

type stopReason uint8

const (
	stopNone stopReason = iota
	stopEndTurn
	stopMaxTokens
	stopToolUse
	stopSequence
)

var stopNames = [...]string{
	stopNone:      `"end_turn"`,
	stopEndTurn:   `"end_turn"`,
	stopMaxTokens: `"max_tokens"`,
	stopToolUse:   `"tool_use"`,
	stopSequence:  `"stop_sequence"`,
}

type usage struct {
	prompt, completion, cached int64
	seen                       bool
}

// Reset readies s for a new stream, keeping its buffer.
func (s *Stream) Reset() { *s = Stream{stopSeq: s.stopSeq[:0]} }

// Event appends the Anthropic events for one complete SSE event ev (its
// blank line included) to dst. Comments and events without data yield
// nothing.
func (s *Stream) Event(dst, ev []byte) []byte {
	for len(ev) > 0 {
		line, rest := ev, []byte(nil)
		i := bytes.IndexByte(ev, '\n')
		if i < 0 {
			i = len(ev)
		}
		if j := bytes.IndexByte(ev[:i], '\r'); j >= 0 {
			i = j
		}
		if i < len(ev) {
			line, rest = ev[:i], ev[i+1:]
		}
		ev = rest
		if len(line) < 5 || string(line[:5]) != "data:" {
			continue
		}
		data := line[5:]
		if len(data) > 0 && data[0] == ' ' {
			data = data[1:]
		}
		dst = s.data(dst, data)
	}
	return dst
}

// data handles one data line's payload.
func (s *Stream) data(dst, data []byte) []byte {
	if string(data) == "[DONE]" {
		return s.end(dst)
	}
	if s.finished {
		return dst
	}
	var c chunk
	// After the first chunk (id and model read) only the members from
	// "choices" on matter: the tail is read, the head skipped.
	if !(s.started && c.readTail(data, &s.tailAt)) && !c.read(data) {
		return AppendErrorEvent(dst, TypeAPI, "engine sent an unreadable stream event")
	}
	if c.err.ok() {
		s.finished = true
		return s.engineError(dst, data, c.err)
	}
	if !s.started {
		s.started = true
		dst = append(dst, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_"...)
		id := data[c.id.s:c.id.e]
		if bytes.HasPrefix(id, []byte("chatcmpl-")) {
			id = id[len("chatcmpl-"):]
		}
		dst = append(dst, id...)
		dst = append(dst, `","type":"message","role":"assistant","model":"`...)
		dst = append(dst, data[c.model.s:c.model.e]...)
		dst = append(dst, `","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}`+"\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n"...)
	}
	if c.content.ok() {
		if s.open != blockText {
			dst = s.closeBlock(dst)
			s.open = blockText
			dst = append(dst, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":"...)
			dst = strconv.AppendInt(dst, int64(s.next), 10)
			dst = append(dst, `,"content_block":{"type":"text","text":""}}`+"\n\n"...)
		}
		dst = append(dst, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":"...)
		dst = strconv.AppendInt(dst, int64(s.next), 10)
		dst = append(dst, `,"delta":{"type":"text_delta","text":"`...)
		dst = append(dst, data[c.content.s:c.content.e]...)
		dst = append(dst, "\"}}\n\n"...)
	}
	if c.tools.ok() {
		dst = s.toolCalls(dst, data, c.tools)
	}
	if c.finish.ok() {
		dst = s.closeBlock(dst)
		switch string(data[c.finish.s:c.finish.e]) {
		case "length":
			s.stop = stopMaxTokens
		case "tool_calls":
			s.stop = stopToolUse
		default:
			s.stop = stopEndTurn
			if c.stopSeq.ok() || c.stopSeqEmpty {
				s.stop = stopSequence
				s.hasStopSeq = true
				s.stopSeq = append(s.stopSeq[:0], data[c.stopSeq.s:c.stopSeq.e]...)
			}
		}
	}
	if c.usage.seen {
		s.usage = c.usage
	}
	return dst
}

// closeBlock ends the open content block, if any.
func (s *Stream) closeBlock(dst []byte) []byte {
	if s.open == blockNone {
		return dst
	}
	dst = append(dst, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":"...)
	dst = strconv.AppendInt(dst, int64(s.next), 10)
	dst = append(dst, "}\n\n"...)
	s.open = blockNone
	s.next++
	return dst
}

// toolCalls handles a delta's tool_calls array.
func (s *Stream) toolCalls(dst, data []byte, p span) []byte {
	sc := jsonx.Scanner{B: data[:p.e], I: p.s, MaxDepth: maxDepth}
	sc.Elements(func() bool {
		var tc toolDelta
		tc.read(&sc)
		if tc.id.ok() || tc.name.ok() || s.open != blockTool || tc.index != s.toolIndex {
			dst = s.closeBlock(dst)
			s.open, s.toolIndex = blockTool, tc.index
			dst = append(dst, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":"...)
			dst = strconv.AppendInt(dst, int64(s.next), 10)
			dst = append(dst, `,"content_block":{"type":"tool_use","id":"`...)
			if tc.id.ok() {
				dst = append(dst, data[tc.id.s:tc.id.e]...)
			} else {
				dst = append(dst, "toolu_"...)
				dst = strconv.AppendInt(dst, int64(s.next), 10)
			}
			dst = append(dst, `","name":"`...)
			dst = append(dst, data[tc.name.s:tc.name.e]...)
			dst = append(dst, `","input":{}}}`+"\n\n"...)
		}
		if tc.args.ok() {
			dst = append(dst, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":"...)
			dst = strconv.AppendInt(dst, int64(s.next), 10)
			dst = append(dst, `,"delta":{"type":"input_json_delta","partial_json":"`...)
			dst = append(dst, data[tc.args.s:tc.args.e]...)
			dst = append(dst, "\"}}\n\n"...)
		}
		return true
	})
	return dst
}

// end closes the message: message_delta and message_stop.
func (s *Stream) end(dst []byte) []byte {
	if s.finished || !s.started {
		s.finished = true
		return dst
	}
	s.finished = true
	dst = s.closeBlock(dst)
	dst = append(dst, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"...)
	dst = append(dst, stopNames[s.stop]...)
	dst = append(dst, `,"stop_sequence":`...)
	if s.hasStopSeq {
		dst = append(append(append(dst, '"'), s.stopSeq...), '"')
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `},"usage":`...)
	dst = s.usage.appendTo(dst)
	return append(dst, "}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
}

// appendTo appends the Anthropic usage object: input_tokens does not count
// the prompt tokens read from the cache (cache_read_input_tokens).
func (u *usage) appendTo(dst []byte) []byte {
	dst = append(dst, `{"input_tokens":`...)
	dst = strconv.AppendInt(dst, max(0, u.prompt-u.cached), 10)
	dst = append(dst, `,"output_tokens":`...)
	dst = strconv.AppendInt(dst, u.completion, 10)
	dst = append(dst, `,"cache_read_input_tokens":`...)
	dst = strconv.AppendInt(dst, u.cached, 10)
	return append(dst, `,"cache_creation_input_tokens":0}`...)
}

// engineError turns an engine's in-stream error object into an error event.
func (s *Stream) engineError(dst, data []byte, p span) []byte {
	msg := engineMessage(data)
	dst = append(dst, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\""...)
	if msg.raw != nil {
		dst = append(dst, msg.raw...)
	} else {
		dst = append(dst, "engine error"...)
	}
	return append(dst, "\"}}\n\n"...)
}

// chunk is what Event reads of one OpenAI chunk: raw string contents
// (without quotes) of id, model, the first choice's delta.content,
// finish_reason and string stop_reason; the tool_calls and error values.
type chunk struct {
	id, model, content, finish, stopSeq span
	stopSeqEmpty                        bool
	tools, err                          span
	usage                               usage
}

// str reads a string value's raw content (false: not a string, consumed).
func str(sc *jsonx.Scanner) (span, bool) {
	if peek(sc) == '"' {
		st, en, _, err := sc.String()
		return span{st, en}, err == nil
	}
	return span{}, sc.Value() == nil
}

func (c *chunk) read(data []byte) bool {
	sc := jsonx.Scanner{B: data, MaxDepth: maxDepth}
	sc.SkipWS()
	if sc.I >= len(data) || data[sc.I] != '{' {
		return false
	}
	ok := sc.Members(func(ks, ke int, _ bool) bool {
		var good bool
		switch string(data[ks:ke]) {
		case "id":
			c.id, good = str(&sc)
		case "model":
			c.model, good = str(&sc)
		case "choices":
			good = c.choices(&sc)
		case "usage":
			good = c.readUsage(&sc)
		case "error":
			st := sc.I
			good = sc.Value() == nil
			c.err = span{st, sc.I}
		default:
			good = sc.Value() == nil
		}
		return good
	})
	return ok
}

// choicesKey starts the member a chunk's tail begins with.
var choicesKey = []byte(`"choices":`)

// readTail reads the members of the chunk object data from its "choices"
// member on (vLLM and SGLang write id, object, created and model before
// it; usage after it). False: no such member, or the tail is not well
// formed; the caller reads the whole chunk then. *at is where the member
// was last found (tried first; a search otherwise), and is updated.
func (c *chunk) readTail(data []byte, at *int) bool {
	i := *at
	if i <= 0 || i+len(choicesKey) > len(data) || string(data[i:i+len(choicesKey)]) != string(choicesKey) {
		if i = bytes.Index(data, choicesKey); i <= 0 {
			return false
		}
		*at = i
	}
	if c.readText(data, i+len(choicesKey)) {
		return true
	}
	return c.walkTail(data, i+len(choicesKey))
}

// walkTail reads the tail of a chunk from the "choices" value at i on.
func (c *chunk) walkTail(data []byte, i int) bool {
	sc := jsonx.Scanner{B: data, I: i, MaxDepth: maxDepth, Depth: 1}
	sc.SkipWS()
	if !c.choices(&sc) {
		*c = chunk{}
		return false
	}
	for {
		sc.SkipWS()
		if sc.I >= len(data) {
			*c = chunk{}
			return false
		}
		if data[sc.I] == '}' {
			sc.I++
			sc.SkipWS()
			if sc.I != len(data) {
				*c = chunk{}
				return false
			}
			return true
		}
		if data[sc.I] != ',' {
			*c = chunk{}
			return false
		}
		sc.I++
		sc.SkipWS()
		if sc.I >= len(data) || data[sc.I] != '"' {
			*c = chunk{}
			return false
		}
		ks, ke, _, err := sc.String()
		if err != nil {
			*c = chunk{}
			return false
		}
		sc.SkipWS()
		if sc.I >= len(data) || data[sc.I] != ':' {
			*c = chunk{}
			return false
		}
		sc.I++
		sc.SkipWS()
		var good bool
		switch string(data[ks:ke]) {
		case "usage":
			good = c.readUsage(&sc)
		case "error":
			st := sc.I
			good = sc.Value() == nil
			c.err = span{st, sc.I}
		default:
			good = sc.Value() == nil
		}
		if !good {
			*c = chunk{}
			return false
		}
	}
}

// The tail of a plain text chunk as vLLM, SGLang and the simulator write
// it: textHead, the content string, textTail, the end of the chunk.
const (
	textHead = `[{"index":0,"delta":{"content":"`
	textTail = `},"logprobs":null,"finish_reason":null}]}`
)

// readText is readTail's fast path for the text chunk (most of a stream):
// when the tail from i (the "choices" value) is exactly textHead, a valid
// string and textTail, it reads the content span and reports true; what the
// general walk would read from such a tail is the content alone. Anything
// else (other members, white space, usage) is left to the walk.
func (c *chunk) readText(data []byte, i int) bool {
	if len(data)-i < len(textHead)+1+len(textTail) || string(data[i:i+len(textHead)]) != textHead {
		return false
	}
	sc := jsonx.Scanner{B: data, I: i + len(textHead) - 1, MaxDepth: maxDepth}
	st, en, _, err := sc.String()
	if err != nil || string(data[sc.I:]) != textTail {
		return false
	}
	c.content = span{st, en}
	return true
}

// choices reads the first choice (index 0) of the array.
func (c *chunk) choices(sc *jsonx.Scanner) bool {
	if peek(sc) != '[' {
		return sc.Value() == nil
	}
	b := sc.B
	first := true
	return sc.Elements(func() bool {
		if !first || peek(sc) != '{' {
			return sc.Value() == nil
		}
		first = false
		return sc.Members(func(ks, ke int, _ bool) bool {
			switch string(b[ks:ke]) {
			case "delta", "message":
				if peek(sc) != '{' {
					return sc.Value() == nil
				}
				return sc.Members(func(ks, ke int, _ bool) bool {
					switch string(b[ks:ke]) {
					case "content":
						var good bool
						c.content, good = str(sc)
						return good
					case "tool_calls":
						st := sc.I
						good := sc.Value() == nil
						if st < len(b) && b[st] == '[' {
							c.tools = span{st, sc.I}
						}
						return good
					}
					return sc.Value() == nil
				})
			case "finish_reason":
				var good bool
				c.finish, good = str(sc)
				return good
			case "stop_reason":
				isStr := peek(sc) == '"'
				var good bool
				c.stopSeq, good = str(sc)
				c.stopSeqEmpty = isStr && !c.stopSeq.ok()
				return good
			}
			return sc.Value() == nil
		})
	})
}

// readUsage reads the usage object.
func (c *chunk) readUsage(sc *jsonx.Scanner) bool {
	if peek(sc) != '{' {
		return sc.Value() == nil
	}
	b := sc.B
	c.usage.seen = true
	return sc.Members(func(ks, ke int, _ bool) bool {
		switch string(b[ks:ke]) {
		case "prompt_tokens":
			return readInt(sc, &c.usage.prompt)
		case "completion_tokens":
			return readInt(sc, &c.usage.completion)
		case "prompt_tokens_details":
			if peek(sc) != '{' {
				return sc.Value() == nil
			}
			return sc.Members(func(ks, ke int, _ bool) bool {
				if string(b[ks:ke]) == "cached_tokens" {
					return readInt(sc, &c.usage.cached)
				}
				return sc.Value() == nil
			})
		}
		return sc.Value() == nil
	})
}

func readInt(sc *jsonx.Scanner, v *int64) bool {
	st := sc.I
	if sc.Value() != nil {
		return false
	}
	if n, ok := jsonx.ParseInt(sc.B[st:sc.I]); ok && n >= 0 {
		*v = n
	}
	return true
}

// toolDelta is one element of a delta's tool_calls.
type toolDelta struct {
	index          int64
	id, name, args span
}

func (tc *toolDelta) read(sc *jsonx.Scanner) {
	b := sc.B
	if peek(sc) != '{' {
		_ = sc.Value()
		return
	}
	sc.Members(func(ks, ke int, _ bool) bool {
		switch string(b[ks:ke]) {
		case "index":
			return readInt(sc, &tc.index)
		case "id":
			var good bool
			tc.id, good = str(sc)
			return good
		case "function":
			if peek(sc) != '{' {
				return sc.Value() == nil
			}
			return sc.Members(func(ks, ke int, _ bool) bool {
				var good bool
				switch string(b[ks:ke]) {
				case "name":
					tc.name, good = str(sc)
				case "arguments":
					tc.args, good = str(sc)
				default:
					good = sc.Value() == nil
				}
				return good
			})
		}
		return sc.Value() == nil
	})
}

// peek is the byte the scanner is at, or 0 at the end of the input, so
// truncated engine events fail the scan instead of indexing past it.
func peek(sc *jsonx.Scanner) byte {
	if sc.I < len(sc.B) {
		return sc.B[sc.I]
	}
	return 0
}
