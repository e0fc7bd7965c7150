package continuation

import (
	"bytes"

	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/openai"
)

// Poison is why a stream cannot be continued; PoisonNone: it can be.
type Poison uint8

// The reasons a stream is never continued.
const (
	PoisonNone        Poison = iota
	PoisonChoices            // n > 1, best_of > 1, or a chunk with another choice
	PoisonUnparseable        // a chunk that is not a JSON object of the expected shape
	PoisonPrompt             // a prompt the text path cannot extend (token ids without output ids, a list)
	PoisonToolCalls          // tool calls or reasoning, on the text path
)

// String is the reason's label (metrics, logs).
func (p Poison) String() string {
	switch p {
	case PoisonChoices:
		return "choices"
	case PoisonUnparseable:
		return "unparseable"
	case PoisonPrompt:
		return "prompt"
	case PoisonToolCalls:
		return "tool_calls"
	}
	return ""
}

// Tracker follows one stream as its chunks go to the client. The zero value
// is ready; Reset readies a used one.
//
// What a steady chunk reads and writes of the Tracker comes first, in
// 112 bytes (two cache lines where the Tracker starts one): under many
// streams a relay's Tracker is out of the nearest cache at each of its
// chunks, and each line is a miss.
type Tracker struct {
	// lay holds the chunk layouts the fast path matches (fast.go), what
	// the full read of a chunk found (its shape) and the prompt's ids,
	// kept across streams (or lent by Pool for one) behind a pointer, so
	// that Reset copies none of them and a pooled relay's Tracker stays a
	// few cache lines; nil until the first chunk is read.
	lay *layouts
	// steady is the steady layout (template.steady) the last chunk
	// matched, while it is the one the next chunk is tried with first
	// (layouts.next): the next chunk goes to it without the lookup, a
	// dependent load of the layouts' hit; nil: look it up.
	steady *template

	// Strip: remove the id fields from chunks (the router asked for them,
	// the client did not).
	Strip bool
	// begun: a chunk of this stream was read.
	begun bool
	// Finished: a chunk carried a finish_reason; Done: [DONE] went by.
	Finished, Done bool
	// kept: ID, Created and Model all hold their value (keepStream has
	// none left to take).
	kept bool
	// HasPrompt: an engine gave the prompt's token ids (PromptIDs reads
	// them).
	HasPrompt bool
	// ToolsOrReasoning: a delta carried tool calls, a function call or
	// reasoning content (the text path cannot carry them over).
	ToolsOrReasoning bool
	// Poisoned is set by a chunk that makes the stream impossible to
	// continue.
	Poisoned Poison

	// OutIDs are the output ids delivered so far.
	OutIDs []uint32
	// TextChunks counts the chunks that carried text, IDChunks those of
	// them that carried ids too; Text is the text delivered so far
	// (unescaped).
	TextChunks int
	IDChunks   int
	Text       []byte
	// fastChunks counts the chunks the fast path read, tries the layouts
	// it tried on them.
	fastChunks, tries int

	// ID, Created and Model are the raw JSON values of the stream's first
	// "id", "created" and "model" (for reshaped chunks).
	ID, Created, Model []byte
	// Pool, when set, lends the Tracker its layouts for one stream at a
	// time (LayoutPool); nil: the Tracker keeps its own across streams.
	Pool *LayoutPool

	out      []byte
	chunkIDs bool // the chunk being read carried output ids
	chunkTxt bool // ... or text
	// noFast turns the fast path off (tests compare the two paths);
	// rebases and restamps count the layouts it moved to another
	// stream's id, time and model.
	noFast            bool
	rebases, restamps int
}

// Reset readies t for a new stream, keeping its buffers and its layouts;
// layouts that Pool lent go back to it.
func (t *Tracker) Reset(strip bool) {
	lay := t.lay
	if lay != nil && t.Pool != nil {
		t.Pool.give(lay)
		lay = nil
	}
	*t = Tracker{
		Strip:   strip,
		OutIDs:  t.OutIDs[:0],
		Text:    t.Text[:0],
		ID:      t.ID[:0],
		Created: t.Created[:0],
		Model:   t.Model[:0],
		Pool:    t.Pool,
		out:     t.out[:0],
		lay:     lay,
		noFast:  t.noFast,
	}
}

