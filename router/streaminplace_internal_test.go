package router

import (
	"bytes"
	"io"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/infera/infera/continuation"
	"github.com/infera/infera/openai"
)

// inPlaceReader serves a stream as upstream.Exchange reads a chunked
// answer in place (inPlaceSource): each arrival (what one read of the
// connection brings) is laid out in one buffer, every piece of data after
// framing bytes, and Next hands the pieces out as slices of that buffer.
// A Next(true) past the arrival's last piece takes the next arrival, and
// first writes over the whole buffer, as a reader's next fill reuses it:
// a pump that kept a piece past it relays '#'. Read copies, as Exchange.Read
// does.
type inPlaceReader struct {
	arrivals [][][]byte
	next     int      // the next arrival
	buf      []byte   // the current arrival, framing included
	junk     []byte   // what a fill writes over buf first
	pieces   [][]byte // its pieces, from pieces[at] not yet handed out (that one maybe in part)
	at       int
	inPlace  int // pieces handed out by Next
	reads    int // Reads that returned bytes
}

func newInPlaceReader(arrivals [][][]byte) *inPlaceReader {
	size := 0
	for _, a := range arrivals {
		n := 0
		for _, p := range a {
			n += len(p) + len("3\r\n")
		}
		size = max(size, n)
	}
	return &inPlaceReader{arrivals: arrivals, buf: make([]byte, 0, size), junk: bytes.Repeat([]byte("#"), size)}
}

// rewind serves the arrivals again from the first.
func (r *inPlaceReader) rewind() { r.next, r.pieces, r.at = 0, r.pieces[:0], 0 }

func (r *inPlaceReader) InPlace() bool { return true }

func (r *inPlaceReader) Buffered() int {
	n := 0
	for _, p := range r.pieces[r.at:] {
		n += len(p)
	}
	return n
}

// fill takes the next arrival; false: there is none, the stream is over.
func (r *inPlaceReader) fill() bool {
	if r.next == len(r.arrivals) {
		return false
	}
	b := r.buf[:cap(r.buf)]
	copy(b, r.junk)
	b, r.pieces, r.at = b[:0], r.pieces[:0], 0
	for _, p := range r.arrivals[r.next] {
		b = append(b, "3\r\n"...)
		b = append(b, p...)
		r.pieces = append(r.pieces, b[len(b)-len(p):])
	}
	r.next++
	return true
}

func (r *inPlaceReader) Next(wait bool) ([]byte, error) {
	if r.at == len(r.pieces) {
		switch {
		case r.next == len(r.arrivals):
			return nil, io.EOF // the end arrived with the last pieces
		case !wait:
			return nil, nil
		}
		r.fill()
	}
	p := r.pieces[r.at]
	r.at++
	r.inPlace++
	return p, nil
}

func (r *inPlaceReader) Read(p []byte) (int, error) {
	if r.at == len(r.pieces) && !r.fill() {
		return 0, io.EOF
	}
	n := copy(p, r.pieces[r.at])
	if r.pieces[r.at] = r.pieces[r.at][n:]; len(r.pieces[r.at]) == 0 {
		r.at++
	}
	r.reads++
	return n, nil
}

// splitArrivals cuts stream into pieces at random (the engine's chunks,
// an event split across two now and then) and groups them into arrivals
// of 1 to 4 pieces.
func splitArrivals(rng *rand.Rand, stream []byte, maxPiece int) [][][]byte {
	var arrivals [][][]byte
	for len(stream) > 0 {
		var a [][]byte
		for k := 1 + rng.IntN(4); k > 0 && len(stream) > 0; k-- {
			n := min(len(stream), 1+rng.IntN(maxPiece))
			a = append(a, stream[:n])
			stream = stream[n:]
		}
		arrivals = append(arrivals, a)
	}
	return arrivals
}

