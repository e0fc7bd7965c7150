package continuation

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"sync"
	"unsafe"

	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/openai"
)

// The fast path. An engine writes the chunks of its streams in a few
// layouts: the first chunk (role, prompt ids), the steady chunks, the last
// (finish reason); between streams only the stream's id and time change,
// within one only the text, its token ids and the finish reason. Reading
// each chunk in full costs about a microsecond; relaying it costs less. So
// the tracker learns layouts from chunks it read in full — their bytes,
// with every value a chunk's read takes in as a hole (text, output ids,
// prompt ids, finish reason, the stream's id, created and model) — and a
// chunk whose bytes equal a layout's outside the holes, with values of the
// holes' kinds in them, is the same JSON document but for those values:
// reading it in full would find exactly what the holes hold, so only they
// are read. Any other chunk is read in full (and its layout learnt when it
// has one). A layout keeps only the bytes between its holes and the
// stream's id, time and model, so a first chunk's long prompt costs it
// nothing. Layouts outlive the stream (Reset keeps them, or gives them
// back to the tracker's LayoutPool, which lends them to the next stream
// to start), so a relay's tracker reads even the first and last chunk of
// its next stream from the same engine through them: the first chunk of a stream moves the other
// layouts (and its own, unless it holds the prompt's ids, which no other
// chunk of the stream has) to the stream's id, time and model, so the
// stream's other chunks compare those as fixed bytes ("rigid" match);
// values as long as the old ones (an engine's most often are) are
// written over them in place.
// A finish reason that is null in the chunk a layout was learnt from is
// fixed bytes too. Most of a stream's chunks are steady ones (a text,
// then its ids, cut from the client's copy; the last chunk a finish
// reason between them): matched rigidly, matchSteady reads those in a
// straight line, without the general walk over the holes.
// FuzzFastAgrees holds the paths to the same result.

// chunkShape is what the full read of one chunk found: how many values of
// each hole kind, and where the last one lay.
type chunkShape struct {
	count     [numHoleKinds]int
	span      [numHoleKinds][2]int
	str       [numHoleKinds]bool // the value is a JSON string (else a number or literal)
	nullTexts int                // null text values
	strips    int                // members stripped from the client's copy
	strip     [2]int             // the stripped member's span: key to value end
	tools     bool
}

func (c *chunkShape) stripped(start, end int) {
	c.strips++
	c.strip = [2]int{start, end}
}

// saw records a value of kind k at data[start:end].
func (c *chunkShape) saw(k holeKind, start, end int, str bool) {
	c.count[k]++
	c.span[k] = [2]int{start, end}
	c.str[k] = str
}

// holeKind is what a hole holds and what reading it does.
type holeKind uint8

const (
	holeText    holeKind = iota // a text string: appended to Text
	holeOutIDs                  // an output id array: appended to OutIDs
	holePrompt                  // a prompt id array: kept once (prompt)
	holeFinish                  // a finish reason, null or a string (Finished)
	holeID                      // the stream's id, created and model: kept once
	holeCreated                 // (remember)
	holeModel
	numHoleKinds
)

// maxTemplates is how many layouts a tracker keeps (first, steady and last
// chunk, and one spare); maxTemplateBytes bounds one's bytes (a pooled
// tracker keeps them), the values that vary within a stream not counted.
const (
	maxTemplates     = 4
	maxTemplateBytes = 4 << 10
)

// template is a chunk layout: b, a chunk read in full without the values
// that vary within a stream, and its holes in order of offset (in b: the
// stream's id, time and model as the stream has them, the others empty).
//
// What a stream's steady chunks read (matchSteady: b, the flags, the
// steady holes' offsets, the cut, the tail's word) is the first 64 bytes,
// and a template is 256, so that under many streams a steady chunk's
// layout costs one cold cache line, not the four its fields spread over;
// the general walk's holes come after (TestTemplateLines holds the sizes).
type template struct {
	b     []byte
	ok    bool
	strip bool // learnt with Tracker.Strip set
	// steady: the layout of a steady chunk or the last — its only holes
	// that vary within a stream are a text, a finish reason or none, and
	// an output id array, in that order, the ids' member cut — matched
	// rigidly by matchSteady; finish: the finish reason is there.
	steady, finish bool
	// cut: the member of hole cutHole is cut from the client's copy;
	// preCut and postCut are the bytes cut before and after the hole's
	// value (the member's key, a comma, an enclosing object's bytes).
	cut bool
	// tailLen is how many bytes of tailWord a steady layout's tail after
	// its ids and the blank line that ends its event are (0: more than a
	// word's 8), the first in the lowest byte: matchSteady compares them
	// at once in a relay's buffer (steadyHoles).
	tailLen         uint8
	preCut, postCut int32
	// A steady layout's text, finish reason and output ids in b, as
	// [start, end) pairs (steadyHoles; b is at most maxTemplateBytes).
	textAt, textEnd, finishAt, finishEnd, idsAt, idsEnd uint16
	tailWord                                            uint64
	// at is the index in holes of the hole of each kind (-1: none).
	at [numHoleKinds]int8

	// vary lists the holes whose value changes within a stream (all but
	// the stream's id, time and model), by index in holes.
	vary    [numHoleKinds]int8
	nv, n   int8 // holes in vary, and in use
	cutHole int8
	holes   [numHoleKinds]hole // to 256 bytes: the next template starts a cache line
}

