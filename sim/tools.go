package sim

import (
	"bytes"
)

// ToolTrigger in a chat prompt that has tools makes the simulator answer
// with a call of the first tool instead of text (unless the conversation
// already holds a tool result: then it answers in text, so that a client's
// tool round trip ends). The call is deterministic: ToolArguments as its
// arguments, streamed piece by piece as vLLM streams tool calls (a first
// delta with the call's id and name, then argument fragments, then
// finish_reason "tool_calls").
const ToolTrigger = "call_tool"

// ToolArguments are the arguments of every simulated tool call.
const ToolArguments = `{"input": "sim"}`

// toolCallName returns the raw JSON string content of the first tool's
// function name when the request triggers a tool call; nil otherwise.
func toolCallName(body []byte, r *request) []byte {
	if r.tools.empty() || r.messages.empty() {
		return nil
	}
	msgs := body[r.messages.start:r.messages.end]
	if !bytes.Contains(msgs, []byte(ToolTrigger)) || bytes.Contains(msgs, []byte(`"role":"tool"`)) {
		return nil
	}
	var name []byte
	s := newScanner(body[:r.tools.end], r.tools.start)
	first := true
	s.array(func() bool {
		if !first || s.peek() != '{' {
			return s.skip()
		}
		first = false
		return s.object(func(ks, ke int, _ bool) bool {
			if string(body[ks:ke]) != "function" || s.peek() != '{' {
				return s.skip()
			}
			return s.object(func(ks, ke int, _ bool) bool {
				if string(body[ks:ke]) != "name" || s.peek() != '"' {
					return s.skip()
				}
				st, en, _, ok := s.str()
				name = body[st:en:en]
				return ok
			})
		})
	})
	return name
}

// appendToolCallMessage appends the assistant message of a tool call
// (unary answer).
func (s *Server) appendToolCallMessage(b []byte, q *seq) []byte {
	b = append(b, `{"role":"assistant","content":null,"tool_calls":[{"id":"`...)
	b = s.appendID(b, "chatcmpl-tool-")
	b = append(b, `","type":"function","function":{"name":"`...)
	b = append(b, q.tool...)
	b = append(b, `","arguments":`...)
	b = appendJSONString(b, []byte(ToolArguments))
	return append(b, `}}]}`...)
}

// appendToolDelta appends the chunk(s) of output token i of a streamed
// tool call of choice c: the call's header with the first token, then one
// arguments fragment per token, the last with finish_reason tool_calls.
func (st *sseStream) appendToolDelta(b []byte, c, i int) []byte {
	q := st.q.choice(c)
	n := q.maxTokens
	if i == 0 {
		b = st.appendChoiceStart(b, c)
		b = append(b, `,"delta":{"role":"assistant","content":null,"tool_calls":[{"id":"`...)
		b = st.s.appendID(b, "chatcmpl-tool-")
		b = append(b, `","type":"function","index":0,"function":{"name":"`...)
		b = append(b, q.tool...)
		b = append(b, `","arguments":""}}]},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
	}
	args := ToolArguments
	piece := args[i*len(args)/n : (i+1)*len(args)/n]
	b = st.appendChoiceStart(b, c)
	b = append(b, `,"delta":{"tool_calls":[{"index":0,"function":{"arguments":`...)
	b = appendJSONString(b, []byte(piece))
	if i == n-1 {
		return append(b, `}}]},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}]}`+"\n\n"...)
	}
	return append(b, `}}]},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
}