// PromptIDs appends the prompt's token ids to dst (HasPrompt: an engine
// gave them). They are validated here, when a continuation needs them.
func (t *Tracker) PromptIDs(dst []uint32) ([]uint32, error) {
	if !t.HasPrompt {
		return dst, nil
	}
	return openai.AppendTokenIDs(dst, t.lay.prompt)
}

const (
	dataSpace = "data: "
	doneEvent = "data: [DONE]\n\n" // the end of a stream, as engines write it
)

var (
	dataPrefix = []byte("data:")
	doneData   = []byte("[DONE]")
)

// ObserveEvent reads one SSE event (its lines and the blank line that ends
// it, as openai.NextEvent delimits them) and returns the event the client
// should see: the same bytes, or, when ids were stripped, the event
// rewritten as one "data: " line. The result is valid until the next call.
// Events without a data line (comments, heartbeats) pass unchanged.
func (t *Tracker) ObserveEvent(ev []byte) []byte {
	start, end, ok := t.eventData(ev)
	if !ok {
		return ev
	}
	data := ev[start:end]
	if a, b, _, ok := t.matchFast(data, false); ok {
		if a < 0 {
			return ev
		}
		// One copy: the event without the cut.
		t.out = append(append(t.out[:0], ev[:start+a]...), ev[start+b:]...)
		return t.out
	}
	return t.observeData(ev, start, end)
}

// AppendEvent is ObserveEvent appending the event the client should see
// to dst: a steady chunk is copied once, straight to where it goes. The
// copy is never longer than ev (ids cut out, a chunk read in full
// rebuilt without whitespace), and ev is read before it is written: dst
// may be the bytes just before ev in the relay's buffer.
func (t *Tracker) AppendEvent(dst, ev []byte) []byte {
	if string(ev) == doneEvent {
		t.Done = true
		return append(dst, ev...)
	}
	// An event as engines write it, "data: <chunk>\n\n", is matched
	// against the layout whole: the layout and the holes hold no line
	// break, so the chunk is the event's data line without searching.
	tried := -1 // the end of the data matched whole, if it was
	if n := len(ev); n > len(dataSpace)+2 && string(ev[:len(dataSpace)]) == dataSpace && ev[n-1] == '\n' && ev[n-2] == '\n' {
		if a, b, _, ok := t.matchFast(ev[len(dataSpace):n-2], false); ok {
			if a < 0 {
				return append(dst, ev...)
			}
			a, b = a+len(dataSpace), b+len(dataSpace)
			return append(append(dst, ev[:a]...), ev[b:]...)
		}
		tried = n - 2
	}
	start, end, ok := t.eventData(ev)
	if !ok {
		return append(dst, ev...)
	}
	if start != len(dataSpace) || end != tried {
		if a, b, _, ok := t.matchFast(ev[start:end], false); ok {
			if a < 0 {
				return append(dst, ev...)
			}
			return append(append(dst, ev[:start+a]...), ev[start+b:]...)
		}
	}
	return append(dst, t.observeData(ev, start, end)...)
}

// AppendNext is AppendEvent for the event at the start of buf, which the
// caller has not delimited: an event as engines write it, "data: <chunk>"
// and a blank line, whose chunk matches a layout whole (or [DONE]), is
// found by the match itself, so the relay does not scan a steady chunk
// for its end before the tracker reads it. It appends the event the
// client should see to dst and returns the event's length n; n = 0: buf
// does not start with such an event, or not with all of it (nothing was
// changed: the caller delimits the event and calls AppendEvent).
//
// What is appended to dst is never longer than the event, and is
// appended after the event was read: dst may be buf's own bytes before
// the event (the relay writes the client's copy over what it read).
func (t *Tracker) AppendNext(dst, buf []byte) ([]byte, int) {
	if len(buf) <= len(dataSpace)+2 || string(buf[:len(dataSpace)]) != dataSpace {
		return dst, 0
	}
	if buf[len(dataSpace)] == '[' && len(buf) >= len(doneEvent) && string(buf[:len(doneEvent)]) == doneEvent {
		t.Done = true
		return append(dst, buf[:len(doneEvent)]...), len(doneEvent)
	}
	a, b, end, ok := t.matchFast(buf[len(dataSpace):], true)
	if !ok {
		return dst, 0
	}
	n := len(dataSpace) + end + 2
	if a < 0 {
		return append(dst, buf[:n]...), n
	}
	a, b = a+len(dataSpace), b+len(dataSpace)
	return append(append(dst, buf[:a]...), buf[b:n]...), n
}