// steadyHoles notes where a steady layout's holes lie in b, for
// matchSteady; learn and stamp call it when they place them.
func (tm *template) steadyHoles() {
	if !tm.steady {
		return
	}
	th, ih := &tm.holes[tm.vary[0]], &tm.holes[tm.vary[tm.nv-1]]
	tm.textAt, tm.textEnd = uint16(th.start), uint16(th.end)
	tm.idsAt, tm.idsEnd = uint16(ih.start), uint16(ih.end)
	if tm.finish {
		fh := &tm.holes[tm.vary[1]]
		tm.finishAt, tm.finishEnd = uint16(fh.start), uint16(fh.end)
	}
	tm.tailLen, tm.tailWord = 0, 0
	if tail := tm.b[ih.end:]; len(tail)+len(eventEnd) <= 8 {
		var w [8]byte
		copy(w[copy(w[:], tail):], eventEnd)
		tm.tailLen, tm.tailWord = uint8(len(tail)+len(eventEnd)), binary.LittleEndian.Uint64(w[:])
	}
}

// eventEnd is the blank line after an event's data line, as engines end
// their events.
const eventEnd = "\n\n"

// layouts are the chunk layouts a tracker learnt, kept across streams,
// and the scratch state of its reads.
type layouts struct {
	tmpls [maxTemplates]template
	// hit is the one matched last, victim the next one a new layout
	// replaces; follow[i] is the template that matched after template i
	// the last time another did (i itself: none yet). One cache line:
	// a stream's first chunk reads it to find its layout.
	hit, victim int
	follow      [maxTemplates]int8
	// match is where the chunk being matched has its holes; stampBuf is
	// the bytes of the next layout learnt or stamped.
	match    holeMatch
	stampBuf []byte
	// shape is what the full read of the chunk being read found.
	shape chunkShape
	// plan is where a stream's first chunk, matched through layout
	// planFor, puts its id, time and model in the other layouts (stampAll);
	// planned: it is for the layouts as they are (learn, and a stamp that
	// moves holes or drops a layout, clear it).
	plan         [(maxTemplates - 1) * 3]stampHole
	lens         [3]stampLen
	nplan, nlens int8
	planFor      int8
	planned      bool
	stamped      int8 // how many layouts the plan moves
	// prompt is the stream's prompt ids as the engine wrote them (a JSON
	// array, copied: a long prompt's ids are most of a stream's first
	// chunk, and only a continuation needs them as numbers), here so
	// that a lent set's copy lands on bytes the last stream just wrote.
	prompt []byte
}

// LayoutPool lends trackers their layouts one stream at a time: a
// Tracker with Pool set takes a set at its stream's first chunk and gives
// it back at Reset. Under many concurrent streams a Tracker's own set
// (and its prompt buffer) is cold by the time its next stream's first
// chunk comes, while the set the last stream to end on this processor
// gave back is not (sync.Pool hands it back there first). The sets are
// those of all the pool's trackers, so a stream may meet another
// engine's layouts first: it is read in full and its layout learnt, as
// with a Tracker's own set after another engine's stream. Safe for
// concurrent use; the zero value is ready.
type LayoutPool struct {
	sets sync.Pool
}

// take lends a set (a new one when p is nil or has none).
func (p *LayoutPool) take() *layouts {
	if p != nil {
		if l, _ := p.sets.Get().(*layouts); l != nil {
			return l
		}
	}
	return new(layouts)
}

// give takes a set back.
func (p *LayoutPool) give(l *layouts) {
	l.prompt = l.prompt[:0]
	p.sets.Put(l)
}

// next is the layout a stream's next chunk most likely has: the one
// matched last, unless it holds the prompt's ids (a stream's first
// chunk), then the one that followed it.
func (l *layouts) next() int {
	if tm := &l.tmpls[l.hit]; tm.ok && tm.at[holePrompt] >= 0 {
		return int(l.follow[l.hit])
	}
	return l.hit
}

type hole struct {
	start, end int
	kind       holeKind
	str        bool // holeID..holeModel: a string (else a number)
}

