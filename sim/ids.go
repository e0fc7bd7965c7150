package sim

import (
	"strconv"

	"github.com/infera/infera/config"
)

// Token ids in answers (return_token_ids): a router that may continue a
// broken stream on another worker asks the engine for the prompt's and the
// output's token ids, so that the continuation is exact (prompt ids +
// output ids so far, on /v1/completions). The engines disagree on where the
// ids go, and the simulator answers in the shape of the engine it stands
// for:
//
//	vLLM    chunk choices[i].token_ids (the chunk's output ids); the
//	        prompt's ids once: top-level prompt_token_ids on chat (the
//	        role chunk), choices[i].prompt_token_ids on completions (the
//	        first token's chunk); unary answers carry all of them the
//	        same way.
//	SGLang  top-level "sglext": {"prompt_token_ids": [...] (first chunk
//	        only), "completion_token_ids": [[...] per choice]}; SGLang
//	        refuses return_token_ids on streaming chat (400), as the real
//	        engine does.
//
// ATOM's facade ignores the field (the engine is not known to accept it).

// idsShape is how an answer carries token ids.
type idsShape uint8

const (
	idsNone idsShape = iota
	idsVLLM
	idsSGLang
)

// idsFor is the shape of the ids an answer carries for a request that did
// (asked) or did not ask for them.
func (s *Server) idsFor(asked bool) idsShape {
	switch {
	case !asked:
		return idsNone
	case s.cfg.Flavor == config.FlavorSGLang:
		return idsSGLang
	case s.cfg.Flavor == config.FlavorATOM:
		return idsNone
	default:
		return idsVLLM
	}
}

// promptIDs are q's prompt token ids.
func (q *seq) promptIDs() []uint32 { return q.tokens[:q.promptLen] }

// outputIDs are q's output token ids from..to-1.
func (q *seq) outputIDs(from, to int) []uint32 {
	return q.tokens[q.promptLen+from : q.promptLen+to]
}

// appendIDs appends ids as a JSON array.
func appendIDs(b []byte, ids []uint32) []byte {
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	return append(b, ']')
}

// appendIDsField appends `,"name":[ids]` (field holds `,"name":`).
func appendIDsField(b []byte, field string, ids []uint32) []byte {
	return appendIDs(append(b, field...), ids)
}

// appendSGLangIDs appends SGLang's `,"sglext":{...}`: the prompt's ids
// when prompt is not nil, and one list of output ids per choice (of
// choices), out for choice c and empty for the others.
func appendSGLangIDs(b []byte, prompt []uint32, choices, c int, out []uint32) []byte {
	b = append(b, `,"sglext":{`...)
	if prompt != nil {
		b = appendIDsField(b, `"prompt_token_ids":`, prompt)
		b = append(b, ',')
	}
	b = append(b, `"completion_token_ids":[`...)
	for j := range choices {
		if j > 0 {
			b = append(b, ',')
		}
		if j == c {
			b = appendIDs(b, out)
		} else {
			b = append(b, "[]"...)
		}
	}
	return append(b, "]}"...)
}

// appendSGLangUnaryIDs appends a unary answer's `,"sglext":{...}`: the
// prompt's ids and every choice's output ids.
func appendSGLangUnaryIDs(b []byte, q *seq) []byte {
	b = append(b, `,"sglext":{`...)
	b = appendIDsField(b, `"prompt_token_ids":`, q.promptIDs())
	b = append(b, `,"completion_token_ids":[`...)
	for i := range q.numChoices() {
		if i > 0 {
			b = append(b, ',')
		}
		c := q.choice(i)
		b = appendIDs(b, c.outputIDs(0, c.maxTokens))
	}
	return append(b, "]}"...)
}