// eventData finds the payload of ev's data line, ev[start:end]; ok false:
// the event has none, or it is [DONE] (noted).
func (t *Tracker) eventData(ev []byte) (start, end int, ok bool) {
	i := bytes.Index(ev, dataPrefix)
	if i < 0 || (i > 0 && ev[i-1] != '\n' && ev[i-1] != '\r') {
		return 0, 0, false
	}
	start = i + len(dataPrefix)
	if start < len(ev) && ev[start] == ' ' {
		start++
	}
	end = lineEnd(ev, start)
	if bytes.Equal(ev[start:end], doneData) {
		t.Done = true
		return 0, 0, false
	}
	return start, end, true
}

// observeData reads the payload ev[start:end] in full (the fast path
// matched it to no layout) and returns the event the client should see.
func (t *Tracker) observeData(ev []byte, start, end int) []byte {
	data := ev[start:end]
	kept := t.observeFull(data)
	if len(kept) == len(data) { // nothing stripped
		return ev
	}
	// The rewritten payload lives in t.out; the event is rebuilt after it.
	n := len(t.out)
	t.out = append(t.out, ev[:start]...)
	t.out = append(t.out, kept...)
	t.out = append(t.out, ev[end:]...)
	return t.out[n:]
}

// lineEnd is the offset of the end of the line that starts at i: its
// '\n' or '\r', or the end of b.
func lineEnd(b []byte, i int) int {
	end := len(b)
	if j := bytes.IndexByte(b[i:], '\n'); j >= 0 {
		end = i + j
	}
	if j := bytes.IndexByte(b[i:end], '\r'); j >= 0 {
		end = i + j
	}
	return end
}

// Observe reads one chunk's JSON payload and returns the payload the
// client should see: data itself, or a copy without the id fields when
// t.Strip and there were any. A chunk that cannot be read poisons the
// stream and is returned unchanged.
func (t *Tracker) Observe(data []byte) []byte {
	if out, ok := t.observeFast(data); ok {
		return out
	}
	return t.observeFull(data)
}

// observeFull is Observe reading the chunk in full (the fast path found
// no layout it matches).
func (t *Tracker) observeFull(data []byte) []byte {
	t.begun = true
	t.out = t.out[:0]
	t.chunkIDs, t.chunkTxt = false, false
	if t.lay == nil {
		t.lay = t.Pool.take() // new without a pool: once in the tracker's life
	}
	t.lay.shape = chunkShape{}
	s := jsonx.Scanner{B: data, MaxDepth: maxDepth, Lenient: true}
	s.SkipWS()
	if s.I >= len(data) || data[s.I] != '{' {
		t.poison(PoisonUnparseable)
		return data
	}
	t.out = append(t.out, '{')
	members := 0
	stripped := false
	err := s.Object(func(ks, ke int, esc bool) error {
		key := data[ks:ke]
		vs := s.I
		switch {
		case jsonx.Equal(key, esc, "choices"):
			t.sep(&members)
			t.out = append(t.out, data[ks-1:vs]...)
			return t.choices(&s, &stripped)
		case jsonx.Equal(key, esc, "prompt_token_ids"):
			if err := skipIDs(&s); err != nil {
				return err
			}
			t.prompt(data[vs:s.I], vs)
			if t.Strip {
				stripped = true
				t.lay.shape.stripped(ks-1, s.I)
				return nil
			}
		case jsonx.Equal(key, esc, "sglext"):
			if err := t.sglext(&s); err != nil {
				return err
			}
			if t.Strip {
				stripped = true
				t.lay.shape.stripped(ks-1, s.I)
				return nil
			}
		default:
			if err := s.Value(); err != nil {
				return err
			}
			t.remember(key, esc, data, vs, s.I)
		}
		t.sep(&members)
		t.out = append(t.out, data[ks-1:s.I]...)
		return nil
	})
	if err == nil {
		err = s.End()
	}
	if err != nil {
		t.poison(PoisonUnparseable)
		return data
	}
	if t.chunkTxt {
		t.TextChunks++
		if t.chunkIDs {
			t.IDChunks++
		}
	}
	if !stripped {
		t.learn(data, data)
		return data
	}
	t.out = append(t.out, '}')
	t.learn(data, t.out)
	return t.out
}

func (t *Tracker) sep(members *int) {
	if *members > 0 {
		t.out = append(t.out, ',')
	}
	*members++
}