// learn makes the chunk data, read in full into out (the client's copy),
// a template when its layout can be matched: at most one value of each
// hole kind, no null text, no tool calls or poison, and a client's copy
// that is data exactly, or data without one member that holds one id
// array and no other hole.
func (t *Tracker) learn(data, out []byte) {
	sh := &t.lay.shape
	if t.noFast || t.Poisoned != PoisonNone || sh.tools || sh.nullTexts != 0 || sh.strips > 1 {
		return
	}
	var nt template
	nt.strip = t.Strip
	for k := range numHoleKinds {
		switch sh.count[k] {
		case 0:
			continue
		case 1:
		default:
			return
		}
		h := hole{start: sh.span[k][0], end: sh.span[k][1], kind: k, str: sh.str[k]}
		if k == holeFinish && string(data[h.start:h.end]) == "null" {
			// Not a hole: the steady chunks' null is compared with the
			// bytes around it, and a chunk that finishes (most often
			// another layout anyway: vLLM adds stop_reason) is read in
			// full once and its layout learnt.
			continue
		}
		if h.start >= h.end {
			return
		}
		// In order of offset; holes never overlap.
		i := nt.n
		for i > 0 && nt.holes[i-1].start > h.start {
			nt.holes[i] = nt.holes[i-1]
			i--
		}
		nt.holes[i] = h
		nt.n++
	}
	for i := 1; i < int(nt.n); i++ {
		if nt.holes[i-1].end > nt.holes[i].start {
			return
		}
	}
	for k := range nt.at {
		nt.at[k] = -1
	}
	for i, h := range nt.holes[:nt.n] {
		nt.at[h.kind] = int8(i)
		if h.kind < holeID {
			nt.vary[nt.nv] = int8(i)
			nt.nv++
		}
	}
	if sh.strips == 1 {
		a, b := sh.strip[0], sh.strip[1]
		switch {
		case a > 0 && data[a-1] == ',':
			a--
		case b < len(data) && data[b] == ',':
			b++
		default:
			return
		}
		// The cut holds exactly one hole, an id array, and overlaps no other.
		nt.cutHole = -1
		for i, h := range nt.holes[:nt.n] {
			switch {
			case h.end <= a || h.start >= b:
			case h.start >= a && h.end <= b && nt.cutHole < 0 && (h.kind == holeOutIDs || h.kind == holePrompt):
				nt.cutHole = int8(i)
			default:
				return
			}
		}
		if nt.cutHole < 0 {
			return
		}
		if len(out) != len(data)-(b-a) || !bytes.Equal(out[:a], data[:a]) || !bytes.Equal(out[a:], data[b:]) {
			return
		}
		h := nt.holes[nt.cutHole]
		nt.cut, nt.preCut, nt.postCut = true, int32(h.start-a), int32(b-h.end)
	} else if len(out) != len(data) {
		return
	}
	if bytes.IndexByte(data, '\n') >= 0 || bytes.IndexByte(data, '\r') >= 0 {
		return // a layout must be one line: AppendEvent matches whole events
	}
	nt.steady = nt.cut && (nt.nv == 2 || nt.nv == 3 && nt.holes[nt.vary[1]].kind == holeFinish) &&
		nt.holes[nt.vary[0]].kind == holeText && nt.holes[nt.vary[nt.nv-1]].kind == holeOutIDs &&
		nt.vary[nt.nv-1] == nt.cutHole
	nt.finish = nt.steady && nt.nv == 3
	// The layout's bytes: the chunk's without the values that vary
	// within a stream (a long prompt's ids are most of a first chunk).
	size := len(data)
	for _, h := range nt.holes[:nt.n] {
		if h.kind < holeID {
			size -= h.end - h.start
		}
	}
	if size > maxTemplateBytes {
		return
	}
	b, prev := t.lay.stampBuf[:0], 0
	for i := range nt.holes[:nt.n] {
		h := &nt.holes[i]
		b = append(b, data[prev:h.start]...)
		start := len(b)
		if h.kind >= holeID {
			b = append(b, data[h.start:h.end]...)
		}
		prev, h.start, h.end = h.end, start, len(b)
	}
	b = append(b, data[prev:]...)
	// The slot: an empty one, else the next in turn.
	slot := -1
	for i := range t.lay.tmpls {
		if !t.lay.tmpls[i].ok {
			slot = i
			break
		}
	}
	if slot < 0 {
		slot = t.lay.victim
		t.lay.victim = (t.lay.victim + 1) % maxTemplates
	}
	t.lay.stampBuf, nt.b, nt.ok, t.lay.planned = t.lay.tmpls[slot].b[:0], b, true, false
	nt.steadyHoles()
	t.lay.tmpls[slot] = nt
	t.lay.follow[slot] = int8(slot)
	t.steady = nil // the layout tried first is another now
	if t.lay.hit != slot {
		t.lay.follow[t.lay.hit] = int8(slot)
	}
	t.lay.hit = slot
}

// observeFast reads chunk data through a template; ok false: data matches
// none (nothing was changed).
func (t *Tracker) observeFast(data []byte) (out []byte, ok bool) {
	a, b, _, ok := t.matchFast(data, false)
	if !ok || a < 0 {
		return data, ok
	}
	t.out = append(append(t.out[:0], data[:a]...), data[b:]...)
	return t.out, true
}

// matchFast reads chunk data through the first template it matches:
// rigidly (the stream's id, time and model as the template holds them)
// and then, for a chunk of another stream, with every hole read. A
// stream's first chunk skips the rigid try: it is most often of another
// stream than the one the layouts last held. ok false: data matches none
// (nothing was changed); else data[a:b] is what the client must not see
// (a < 0: nothing). open: data is the chunk and what follows it in the
// relay's buffer, and the chunk must be followed by the blank line that
// ends its event; end is where the chunk ends (closed: len(data)).
func (t *Tracker) matchFast(data []byte, open bool) (a, b, end int, ok bool) {
	if t.lay == nil {
		if t.Pool == nil {
			return -1, -1, -1, false
		}
		t.lay = t.Pool.take()
	}
	if t.begun {
		// The layout matched last, or the one that followed it when it
		// holds the prompt's ids: they come once, in a stream's first
		// chunk, so the next chunk has another layout (most often the
		// steady one) and the first one's general walk would fail on it.
		// t.steady, when set, is that layout, matched last (the same
		// template, learn has not replaced it: it checks again).
		if tm := t.steady; tm != nil && tm.steady && tm.ok && tm.strip == t.Strip {
			if a, b, end, ok = t.matchSteady(tm, data, open); ok {
				return a, b, end, true
			}
		}
		tried := t.lay.next() // a layout matchSteady tried (rigidly: not again)
		if tm := &t.lay.tmpls[tried]; tm.steady && tm.ok && tm.strip == t.Strip {
			if tm != t.steady {
				if a, b, end, ok = t.matchSteady(tm, data, open); ok {
					t.lay.hit, t.steady = tried, tm
					return a, b, end, true
				}
			}
		} else {
			tried = -1
		}
		t.steady = nil
		if a, b, end, ok = t.matchAny(data, true, open, tried); ok {
			return a, b, end, true
		}
	}
	if a, b, end, ok = t.matchAny(data, false, open, -1); ok {
		t.begun = true
	}
	return a, b, end, ok
}

