package sim

import (
	"bytes"

	"github.com/infera/infera/jsonx"
)

// Stop sequences, as vLLM applies them: the answer ends at the earliest
// occurrence of any "stop" string in the generated text. The text sent
// stops before the match (the stop string is not included), the tokens
// counted as completion tokens are those generated up to and including the
// one that completed the match, and the choice ends with finish_reason
// "stop" and stop_reason the matched string. Because the generated text of
// a prompt is fixed whatever max_tokens is (generate.go), a client that
// saw an answer can pick a stop string from it and get it matched.

// applyStop truncates q's output (already generated: q.out, its token ends
// and q.tokens = prompt + output) at the earliest stop string of the raw
// "stop" value in body, and records the match.
func applyStop(q *seq, body []byte, stop span) {
	if stop.empty() || len(q.tool) > 0 {
		return
	}
	best, bestLen := -1, 0
	var bestRaw []byte
	var scratch [256]byte
	match := func(st, en int, esc bool) {
		raw := body[st:en]
		text := raw
		if esc {
			text = jsonx.AppendUnescaped(scratch[:0], raw)
		}
		if len(text) == 0 {
			return
		}
		if i := bytes.Index(q.out, text); i >= 0 && (best < 0 || i < best) {
			best, bestLen, bestRaw = i, len(text), raw
		}
	}
	s := newScanner(body[:stop.end], stop.start)
	if s.peek() == '"' {
		st, en, esc, _ := s.str()
		match(st, en, esc)
	} else {
		s.array(func() bool {
			st, en, esc, ok := s.str()
			match(st, en, esc)
			return ok
		})
	}
	if best < 0 {
		return
	}
	// The token that completes the match is the last one generated.
	end := best + bestLen
	k := end // bytes tokenizer: one token per byte
	if len(q.outEnds) > 0 {
		k = len(q.outEnds)
		for i, e := range q.outEnds {
			if int(e) >= end {
				k = i + 1
				break
			}
		}
		q.outEnds = q.outEnds[:k]
	}
	k = max(k, 1)
	q.maxTokens = k
	q.tokens = q.tokens[:q.promptLen+k]
	q.visible = best
	q.stopRaw = append(q.stopRaw[:0], bestRaw...)
}

// answer returns the answer's text: the output, cut before a matched stop.
func (q *seq) answer() []byte {
	if q.visible >= 0 {
		return q.out[:q.visible]
	}
	return q.out
}

// appendFinish appends `"finish_reason":…,"stop_reason":…` of the last
// token of a text answer.
func (q *seq) appendFinish(b []byte) []byte {
	if q.visible < 0 {
		return append(b, `"finish_reason":"length","stop_reason":null`...)
	}
	b = append(b, `"finish_reason":"stop","stop_reason":"`...)
	b = append(b, q.stopRaw...)
	return append(b, '"')
}

// tokenText clips output token i's bytes, out[start:end], to the answer's
// text.
func (q *seq) tokenText(start, end int) []byte {
	if q.visible >= 0 {
		start, end = min(start, q.visible), min(end, q.visible)
	}
	return q.out[start:end]
}