// eventArrivals gives every event of stream its own piece, and all of them
// one arrival: an engine's whole answer in one read.
func eventArrivals(stream []byte) [][][]byte { return eventArrivalsBy(stream, 0) }

// eventArrivalsBy gives every event of stream its own piece, perArrival of
// them an arrival (0: all).
func eventArrivalsBy(stream []byte, perArrival int) [][][]byte {
	var arrivals [][][]byte
	var a [][]byte
	for len(stream) > 0 {
		k := openai.NextEvent(stream)
		a = append(a, stream[:k])
		stream = stream[k:]
		if len(a) == perArrival {
			arrivals, a = append(arrivals, a), nil
		}
	}
	if len(a) > 0 {
		arrivals = append(arrivals, a)
	}
	return arrivals
}

// leadFunc is a function as a pump's lead (leader).
type leadFunc func(dst, buf []byte) ([]byte, int)

func (f leadFunc) AppendNext(dst, buf []byte) ([]byte, int) { return f(dst, buf) }

// copyLead is a lead whose copy of an event is the event itself.
func copyLead(dst, buf []byte) ([]byte, int) {
	k := openai.NextEvent(buf)
	if k < 0 {
		return dst, 0
	}
	return append(dst, buf[:k]...), k
}

func copyEvent(dst, ev []byte) []byte { return append(dst, ev...) }

// TestEventPumpInPlace: a stream read in place (the upstream connection's
// reader, the chunks' framing between the pieces) reaches the client as
// the copying pump relays it, and a tracked stream's tracker reads the
// same text and ids, however the stream is cut into pieces and arrivals:
// tracked (copies over the read bytes), a transform without a lead (copies
// into the pump's out), a transform that makes longer copies. With every
// event whole in one arrival nothing is copied into the pump's buffer.
func TestEventPumpInPlace(t *testing.T) {
	sim, stream, tracked, ref := trackedTestStream(t)
	// Doubled events: their bounds must be the same whatever the pieces,
	// so no CRLF ends there (a CR at a piece's end already ends its line).
	lf := slices.Concat(sim, []byte(": keep-alive\n\n"), sim)
	double := func(dst, ev []byte) []byte { return append(append(dst, ev...), ev...) }
	never := func(dst, _ []byte) ([]byte, int) { return dst, 0 }
	var doubled []byte
	for rest := lf; len(rest) > 0; {
		k := openai.NextEvent(rest)
		doubled = double(doubled, rest[:k])
		rest = rest[k:]
	}
	rng := rand.New(rand.NewPCG(36, 2))
	for _, mode := range []string{"tracked", "copied", "longer"} {
		in := stream
		if mode == "longer" {
			in = lf
		}
		layouts := [][][][]byte{eventArrivals(in)}
		for _, maxPiece := range []int{7, 64, 400, 2000, len(in)} {
			for range 20 {
				layouts = append(layouts, splitArrivals(rng, in, maxPiece))
			}
		}
		for i, arrivals := range layouts {
			var tr continuation.Tracker
			tr.Reset(true)
			p := eventPump{buf: make([]byte, 8192)}
			want := in
			switch mode {
			case "tracked":
				p.transform, p.lead, want = tr.AppendEvent, &tr, tracked
			case "copied":
				p.transform = copyEvent
			case "longer":
				p.transform, p.lead, want = double, leadFunc(never), doubled
			}
			src := newInPlaceReader(arrivals)
			var out bytes.Buffer
			if rest := pumpToEOF(t, &p, &out, src, 0); len(rest) != 0 {
				t.Fatalf("%s, layout %d: %d bytes left", mode, i, len(rest))
			}
			if got := out.Bytes(); !bytes.Equal(got, want) {
				at := 0
				for at < min(len(got), len(want)) && got[at] == want[at] {
					at++
				}
				t.Fatalf("%s, layout %d: relayed %d bytes, want %d, first difference at %d: %q", mode, i, len(got), len(want), at, got[at:min(len(got), at+40)])
			}
			if mode == "tracked" && (string(tr.Text) != string(ref.Text) || !slices.Equal(tr.OutIDs, ref.OutIDs) || tr.Done != ref.Done) {
				t.Fatalf("layout %d: tracked text %q ids %v, want %q %v", i, tr.Text, tr.OutIDs, ref.Text, ref.OutIDs)
			}
			if i == 0 && (src.reads != 0 || src.inPlace == 0) {
				t.Fatalf("%s: whole events in one arrival: %d reads copied, %d pieces read in place; want none copied", mode, src.reads, src.inPlace)
			}
		}
	}
}