// matchAny tries the templates in the order a stream's chunks follow
// each other: the one matched last, the one that followed it the last
// time another did (steady chunks follow the first, the last follows
// them, the next stream's first follows the last; that one first for a
// match that is not rigid and after a layout with the prompt's ids,
// layouts.next), then the rest. skip is a layout not to
// try (-1: none): matchSteady tried it already in the same way.
func (t *Tracker) matchAny(data []byte, rigid, open bool, skip int) (a, b, end int, ok bool) {
	hit, next := t.lay.hit, int(t.lay.follow[t.lay.hit])
	first, second := t.lay.next(), hit
	if first == hit {
		second = next
	}
	if !rigid {
		// Most often a stream's first chunk, after the previous stream's
		// last: the layout that followed that one is tried first.
		first, second = next, hit
	}
	if first != skip {
		if a, b, end, ok = t.matchTemplate(first, data, rigid, open); ok {
			t.lay.hit = first
			return a, b, end, true
		}
	}
	if second != first && second != skip {
		if a, b, end, ok = t.matchTemplate(second, data, rigid, open); ok {
			t.lay.hit = second
			return a, b, end, true
		}
	}
	for i := range t.lay.tmpls {
		if i == hit || i == next || i == skip {
			continue
		}
		if a, b, end, ok = t.matchTemplate(i, data, rigid, open); ok {
			t.lay.follow[t.lay.hit] = int8(i)
			t.lay.hit = i
			return a, b, end, true
		}
	}
	return -1, -1, -1, false
}

// matchTemplate reads data through template i: first every hole is found
// and checked (the output ids read on the way), then, all of them
// matching, the rest is read. rigid: the holes that do not vary within a
// stream are matched as the template's fixed bytes. open: see matchFast.
func (t *Tracker) matchTemplate(i int, data []byte, rigid, open bool) (a, b, end int, ok bool) {
	a, b = -1, -1
	tm := &t.lay.tmpls[i]
	if !tm.ok || tm.strip != t.Strip {
		return a, b, -1, false
	}
	if rigid && tm.steady {
		return t.matchSteady(tm, data, open)
	}
	t.tries++
	m := &t.lay.match // not zeroed: matchHoles sets what is read below
	nOut := len(t.OutIDs)
	end = t.matchHoles(tm, data, rigid, m)
	if open {
		// The layout and its holes hold no line break, so a blank line
		// right after the chunk ends its event there, as openai.NextEvent
		// would find it.
		ok = end >= 0 && len(data)-end >= 2 && data[end] == '\n' && data[end+1] == '\n'
	} else {
		ok = end == len(data)
	}
	if !ok {
		t.OutIDs = t.OutIDs[:nOut]
		return a, b, -1, false
	}
	// The chunk matches: what follows is what the full read would do.
	if k := tm.at[holeText]; k >= 0 && m.txtEnd > m.txtStart {
		if m.txtEsc {
			t.Text = jsonx.AppendUnescaped(t.Text, data[m.txtStart:m.txtEnd])
		} else {
			t.Text = append(t.Text, data[m.txtStart:m.txtEnd]...)
		}
		t.TextChunks++
		if tm.at[holeOutIDs] >= 0 {
			t.IDChunks++
		}
	}
	if k := tm.at[holePrompt]; k >= 0 {
		t.keepPrompt(data[m.spans[k][0]:m.spans[k][1]])
	}
	if k := tm.at[holeFinish]; k >= 0 && data[m.spans[k][0]] != 'n' {
		t.Finished = true
	}
	if !t.kept {
		t.keepStream(tm, data, m, rigid)
	}
	t.fastChunks++
	if tm.cut {
		// Element by element: one 16-byte load of the span just written
		// as two words would wait for the stores to retire.
		a, b = m.spans[tm.cutHole][0]-int(tm.preCut), m.spans[tm.cutHole][1]+int(tm.postCut)
	}
	if m.rebase {
		// The layouts take the chunk's id, time and model, so that the
		// stream's next chunks match them rigidly.
		t.rebases++
		if tm.at[holePrompt] >= 0 && t.stampAll(i, data, m) {
			return a, b, end, true
		}
		var vals streamValues
		for hi, h := range tm.holes[:tm.n] {
			if h.kind >= holeID {
				vals.v[h.kind], vals.str[h.kind] = data[m.spans[hi][0]:m.spans[hi][1]], h.str
			}
		}
		if tm.at[holePrompt] < 0 {
			// A layout with the prompt's ids is a stream's first chunk's:
			// no other chunk of this stream matches it, and the next
			// stream's first chunk reads its own id, time and model
			// through it anyway, so it is not moved to this stream's.
			t.stamp(tm, &vals)
			if !tm.ok {
				return a, b, end, true
			}
		}
		for j := range t.lay.tmpls {
			if j != i && t.lay.tmpls[j].ok && t.stamp(&t.lay.tmpls[j], &vals) {
				t.restamps++
			}
		}
	}
	return a, b, end, true
}