func (t *Tracker) poison(p Poison) {
	if t.Poisoned == PoisonNone {
		t.Poisoned = p
	}
}

// remember keeps the stream's first id, created and model, the value
// data[vs:end] of a top-level member.
func (t *Tracker) remember(key []byte, esc bool, data []byte, vs, end int) {
	raw := data[vs:end]
	str := data[vs] == '"'
	switch {
	case jsonx.Equal(key, esc, "id"):
		t.lay.shape.saw(holeID, vs, end, str)
		if len(t.ID) == 0 {
			t.ID = append(t.ID, raw...)
		}
	case jsonx.Equal(key, esc, "created"):
		t.lay.shape.saw(holeCreated, vs, end, str)
		if len(t.Created) == 0 {
			t.Created = append(t.Created, raw...)
		}
	case jsonx.Equal(key, esc, "model"):
		t.lay.shape.saw(holeModel, vs, end, str)
		if len(t.Model) == 0 {
			t.Model = append(t.Model, raw...)
		}
	}
	t.noteKept()
}

// noteKept sets kept once ID, Created and Model all hold their value.
func (t *Tracker) noteKept() {
	t.kept = len(t.ID) > 0 && len(t.Created) > 0 && len(t.Model) > 0
}

// prompt records the prompt's ids (the first time an engine gives them),
// as written: PromptIDs validates them when they are needed. at is their
// offset in the chunk.
func (t *Tracker) prompt(raw []byte, at int) {
	if len(raw) < 2 || raw[0] != '[' || raw[len(raw)-1] != ']' {
		return // null, or not ids at all
	}
	t.lay.shape.saw(holePrompt, at, at+len(raw), false)
	t.keepPrompt(raw)
}

// keepPrompt keeps the stream's first prompt id array, raw (the fast path
// found it an array; it does not note the chunk's shape, a cache line a
// stream's first chunk need not touch).
func (t *Tracker) keepPrompt(raw []byte) {
	if !t.HasPrompt {
		t.lay.prompt, t.HasPrompt = append(t.lay.prompt[:0], raw...), true
	}
}

// skipIDs moves s past the id array at s.I. An array of numbers holds no
// ']' before its end, so the end is found without reading every number
// (a long prompt's ids are thousands of them); what lies between is
// validated when the ids are read (AppendTokenIDs). Anything else is
// skipped as any JSON value.
func skipIDs(s *jsonx.Scanner) error {
	if s.I < len(s.B) && s.B[s.I] == '[' {
		if j := bytes.IndexByte(s.B[s.I:], ']'); j > 0 {
			s.I += j + 1
			return nil
		}
	}
	return s.Value()
}

// output records a chunk's output ids, at offset at of the chunk.
func (t *Tracker) output(raw []byte, at int) {
	t.lay.shape.saw(holeOutIDs, at, at+len(raw), false)
	n := len(t.OutIDs)
	ids, err := openai.AppendTokenIDs(t.OutIDs, raw)
	if err != nil {
		t.OutIDs = ids[:n]
		return
	}
	t.OutIDs = ids
	t.chunkIDs = true
}

// choices copies the choices array at s.I to t.out (without id fields when
// stripping) and reads the first choice.
func (t *Tracker) choices(s *jsonx.Scanner, stripped *bool) error {
	if s.I >= len(s.B) || s.B[s.I] != '[' {
		if err := s.Value(); err != nil {
			return err
		}
		t.poison(PoisonUnparseable)
		return nil
	}
	t.out = append(t.out, '[')
	n := 0
	err := s.Array(func() error {
		if n > 0 {
			t.out = append(t.out, ',')
			t.poison(PoisonChoices)
		}
		n++
		if s.I >= len(s.B) || s.B[s.I] != '{' {
			vs := s.I
			if err := s.Value(); err != nil {
				return err
			}
			t.out = append(t.out, s.B[vs:s.I]...)
			t.poison(PoisonUnparseable)
			return nil
		}
		return t.choice(s, stripped)
	})
	t.out = append(t.out, ']')
	return err
}