// TestEventPumpInPlaceOneWrite: a stream that arrived whole leaves in one
// write, its end told first (streamEnd), as from the copying pump.
func TestEventPumpInPlaceOneWrite(t *testing.T) {
	sim, _, _, _ := trackedTestStream(t)
	var tr continuation.Tracker
	tr.Reset(true)
	ends := &endCounter{}
	p := eventPump{buf: make([]byte, relayBufSize), transform: tr.AppendEvent, lead: &tr, end: ends}
	dst := &countWriter{}
	_, rerr, werr := p.step(dst, newInPlaceReader(eventArrivals(sim)))
	if rerr != io.EOF || werr != nil || dst.writes != 1 || ends.n != 1 {
		t.Fatalf("step: read %v, write %v, %d writes, end told %d times; want the end, one write, told once", rerr, werr, dst.writes, ends.n)
	}
}

type endCounter struct{ n int }

func (e *endCounter) atEnd() { e.n++ }

// TestEventPumpInPlaceAllocs: a stream read in place, its copies made
// over the read bytes or into the pump's out, allocates nothing.
func TestEventPumpInPlaceAllocs(t *testing.T) {
	ev := []byte(testEvent)
	stream := bytes.Repeat(ev, 64)
	src := newInPlaceReader(splitArrivals(rand.New(rand.NewPCG(1, 2)), stream, 500)) // cut events too
	dst := &countWriter{}
	for _, lead := range []leader{leadFunc(copyLead), nil} {
		p := eventPump{buf: make([]byte, relayBufSize), transform: copyEvent, lead: lead, out: make([]byte, 0, relayBufSize)}
		run := func() {
			src.rewind()
			pumpToEOF(t, &p, dst, src, 0)
		}
		run()
		if n := testing.AllocsPerRun(100, run); n != 0 {
			t.Fatalf("a stream read in place allocates %.2f times, want 0", n)
		}
	}
	if src.inPlace == 0 {
		t.Fatal("nothing was read in place")
	}
}

// readOnly hides a source's in-place reading: the pump copies.
type readOnly struct{ io.Reader }

// BenchmarkEventPumpTracked relays one tracked 16-token stream of the
// simulator (its whole answer in one arrival, an event a chunk), read in
// place or copied into the pump's buffer first, as before.
func BenchmarkEventPumpTracked(b *testing.B) {
	sim, _, _, _ := trackedTestStream(b)
	for _, via := range []string{"in_place", "copied"} {
		b.Run(via, func(b *testing.B) {
			src := newInPlaceReader(eventArrivals(sim))
			var from io.Reader = src
			if via == "copied" {
				from = readOnly{src}
			}
			var tr continuation.Tracker
			p := eventPump{buf: make([]byte, relayBufSize), transform: tr.AppendEvent, lead: &tr}
			dst := &countWriter{}
			b.ReportAllocs()
			b.SetBytes(int64(len(sim)))
			for b.Loop() {
				src.rewind()
				tr.Reset(true)
				pumpToEOF(b, &p, dst, from, 0)
			}
			if src.inPlace == 0 && via == "in_place" || src.reads == 0 && via == "copied" {
				b.Fatalf("%s: %d pieces in place, %d reads", via, src.inPlace, src.reads)
			}
		})
	}
}