// matchSteady is matchTemplate for a steady layout (template.steady)
// matched rigidly: most of a stream's chunks. The same reads in a
// straight line — the fixed bytes up to the text, the text, (the fixed
// bytes up to the finish reason, the finish reason,) the fixed bytes up
// to the output ids, the ids, the tail — and the same effects; ok
// false: data does not match (nothing was changed). What a steady chunk
// rarely has (an escaped text, the finish reason's layout) is read out
// of line (textSpan, steadyFinish), so that the common straight line
// keeps its values in registers.
func (t *Tracker) matchSteady(tm *template, data []byte, open bool) (a, b, end int, ok bool) {
	t.tries++
	pos := int(tm.textAt)
	if len(data) <= pos || !sameFixed(data[:pos], tm.b[:pos]) || data[pos] != '"' {
		return -1, -1, -1, false
	}
	txtStart, txtEnd, txtEsc := pos+1, plainStringEnd(data, pos), false
	if txtEnd > 0 {
		pos = txtEnd + 1
	} else if txtStart, txtEnd, txtEsc, pos = textSpan(data, pos); pos < 0 {
		return -1, -1, -1, false
	}
	finished, prev := false, int(tm.textEnd)
	if tm.finish { // the last chunk's finish reason, between them
		if pos, finished = steadyFinish(tm, data, pos); pos < 0 {
			return -1, -1, -1, false
		}
		prev = int(tm.finishEnd)
	}
	mid := tm.b[prev:tm.idsAt]
	if len(data)-pos <= len(mid) || !sameFixed(data[pos:pos+len(mid)], mid) {
		return -1, -1, -1, false
	}
	pos += len(mid)
	idStart, nOut := pos, len(t.OutIDs)
	var ids []uint32
	if n := 0; len(data)-pos > 8 && data[pos] == '[' {
		// The steady chunk's one id, read in line (appendIDArray's first
		// try, without the call).
		w := binary.LittleEndian.Uint64(data[pos+1:])
		if n = oneID(w); n > 0 {
			ids, pos = append(t.OutIDs, idValue(w, n)), pos+n+2
		}
	}
	if ids == nil {
		if ids, pos, ok = appendIDArray(t.OutIDs, data, pos); !ok {
			t.OutIDs = ids[:nOut]
			return -1, -1, -1, false
		}
	}
	if k := int(tm.tailLen); open && k > 0 && len(data)-pos >= 8 {
		// The tail and the blank line after it, compared as one word.
		if (binary.LittleEndian.Uint64(data[pos:])^tm.tailWord)<<(64-8*k) != 0 {
			t.OutIDs = ids[:nOut]
			return -1, -1, -1, false
		}
		end = pos + k - len(eventEnd)
	} else if tail := tm.b[tm.idsEnd:]; len(data) < pos+len(tail) || string(data[pos:pos+len(tail)]) != string(tail) || !eventEnds(data, pos+len(tail), open) {
		t.OutIDs = ids[:nOut]
		return -1, -1, -1, false
	} else {
		end = pos + len(tail)
	}
	t.OutIDs = ids
	if txtEnd > txtStart {
		if txtEsc {
			t.Text = jsonx.AppendUnescaped(t.Text, data[txtStart:txtEnd])
		} else {
			t.Text = append(t.Text, data[txtStart:txtEnd]...)
		}
		t.TextChunks++
		t.IDChunks++
	}
	if finished {
		t.Finished = true
	}
	if !t.kept {
		t.keepStream(tm, data, nil, true)
	}
	t.fastChunks++
	return idStart - int(tm.preCut), pos + int(tm.postCut), end, true
}

// eventEnds reports whether a chunk that ends at data[end] ends where it
// must: open (data goes on into the relay's buffer), with the blank line
// that ends its event; else at the end of data.
func eventEnds(data []byte, end int, open bool) bool {
	if !open {
		return end == len(data)
	}
	return len(data)-end >= 2 && data[end] == '\n' && data[end+1] == '\n'
}

// textSpan reads the JSON string at data[pos] that plainStringEnd did
// not (escapes, non-ASCII): its content data[st:en], whether that needs
// unescaping, and the offset just past it (-1: not a string).
func textSpan(data []byte, pos int) (st, en int, esc bool, next int) {
	s := jsonx.Scanner{B: data, I: pos, Lenient: true}
	st, en, esc, err := s.String()
	if err != nil {
		return 0, 0, false, -1
	}
	return st, en, esc, s.I
}

// steadyFinish reads the fixed bytes from a finishing steady layout's
// text to its finish reason, and the finish reason at them: it returns
// the offset just past it (-1: data does not match) and whether it
// finishes the stream (a string; null does not).
func steadyFinish(tm *template, data []byte, pos int) (next int, finished bool) {
	mid := tm.b[tm.textEnd:tm.finishAt]
	if len(data)-pos <= len(mid) || string(data[pos:pos+len(mid)]) != string(mid) {
		return -1, false
	}
	if pos += len(mid); data[pos] == 'n' {
		if len(data)-pos < 4 || string(data[pos:pos+4]) != "null" {
			return -1, false
		}
		return pos + 4, false
	}
	if pos = stringEnd(data, pos); pos < 0 {
		return -1, false
	}
	return pos, true
}

// streamValues are a stream's id, time and model (by hole kind; nil:
// none) and whether each is a JSON string.
type streamValues struct {
	v   [numHoleKinds][]byte
	str [numHoleKinds]bool
}

// stamp puts vals into template tm's holes of the same kinds and JSON
// types: tm stays the same layout, with another stream's values in those
// holes. It reports whether any changed; a layout that outgrows
// maxTemplateBytes is dropped.
func (t *Tracker) stamp(tm *template, vals *streamValues) (changed bool) {
	if sameLengths(tm, vals) {
		// An engine's stream ids and times most often have one length:
		// the new values are written over the old ones, and the rest of
		// the layout (cold in a pooled relay's tracker) is not copied.
		for k := holeID; k < numHoleKinds; k++ {
			if hi := tm.at[k]; hi >= 0 {
				h := &tm.holes[hi]
				if v := vals.v[k]; v != nil && vals.str[k] == h.str && string(v) != string(tm.b[h.start:h.end]) {
					copy(tm.b[h.start:h.end], v)
					changed = true
					if tm.steady && h.start >= int(tm.idsEnd) {
						tm.steadyHoles() // the value is in the tail's word
					}
				}
			}
		}
		return changed
	}
	buf := t.lay.stampBuf[:0]
	holes := tm.holes
	prev := 0
	for hi, h := range tm.holes[:tm.n] {
		// Where h lands: after what buf holds and the bytes up to h that
		// are still to be copied.
		start := len(buf) + h.start - prev
		v := vals.v[h.kind]
		if h.kind < holeID || v == nil || vals.str[h.kind] != h.str {
			holes[hi].start, holes[hi].end = start, start+h.end-h.start
			continue
		}
		changed = changed || !bytes.Equal(v, tm.b[h.start:h.end])
		buf = append(append(buf, tm.b[prev:h.start]...), v...)
		holes[hi].start, holes[hi].end = start, start+len(v)
		prev = h.end
	}
	if !changed {
		return false
	}
	buf = append(buf, tm.b[prev:]...)
	t.lay.planned = false // the holes move, or the layout goes
	if len(buf) > maxTemplateBytes {
		tm.ok = false
		return true
	}
	tm.holes = holes
	t.lay.stampBuf, tm.b = tm.b[:0], buf
	tm.steadyHoles()
	return true
}

