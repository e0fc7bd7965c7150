package continuation

import (
	"bytes"

	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/openai"
)

// The fast path. An engine writes the chunks of one stream in one layout:
// after the first chunk (role, prompt ids) they differ only in the text
// they carry and its token ids, up to the last (finish reason). Reading
// each chunk in full costs about a microsecond; relaying it costs less.
// So the tracker learns the layout from a chunk it read in full — its
// bytes, with the text string and the id array as holes — and a chunk
// whose bytes equal the layout's outside the holes, with a JSON string in
// the text hole and an id array in the id hole, is the same JSON document
// but for those two values: reading it in full would find exactly what
// the holes hold, so only they are read. Any other chunk is read in full
// (and its layout learnt when it has one; else the last one learnt
// stays). FuzzFastAgrees holds the two
// paths to the same result.

// chunkShape is what the full read of one chunk found.
type chunkShape struct {
	texts, nullTexts int    // text string values; null ones
	text             [2]int // the text string's span, quotes included
	ids              int    // output id arrays
	idSpan           [2]int // the output id array's span
	prompts          int    // prompt id arrays
	strips           int    // members stripped from the client's copy
	strip            [2]int // the stripped member's span: key to value end
	finished, tools  bool
}

func (c *chunkShape) stripped(start, end int) {
	c.strips++
	c.strip = [2]int{start, end}
}

// template is a chunk layout: b, a chunk read in full, with one or two
// holes (its text string and its id array, in order of offset).
type template struct {
	ok    bool
	strip bool // learnt with Tracker.Strip set
	b     []byte
	holes [2]hole
	n     int // holes in use
	// cut: the id member is cut from the client's copy; preCut and
	// postCut are the bytes cut before and after the id array (the
	// member's key and a comma).
	cut             bool
	preCut, postCut int
}

type hole struct {
	start, end int
	ids        bool // an id array; else the text string
}

// learn makes the chunk data, read in full into out (the client's copy),
// the template when its layout can be matched: one text string, at most
// one output id array and nothing else that a chunk's read changes (no
// prompt ids, finish reason, tool calls or poison), and a client's copy
// that is data without the id member exactly.
func (t *Tracker) learn(data, out []byte) {
	sh := &t.shape
	if t.noFast || t.Poisoned != PoisonNone || sh.finished || sh.tools || sh.texts != 1 ||
		sh.nullTexts != 0 || sh.prompts != 0 || sh.ids > 1 || sh.strips > sh.ids {
		return
	}
	nt := template{strip: t.Strip, n: 1}
	nt.holes[0] = hole{start: sh.text[0], end: sh.text[1]}
	if sh.ids == 1 {
		id := hole{start: sh.idSpan[0], end: sh.idSpan[1], ids: true}
		if id.start < sh.text[1] && sh.text[0] < id.end {
			return
		}
		if id.start < nt.holes[0].start {
			nt.holes[0], nt.holes[1] = id, nt.holes[0]
		} else {
			nt.holes[1] = id
		}
		nt.n = 2
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
		if a > sh.idSpan[0] || b < sh.idSpan[1] || (a < sh.text[1] && sh.text[0] < b) {
			return
		}
		if len(out) != len(data)-(b-a) || !bytes.Equal(out[:a], data[:a]) || !bytes.Equal(out[a:], data[b:]) {
			return
		}
		nt.cut, nt.preCut, nt.postCut = true, sh.idSpan[0]-a, b-sh.idSpan[1]
	} else if len(out) != len(data) {
		return
	}
	if bytes.IndexByte(data, '\n') >= 0 || bytes.IndexByte(data, '\r') >= 0 {
		return // a layout must be one line: AppendEvent matches whole events
	}
	nt.b, nt.ok = append(t.tmpl.b[:0], data...), true
	t.tmpl = nt
}

// observeFast reads chunk data through the template; ok false: data does
// not match it (nothing was changed).
func (t *Tracker) observeFast(data []byte) (out []byte, ok bool) {
	a, b, ok := t.matchFast(data)
	if !ok || a < 0 {
		return data, ok
	}
	t.out = append(append(t.out[:0], data[:a]...), data[b:]...)
	return t.out, true
}

// matchFast reads chunk data through the template. ok false: data does
// not match it (nothing was changed); else data[a:b] is what the client
// must not see (a < 0: nothing).
func (t *Tracker) matchFast(data []byte) (a, b int, ok bool) {
	a, b = -1, -1
	tm := &t.tmpl
	if !tm.ok || tm.strip != t.Strip {
		return a, b, false
	}
	pos, prev := 0, 0
	ids := [2]int{-1, -1}
	var txtStart, txtEnd int
	var txtEsc bool
	for _, h := range tm.holes[:tm.n] {
		fixed := tm.b[prev:h.start]
		if len(data)-pos <= len(fixed) || !bytes.Equal(data[pos:pos+len(fixed)], fixed) {
			return a, b, false
		}
		pos += len(fixed)
		if h.ids {
			if data[pos] != '[' {
				return a, b, false
			}
			j := bytes.IndexByte(data[pos:], ']')
			if j < 0 || bytes.IndexByte(data[pos:pos+j], '\n') >= 0 || bytes.IndexByte(data[pos:pos+j], '\r') >= 0 {
				return a, b, false // (a line break would end an event's data line)
			}
			ids = [2]int{pos, pos + j + 1}
			pos += j + 1
		} else {
			if data[pos] != '"' {
				return a, b, false
			}
			s := jsonx.Scanner{B: data, I: pos, Lenient: true}
			st, en, esc, err := s.String()
			if err != nil {
				return a, b, false
			}
			txtStart, txtEnd, txtEsc = st, en, esc
			pos = s.I
		}
		prev = h.end
	}
	if !bytes.Equal(data[pos:], tm.b[prev:]) {
		return a, b, false
	}
	// The chunk matches: what follows is what the full read would do.
	chunkIDs := false
	if ids[0] >= 0 {
		n := len(t.OutIDs)
		got, err := openai.AppendTokenIDs(t.OutIDs, data[ids[0]:ids[1]])
		if err != nil {
			t.OutIDs = got[:n]
			return a, b, false // the full read decides what a bad array means
		}
		t.OutIDs, chunkIDs = got, true
	}
	t.fastChunks++
	if txtEnd > txtStart {
		if txtEsc {
			t.Text = jsonx.AppendUnescaped(t.Text, data[txtStart:txtEnd])
		} else {
			t.Text = append(t.Text, data[txtStart:txtEnd]...)
		}
		t.TextChunks++
		if chunkIDs {
			t.IDChunks++
		}
	}
	if tm.cut {
		a, b = ids[0]-tm.preCut, ids[1]+tm.postCut
	}
	return a, b, true
}