// choice copies one choice object and reads it.
func (t *Tracker) choice(s *jsonx.Scanner, stripped *bool) error {
	b := s.B
	t.out = append(t.out, '{')
	members := 0
	err := s.Object(func(ks, ke int, esc bool) error {
		key := b[ks:ke]
		vs := s.I
		var err error
		switch {
		case jsonx.Equal(key, esc, "token_ids"):
			if err = s.Value(); err == nil {
				t.output(b[vs:s.I], vs)
				if t.Strip {
					*stripped = true
					t.lay.shape.stripped(ks-1, s.I)
					return nil
				}
			}
		case jsonx.Equal(key, esc, "prompt_token_ids"):
			if err = skipIDs(s); err == nil {
				t.prompt(b[vs:s.I], vs)
				if t.Strip {
					*stripped = true
					t.lay.shape.stripped(ks-1, s.I)
					return nil
				}
			}
		case jsonx.Equal(key, esc, "index"):
			if err = s.Value(); err == nil && string(b[vs:s.I]) != "0" {
				t.poison(PoisonChoices)
			}
		case jsonx.Equal(key, esc, "text"):
			err = t.text(s)
		case jsonx.Equal(key, esc, "delta"), jsonx.Equal(key, esc, "message"):
			err = t.delta(s)
		case jsonx.Equal(key, esc, "finish_reason"):
			if err = s.Value(); err == nil {
				t.lay.shape.saw(holeFinish, vs, s.I, b[vs] == '"')
				if b[vs] != 'n' {
					t.Finished = true
				}
			}
		default:
			err = s.Value()
		}
		if err != nil {
			return err
		}
		t.sep(&members)
		t.out = append(t.out, b[ks-1:s.I]...)
		return nil
	})
	t.out = append(t.out, '}')
	return err
}

// text appends the string value at s.I (null: nothing) to t.Text.
func (t *Tracker) text(s *jsonx.Scanner) error {
	if s.I < len(s.B) && s.B[s.I] == 'n' {
		t.lay.shape.nullTexts++
		return s.Literal("null")
	}
	if s.I >= len(s.B) || s.B[s.I] != '"' {
		t.poison(PoisonUnparseable)
		return s.Value()
	}
	vs := s.I
	st, en, esc, err := s.String()
	if err != nil {
		return err
	}
	t.lay.shape.saw(holeText, vs, s.I, true)
	if en > st {
		t.chunkTxt = true
		if esc {
			t.Text = jsonx.AppendUnescaped(t.Text, s.B[st:en])
		} else {
			t.Text = append(t.Text, s.B[st:en]...)
		}
	}
	return nil
}

// delta reads a chat delta: its content, and whether it carries tool
// calls, a function call or reasoning.
func (t *Tracker) delta(s *jsonx.Scanner) error {
	if s.I >= len(s.B) || s.B[s.I] != '{' {
		return s.Value()
	}
	b := s.B
	return s.Object(func(ks, ke int, esc bool) error {
		key := b[ks:ke]
		vs := s.I
		switch {
		case jsonx.Equal(key, esc, "content"):
			return t.text(s)
		case jsonx.Equal(key, esc, "tool_calls"), jsonx.Equal(key, esc, "function_call"),
			jsonx.Equal(key, esc, "reasoning_content"), jsonx.Equal(key, esc, "reasoning"):
			if err := s.Value(); err != nil {
				return err
			}
			switch v := b[vs:s.I]; {
			case string(v) == "null", string(v) == "[]", string(v) == `""`:
			default:
				t.ToolsOrReasoning, t.lay.shape.tools = true, true
			}
			return nil
		}
		return s.Value()
	})
}

// sglext reads SGLang's id object: prompt_token_ids, and the first
// choice's list of completion_token_ids (or a flat token_ids).
func (t *Tracker) sglext(s *jsonx.Scanner) error {
	if s.I >= len(s.B) || s.B[s.I] != '{' {
		return s.Value()
	}
	b := s.B
	return s.Object(func(ks, ke int, esc bool) error {
		key := b[ks:ke]
		vs := s.I
		switch {
		case jsonx.Equal(key, esc, "prompt_token_ids"):
			if err := skipIDs(s); err != nil {
				return err
			}
			t.prompt(b[vs:s.I], vs)
			return nil
		case jsonx.Equal(key, esc, "token_ids"):
			if err := s.Value(); err != nil {
				return err
			}
			t.output(b[vs:s.I], vs)
			return nil
		case jsonx.Equal(key, esc, "completion_token_ids"):
			if s.I >= len(b) || b[s.I] != '[' {
				return s.Value()
			}
			first := true
			return s.Array(func() error {
				es := s.I
				if err := s.Value(); err != nil {
					return err
				}
				if first {
					first = false
					t.output(b[es:s.I], es)
				}
				return nil
			})
		}
		return s.Value()
	})
}