// sameLengths reports whether every value of vals that stamp would put
// into tm is as long as the one it replaces.
func sameLengths(tm *template, vals *streamValues) bool {
	for k := holeID; k < numHoleKinds; k++ {
		if hi := tm.at[k]; hi >= 0 {
			h := &tm.holes[hi]
			if v := vals.v[k]; v != nil && vals.str[k] == h.str && len(v) != h.end-h.start {
				return false
			}
		}
	}
	return true
}

// stampHole is a run of a stream's values a first chunk puts in another
// layout: tm.b[start:end] takes data from the chunk's hole from to its
// hole to (holes next to each other in both layouts, with the same bytes
// between them: one copy for the stream's id, time and model, which
// engines write together).
type stampHole struct {
	tmpl, from, to int8
	tail           bool // in a steady layout's tail word (steadyHoles again)
	start, end     uint16
}

// stampLen is a length every layout in the plan has for a value: the
// chunk's value at hole from must have it.
type stampLen struct {
	from int8
	n    uint16
}

// stampAll moves the layouts other than i, which holds the prompt's ids
// and matched data (m), to data's id, time and model, as stamp does each
// (which and where is the plan, made once for the layouts as they are, not
// found again every stream); the values are written over the old ones
// without comparing them (a new stream's id differs anyway). ok false:
// nothing was written, stamp does it: a value's length differs from the
// one it replaces (stamp moves the layout's bytes), or the layouts have
// different lengths for one value.
func (t *Tracker) stampAll(i int, data []byte, m *holeMatch) (ok bool) {
	l := t.lay
	if !l.planned || int(l.planFor) != i {
		l.planStamps(i)
	}
	if l.nplan == 0 {
		return false
	}
	for _, c := range l.lens[:l.nlens] {
		if sp := m.spans[c.from]; sp[1]-sp[0] != int(c.n) {
			return false
		}
	}
	for _, e := range l.plan[:l.nplan] {
		tm := &l.tmpls[e.tmpl]
		copy(tm.b[e.start:e.end], data[m.spans[e.from][0]:m.spans[e.to][1]])
		if e.tail {
			tm.steadyHoles()
		}
	}
	t.restamps += int(l.stamped)
	return true
}

// planStamps makes the plan stampAll follows for a first chunk matched
// through layout i: each other layout's id, time and model hole whose
// kind and JSON type layout i has too, as stamp picks them, in runs.
func (l *layouts) planStamps(i int) {
	src := &l.tmpls[i]
	l.nplan, l.nlens, l.stamped, l.planFor, l.planned = 0, 0, 0, int8(i), true
	var want [numHoleKinds]int // the value's length in the layouts (0: none yet)
	for j := range l.tmpls {
		tm := &l.tmpls[j]
		if j == i || !tm.ok {
			continue
		}
		n := l.nplan
		for hi := range tm.holes[:tm.n] {
			h := &tm.holes[hi]
			from := int8(-1)
			if h.kind >= holeID {
				from = src.at[h.kind]
			}
			if from < 0 || src.holes[from].str != h.str {
				continue
			}
			switch w := h.end - h.start; want[h.kind] {
			case 0:
				want[h.kind] = w
				l.lens[l.nlens] = stampLen{from: from, n: uint16(w)}
				l.nlens++
			case w:
			default:
				l.nplan = 0 // one length check a value would not do
				return
			}
			tail := tm.steady && h.start >= int(tm.idsEnd)
			if e := &l.plan[max(l.nplan-1, 0)]; l.nplan > n && int(e.tmpl) == j && e.to == from-1 &&
				tm.holes[hi-1].kind >= holeID && tm.holes[hi-1].end == int(e.end) &&
				string(tm.b[e.end:h.start]) == string(src.b[src.holes[from-1].end:src.holes[from].start]) {
				e.to, e.end, e.tail = from, uint16(h.end), e.tail || tail
				continue
			}
			l.plan[l.nplan] = stampHole{tmpl: int8(j), from: from, to: from, tail: tail,
				start: uint16(h.start), end: uint16(h.end)}
			l.nplan++
		}
		if l.nplan > n {
			l.stamped++
		}
	}
}

// holeMatch is where matchHoles found a chunk's holes.
type holeMatch struct {
	spans            [numHoleKinds][2]int // value spans in data, by hole index (those visited)
	txtStart, txtEnd int                  // the text's content
	txtEsc           bool                 // ... holds escapes or non-ASCII
	rebase           bool                 // the stream's id, time or model differ from tm's
}

// matchHoles matches data against tm's fixed bytes and finds its holes'
// values, appending the output ids to t.OutIDs (the caller drops them
// when it does not take the match). It returns where the layout's last
// fixed bytes end in data (data may go on: the caller says whether it
// may), or -1: data does not start with the layout.
func (t *Tracker) matchHoles(tm *template, data []byte, rigid bool, m *holeMatch) int {
	m.txtEsc, m.rebase = false, false
	pos, prev := 0, 0
	visit := int(tm.n)
	if rigid {
		visit = int(tm.nv)
	}
	for x := range visit {
		hi := x
		if rigid {
			hi = int(tm.vary[x])
		}
		h := &tm.holes[hi]
		fixed := tm.b[prev:h.start]
		if len(data)-pos <= len(fixed) || !sameFixed(data[pos:pos+len(fixed)], fixed) {
			return -1
		}
		pos += len(fixed)
		start := pos
		switch h.kind {
		case holeOutIDs:
			var ok bool
			if t.OutIDs, pos, ok = appendIDArray(t.OutIDs, data, pos); !ok {
				return -1
			}
		case holePrompt:
			if pos = idArrayEnd(data, pos); pos < 0 {
				return -1
			}
		case holeText:
			if data[pos] != '"' {
				return -1
			}
			if end := plainStringEnd(data, pos); end > 0 {
				m.txtStart, m.txtEnd = pos+1, end
				pos = end + 1
				break
			}
			s := jsonx.Scanner{B: data, I: pos, Lenient: true}
			st, en, esc, err := s.String()
			if err != nil {
				return -1
			}
			m.txtStart, m.txtEnd, m.txtEsc = st, en, esc
			pos = s.I
		case holeFinish:
			if data[pos] == 'n' {
				if len(data)-pos < 4 || string(data[pos:pos+4]) != "null" {
					return -1
				}
				pos += 4
				break
			}
			if pos = stringEnd(data, pos); pos < 0 {
				return -1
			}
		default: // holeID, holeCreated, holeModel
			// The stream's id, time and model are the same in all its
			// chunks: the value the template holds is compared, not read
			// (equal bytes up to the next fixed byte are the same JSON
			// value); another stream's is read, and the template rebased
			// on this chunk so that its next chunks compare.
			if w := h.end - h.start; len(data)-pos > w && bytes.Equal(data[pos:pos+w], tm.b[h.start:h.end]) {
				pos += w
				break
			}
			m.rebase = true
			if h.str {
				if pos = stringEnd(data, pos); pos < 0 {
					return -1
				}
				break
			}
			if c := data[pos]; c != '-' && (c < '0' || c > '9') {
				return -1
			}
			s := jsonx.Scanner{B: data, I: pos, Lenient: true}
			if s.Number() != nil {
				return -1
			}
			pos = s.I
		}
		m.spans[hi] = [2]int{start, pos}
		prev = h.end
	}
	if tail := tm.b[prev:]; len(data)-pos >= len(tail) && sameFixed(data[pos:pos+len(tail)], tail) {
		return pos + len(tail)
	}
	return -1
}

// keepStream keeps the stream's id, created and model from a matched
// chunk, as the full read's remember does: the first of each.
func (t *Tracker) keepStream(tm *template, data []byte, m *holeMatch, rigid bool) {
	for _, k := range [3]holeKind{holeID, holeCreated, holeModel} {
		hi := tm.at[k]
		if hi < 0 {
			continue
		}
		h := tm.holes[hi]
		v := tm.b[h.start:h.end] // matched as fixed bytes: the same value
		if !rigid {
			v = data[m.spans[hi][0]:m.spans[hi][1]]
		}
		switch k {
		case holeID:
			if len(t.ID) == 0 {
				t.ID = append(t.ID, v...)
			}
		case holeCreated:
			if len(t.Created) == 0 {
				t.Created = append(t.Created, v...)
			}
		default:
			if len(t.Model) == 0 {
				t.Model = append(t.Model, v...)
			}
		}
	}
	t.noteKept()
}

// plainStringEnd is the offset of the closing quote of the JSON string
// at b[i] when its content is printable ASCII without escapes — a
// token's text, most often a few bytes, read without the general
// scanner's set-up — and -1 when it is not (jsonx.Scanner.String reads
// it).
func plainStringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j
		case c < 0x20 || c == '\\' || c >= 0x80:
			return -1
		}
	}
	return -1
}

// sameFixed reports whether a and b hold the same bytes: a layout's fixed
// bytes against a chunk's. A steady chunk has two runs of them, ~150 and
// ~50 bytes in vLLM's and the simulator's chat chunks, which are most of
// what tracking reads of it; 32 bytes or more are compared by vecEqual, 32
// bytes a step (memequal's 64-byte rounds end in an 8-byte loop: about
// twice the instructions at these lengths). a and b are of one length: the
// callers slice the chunk to the layout's run, and vecEqual reads len(a)
// bytes of both (a length check here would cost the inlining).
func sameFixed(a, b []byte) bool {
	if haveVecEqual && len(a) >= 32 {
		return vecEqual(unsafe.SliceData(a), unsafe.SliceData(b), len(a))
	}
	return string(a) == string(b)
}

// stringEnd is the offset just past the JSON string at b[i], or -1 when
// b[i] starts none: a plain one (a finish reason, a stream's id) found
// eight bytes at a time (a stream's id is tens of bytes, read once a
// stream: a word loop's set-up pays there, not for a token's text) and
// by plainStringEnd, any other read by the scanner.
func stringEnd(b []byte, i int) int {
	if b[i] != '"' {
		return -1
	}
	j := i + 1
	for ; len(b)-j >= 8; j += 8 {
		w := binary.LittleEndian.Uint64(b[j:])
		if k := plainWordEnd(w); k < 8 {
			if byte(w>>(8*k)) == '"' {
				return j + k + 1
			}
			j = -1 // not plain: the scanner reads it
			break
		}
	}
	if j > 0 {
		if end := plainStringEnd(b, j-1); end > 0 {
			return end + 1
		}
	}
	s := jsonx.Scanner{B: b, I: i, Lenient: true}
	if _, _, _, err := s.String(); err != nil {
		return -1
	}
	return s.I
}

// idArrayEnd is the offset just past the id array at b[i] (up to its
// first ']'), or -1 when b[i] starts none or the array holds a line break
// (which would end an event's data line). With the vector scan, -1 also
// when a byte before that ']' is not one an engine's ids are written with
// (idStop): the chunk is then read in full, as it would be otherwise.
func idArrayEnd(b []byte, i int) int {
	if b[i] != '[' {
		return -1
	}
	if haveIDScan {
		j := indexIDsEnd(b[i+1:])
		if j < 0 || b[i+1+j] != ']' {
			return -1
		}
		return i + j + 2
	}
	j := bytes.IndexByte(b[i:], ']')
	if j < 0 || bytes.IndexByte(b[i:i+j], '\n') >= 0 || bytes.IndexByte(b[i:i+j], '\r') >= 0 {
		return -1
	}
	return i + j + 1
}

// idStop reports whether byte c ends the scan of an id array: anything
// outside ' '..'9' (digits, commas, spaces and a few signs that no array
// of ids ends with). The array's ']' and a line break are among them, so
// the first stop is the array's end or shows it is not one to read here;
// one range is what the vector scan tests in one compare a block.
func idStop(c byte) bool {
	return c-' ' > '9'-' '
}

// indexIDsEnd is the offset of the first byte of b that idStop stops at,
// or -1: the bytes idArrayEnd looks for, read once (a long prompt's ids
// are thousands of bytes; three IndexByte passes read them three times).
func indexIDsEnd(b []byte) int {
	tail := 0 // where the bytes scanIDBlocks did not read begin
	if haveIDScan && len(b) >= 32 {
		if j := scanIDBlocks(&b[0], len(b)); j >= 0 {
			return j
		}
		tail = len(b) &^ 31
	}
	for j := tail; j < len(b); j++ {
		if idStop(b[j]) {
			return j
		}
	}
	return -1
}

// appendIDArray appends the ids of the array at b[i] to dst and returns
// the offset just past it; ok false: it is not an array of ids on one
// line (what dst holds then is the caller's to drop). A chunk's output is
// most often one id, "[d…d]", read here without a call (oneID, else a
// byte loop); anything else is openai.AppendTokenIDs's to judge, as the
// full read does.
func appendIDArray(dst []uint32, b []byte, i int) (out []uint32, end int, ok bool) {
	if len(b)-i > 8 && b[i] == '[' {
		w := binary.LittleEndian.Uint64(b[i+1:])
		if n := oneID(w); n > 0 {
			return append(dst, idValue(w, n)), i + n + 2, true
		}
	}
	j := i + 1
	var v uint64
	for j < len(b) && j-i <= 10 {
		d := b[j] - '0'
		if d > 9 {
			break
		}
		v = v*10 + uint64(d)
		j++
	}
	if n := j - i - 1; n > 0 && j < len(b) && b[j] == ']' && b[i] == '[' && v <= 1<<32-1 && (n == 1 || b[i+1] != '0') {
		return append(dst, uint32(v)), j + 1, true
	}
	if end = idArrayEnd(b, i); end < 0 {
		return dst, -1, false
	}
	out, err := openai.AppendTokenIDs(dst, b[i:end])
	return out, end, err == nil
}

// Bytes of eight in a word, for oneID.
const (
	bytes01 = 0x0101010101010101
	nibbles = 0xF0 * bytes01
)

// oneID reads w, the eight bytes after an id array's '[' (the first in
// the lowest byte), as one id of at most seven digits closed by ']': its
// digits n (0: w starts no such id; the byte loop and the full read judge
// it) and the id (idValue). A steady chunk's id is read with a few word
// operations instead of a loop over its digits; the two halves are small
// enough to be inlined.
func oneID(w uint64) (n int) {
	// A byte is a digit when its high nibble is 3 and adding 6 to it
	// keeps it so. An addition's carry reaches only the bytes after the
	// one that makes it, which is not a digit: the first byte that is
	// not one is found exactly.
	nd := (w&nibbles ^ 0x30*bytes01) | ((w+0x06*bytes01)&nibbles ^ 0x30*bytes01)
	n = bits.TrailingZeros64(nd) >> 3
	if n == 0 || n == 8 || byte(w>>(8*n)) != ']' || (n > 1 && byte(w) == '0') {
		return 0
	}
	return n
}

// idValue is the id of the n digits at the start of w (oneID's).
func idValue(w uint64, n int) uint32 {
	// The digits moved to the word's last bytes (zeros before them), then
	// joined pairwise: 8 digits of 4 bits, 4 of 8, 2 of 16, one of 32.
	d := (w & (0x0F * bytes01)) << (64 - 8*n)
	d = (d*10 + d>>8) & 0x00FF00FF00FF00FF
	d = (d*100 + d>>16) & 0x0000FFFF0000FFFF
	return uint32(d*10000 + d>>32)
}

// Bytes a JSON string's plain content (plainStringEnd's) does not hold,
// for plainWordEnd.
const (
	bytes80 = 0x80 * bytes01
	quotes  = '"' * bytes01
	slashes = '\\' * bytes01
)

// plainWordEnd is the index of the first byte of w (the first in the
// lowest byte) that a plain string's content does not hold — a quote, a
// backslash, a control byte or a non-ASCII one — or 8: none. Each test
// below may also flag a byte after one it flags rightly (a borrow runs
// upwards), never one before: the lowest flagged byte is exact.
func plainWordEnd(w uint64) int {
	q, s := w^quotes, w^slashes
	m := (q-bytes01)&^q | (s-bytes01)&^s | (w-0x20*bytes01)&^w | w
	return bits.TrailingZeros64(m&bytes80) >> 3
}
