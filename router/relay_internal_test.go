package router

import (
	"bytes"
	"errors"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/continuation"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/openai"
)

// chunkReader returns its chunks one per Read, cycling forever.
type chunkReader struct {
	chunks [][]byte
	i      int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	c := r.chunks[r.i%len(r.chunks)]
	r.i++
	return copy(p, c), nil
}

// countWriter counts writes and bytes and keeps nothing.
type countWriter struct{ writes, bytes int }

func (w *countWriter) Write(p []byte) (int, error) {
	w.writes++
	w.bytes += len(p)
	return len(p), nil
}

const testEvent = "data: {\"id\":\"chatcmpl-8c1f\",\"object\":\"chat.completion.chunk\",\"created\":1730000000,\"model\":\"Qwen/Qwen3-8B\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"

func TestEventPumpAllocs(t *testing.T) {
	ev := []byte(testEvent)
	// One event per read, and one event split over two reads.
	src := &chunkReader{chunks: [][]byte{ev, ev[:50], ev[50:]}}
	dst := &countWriter{}
	p := eventPump{buf: make([]byte, relayBufSize)}
	if n := testing.AllocsPerRun(1000, func() {
		if _, rerr, werr := p.step(dst, src); rerr != nil || werr != nil {
			t.Fatal(rerr, werr)
		}
	}); n != 0 {
		t.Fatalf("eventPump.step allocates %.2f times per event, want 0", n)
	}
	if dst.bytes%len(ev) != 0 || p.n != 0 && p.n != 50 {
		t.Fatalf("relayed %d bytes (%d buffered), not whole events", dst.bytes, p.n)
	}
}

// eofReader serves data in reads of at most size bytes, then io.EOF.
type eofReader struct {
	data []byte
	size int
}

func (r *eofReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), r.size, len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// pumpToEOF steps p from src into w until src ends (failing after more
// than maxSteps steps when maxSteps > 0) and returns what p still holds:
// bytes after the last whole event, which no step writes.
func pumpToEOF(t testing.TB, p *eventPump, w io.Writer, src io.Reader, maxSteps int) []byte {
	t.Helper()
	for i := 0; ; i++ {
		if maxSteps > 0 && i > maxSteps {
			t.Fatal("the pump does not reach the end")
		}
		_, rerr, werr := p.step(w, src)
		if werr != nil {
			t.Fatal(werr)
		}
		if rerr == io.EOF {
			break
		}
	}
	return p.buf[:p.n]
}

func TestEventPumpWritesWholeEvents(t *testing.T) {
	stream := "data: a\n\ndata: b\r\n\r\n: comment\n\nevent: x\rdata: c\r\rdata: [DONE]\n\ntrailing"
	for size := 1; size <= len(stream); size++ {
		p := eventPump{buf: make([]byte, 64)}
		var out bytes.Buffer
		var writes []string
		w := writerFunc(func(b []byte) (int, error) {
			writes = append(writes, string(b))
			return out.Write(b)
		})
		out.Write(pumpToEOF(t, &p, w, &eofReader{data: []byte(stream), size: size}, 0))
		if out.String() != stream {
			t.Fatalf("read size %d: relayed %q, want %q", size, out.String(), stream)
		}
		for _, wr := range writes {
			// A blank line ends each write ("\r\n\r" counts: a trailing CR
			// ends its line, see openai.NextEvent).
			if last := wr[len(wr)-1]; last != '\n' && last != '\r' {
				t.Fatalf("read size %d: write %q does not end at an event boundary", size, wr)
			}
		}
	}
}

func TestEventPumpOversizedEvent(t *testing.T) {
	big := "data: " + string(bytes.Repeat([]byte("x"), 200)) + "\n\ndata: y\n\n"
	p := eventPump{buf: make([]byte, 64)}
	var out bytes.Buffer
	out.Write(pumpToEOF(t, &p, &out, &eofReader{data: []byte(big), size: 10}, 0))
	if out.String() != big {
		t.Fatalf("relayed %q, want %q", out.String(), big)
	}
}

// TestEventPumpTrackedInPlace: a tracked stream's events, found and
// copied by the tracker over the bytes they were read from (the pump's
// lead), reach the client as the tracker gives them event by event, and
// the tracker reads the same text and ids, whatever the reads' sizes
// (events split across reads, several in one).
func TestEventPumpTrackedInPlace(t *testing.T) {
	_, stream, want, ref := trackedTestStream(t)
	for _, size := range []int{len(stream), 4096, 1000, 333, 64, 7} {
		var tr continuation.Tracker
		tr.Reset(true)
		taken := 0
		lead := func(dst, buf []byte) ([]byte, int) {
			dst, n := tr.AppendNext(dst, buf)
			if n > 0 {
				taken++
			}
			return dst, n
		}
		p := eventPump{buf: make([]byte, 8192), transform: tr.AppendEvent, lead: leadFunc(lead)}
		var out bytes.Buffer
		if rest := pumpToEOF(t, &p, &out, &eofReader{data: stream, size: size}, 0); len(rest) != 0 {
			t.Fatalf("read size %d: %q left", size, rest)
		}
		if !bytes.Equal(out.Bytes(), want) {
			t.Fatalf("read size %d: relayed\n%q\nwant\n%q", size, out.Bytes(), want)
		}
		if string(tr.Text) != string(ref.Text) || !slices.Equal(tr.OutIDs, ref.OutIDs) || tr.Done != ref.Done {
			t.Fatalf("read size %d: tracked text %q ids %v, want %q %v", size, tr.Text, tr.OutIDs, ref.Text, ref.OutIDs)
		}
		// Every event of the last two streams (17 chunks and [DONE]) is
		// found by the tracker when whole in the buffer.
		if size == len(stream) && taken < 2*18 {
			t.Fatalf("%d events found by the tracker, want at least the last two streams' 36", taken)
		}
	}
}

// TestEventPumpInPlaceLongerCopy: a transform whose copy of an event is
// longer than the event, in a pump with a lead, does not overwrite the
// bytes still to be read: the copies go on in another buffer.
func TestEventPumpInPlaceLongerCopy(t *testing.T) {
	stream := []byte("data: a\n\ndata: bb\n\n: c\n\ndata: [DONE]\n\n")
	double := func(dst, ev []byte) []byte { return append(append(dst, ev...), ev...) }
	never := func(dst, _ []byte) ([]byte, int) { return dst, 0 }
	p := eventPump{buf: make([]byte, 256), transform: double, lead: leadFunc(never)}
	var out bytes.Buffer
	pumpToEOF(t, &p, &out, &eofReader{data: stream, size: len(stream)}, 0)
	if want := "data: a\n\ndata: a\n\ndata: bb\n\ndata: bb\n\n: c\n\n: c\n\ndata: [DONE]\n\ndata: [DONE]\n\n"; out.String() != want {
		t.Fatalf("relayed %q, want %q", out.String(), want)
	}
}

// trackedTestStream is the simulator's stream as an engine sends it to a
// tracked relay (sim), three of them (the layouts are learnt on the
// first) with a comment and an event with CRLF line ends (not the
// tracker's to find: delimited by the pump) between them (stream), what
// the client gets of it (want) and the tracker that read it event by
// event (ref).
func trackedTestStream(t testing.TB) (sim, stream, want []byte, ref *continuation.Tracker) {
	sim, err := os.ReadFile("../continuation/testdata/sim-chat-ids.sse")
	if err != nil {
		t.Fatal(err)
	}
	stream = slices.Concat(sim, []byte(": keep-alive\n\n"), sim, []byte("data: {\"choices\":[{\"index\":0,\"text\":\"z\",\"token_ids\":[7]}]}\r\n\r\n"), sim)
	ref = new(continuation.Tracker)
	ref.Reset(true)
	for rest := stream; len(rest) > 0; {
		k := openai.NextEvent(rest)
		want = ref.AppendEvent(want, rest[:k])
		rest = rest[k:]
	}
	return sim, stream, want, ref
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// TestRelayWriteToAllocs drives the whole per-stream relay (as fasthttp
// does) over many events and checks that it allocates nothing per event.
func TestRelayWriteToAllocs(t *testing.T) {
	r, err := New(DefaultConfig(), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ev := []byte(testEvent)
	const events = 1000
	stream := bytes.Repeat(ev, events)
	dst := &countWriter{}
	src := &eofReader{}
	rel := testRelay(r, relayBufSize)
	run := func() {
		src.data, src.size = stream, len(ev)
		rel.att.src, rel.done, rel.firstByte = src, false, false
		if _, err := rel.WriteTo(dst); err != nil {
			t.Fatal(err)
		}
	}
	run()
	if n := testing.AllocsPerRun(20, run); n != 0 {
		t.Fatalf("relaying %d events allocates %.1f times, want 0", events, n)
	}
	// run ran 22 times: once above, once as AllocsPerRun's warm-up, 20 measured.
	if dst.writes != 22*events {
		t.Fatalf("%d writes for %d events: not one write per event", dst.writes, 22*events)
	}
}

// TestRelayWriteToTrackedAllocs: a stream tracked for continuation (ids
// asked of the engine, observed and stripped from every event) relays
// without allocating per event either, copied into the pump's buffer or
// read in place (inPlaceReader, streaminplace_internal_test.go).
func TestRelayWriteToTrackedAllocs(t *testing.T) {
	r, err := New(DefaultConfig(), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ev := []byte("data: {\"id\":\"chatcmpl-8c1f\",\"object\":\"chat.completion.chunk\",\"created\":1730000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"token_ids\":[1234],\"finish_reason\":null}]}\n\n")
	const events = 1000
	stream := append(bytes.Repeat(ev, events), "data: [DONE]\n\n"...)
	copied := &eofReader{}
	// Whole events in place (the tracker's scan of a cut one allocates
	// its error).
	inPlace := newInPlaceReader(eventArrivalsBy(stream, 7))
	for _, via := range []string{"copied", "in place"} {
		var out bytes.Buffer
		rel := testRelay(r, relayBufSize)
		rel.trackEvent = rel.trackedEvent
		rel.mig.on = true
		run := func() {
			out.Reset()
			rel.mig.track.Reset(true)
			copied.data, copied.size = stream, len(ev)
			inPlace.rewind()
			rel.att.src = copied
			if via == "in place" {
				rel.att.src = inPlace
			}
			rel.done, rel.firstByte = false, false
			rel.pump.transform, rel.pump.lead = rel.trackEvent, rel.trackLead()
			if _, err := rel.WriteTo(&out); err != nil {
				t.Fatal(err)
			}
		}
		run()
		if bytes.Contains(out.Bytes(), []byte("token_ids")) || len(rel.mig.track.OutIDs) != events {
			t.Fatalf("%s: tracked stream: ids not stripped, or %d of %d output ids seen", via, len(rel.mig.track.OutIDs), events)
		}
		if n := testing.AllocsPerRun(20, run); n != 0 {
			t.Fatalf("%s: relaying %d tracked events allocates %.1f times, want 0", via, events, n)
		}
	}
	if inPlace.inPlace == 0 {
		t.Fatal("nothing was read in place")
	}
}

// BenchmarkRelayTrackedStream: one 16-token stream as `infera sim` writes
// it with return_token_ids (continuation/testdata/sim-chat-ids.sse), in
// one read as from a zero-latency engine, relayed to the client (one op =
// one stream): tracked for continuation (every event observed, the ids
// stripped) against untracked (the same bytes relayed as they are). What
// tracking adds to the relay, without the network.
func BenchmarkRelayTrackedStream(b *testing.B) {
	stream, err := os.ReadFile("../continuation/testdata/sim-chat-ids.sse")
	if err != nil {
		b.Fatal(err)
	}
	r, err := New(DefaultConfig(), RoundRobin{}, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	// The streams of the *_relays64 cases: each its own id and time, as an
	// engine's are (the same lengths).
	var streams [][]byte
	for k := range 8 {
		s := bytes.ReplaceAll(stream, []byte("chatcmpl-5ae6257261e06ecb2a54213578c1755e"), []byte("chatcmpl-5ae6257261e06ecb2a54213578c1755"+string(rune('0'+k))))
		streams = append(streams, bytes.ReplaceAll(s, []byte("1796418576"), []byte("179641857"+string(rune('0'+k)))))
	}
	// The *_prompt800 cases: the first chunk carries 800 prompt ids, as
	// scripts/bench-overhead.sh's 128-word prompts give the simulator's
	// byte tokenizer (the recorded stream's prompt has 72).
	longStreams := make([][]byte, len(streams))
	for k, s := range streams {
		i := bytes.Index(s, []byte(`"prompt_token_ids":[`)) + len(`"prompt_token_ids":[`)
		j := i + bytes.IndexByte(s[i:], ']')
		ids := make([]byte, 0, 3200)
		for n := range 800 {
			if n > 0 {
				ids = append(ids, ',')
			}
			ids = strconv.AppendInt(ids, int64(48+(n*7+k)%75), 10)
		}
		longStreams[k] = append(append(append([]byte(nil), s[:i]...), ids...), s[j:]...)
	}
	for _, c := range []struct {
		name    string
		tracked bool
		relays  int
		long    bool
	}{{"untracked", false, 1, false}, {"tracked", true, 1, false}, {"untracked_relays64", false, 64, false}, {"tracked_relays64", true, 64, false},
		{"untracked_relays64_prompt800", false, 64, true}, {"tracked_relays64_prompt800", true, 64, true}} {
		// *_relays64: streams go to 64 pooled relays in turn, each stream
		// its own id, as under 64 concurrent streams: a relay's buffers
		// and its tracker's layouts are out of cache when it is next used.
		b.Run(c.name, func(b *testing.B) {
			rels := make([]*relay, c.relays)
			for i := range rels {
				rels[i] = testRelay(r, relayBufSize)
				rels[i].trackEvent = rels[i].trackedEvent
			}
			src := &eofReader{}
			var out countWriter
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				rel := rels[i%len(rels)]
				data := stream
				switch {
				case c.long:
					data = longStreams[i/len(rels)%len(longStreams)]
				case c.relays > 1:
					data = streams[i/len(rels)%len(streams)] // another stream each round
				}
				i++
				rel.mig.on, rel.pump.transform, rel.pump.lead = c.tracked, nil, nil
				if c.tracked {
					rel.mig.track.Reset(true)
					rel.pump.transform, rel.pump.lead = rel.trackEvent, rel.trackLead()
				}
				src.data, src.size = data, len(data)
				rel.att.src, rel.done, rel.firstByte = src, false, false
				if _, err := rel.WriteTo(&out); err != nil {
					b.Fatal(err)
				}
			}
			whole := len(stream)
			if c.long {
				whole = len(longStreams[0])
			}
			if perStream := out.bytes / b.N; c.tracked == (perStream >= whole) {
				b.Fatalf("tracked %v: %d bytes a stream relayed of %d (tracked: ids stripped)", c.tracked, perStream, whole)
			}
		})
	}
}

// testRelay is a relay of a 200 chat stream, outside the pool.
func testRelay(r *Router, bufSize int) *relay {
	rel := &relay{relayRequest: relayRequest{r: r, route: RouteChatCompletions, dialect: r.dialects[RouteChatCompletions], status: 200},
		pump: eventPump{buf: make([]byte, bufSize)}, mig: new(migration)}
	rel.att = attempt{rel: rel, status: 200}
	return rel
}

// failWriter fails every write.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestRelayWriteFailureEndsStream(t *testing.T) {
	r, err := New(DefaultConfig(), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	rel := testRelay(r, 1024)
	rel.att.src = &chunkReader{chunks: [][]byte{[]byte(testEvent)}}
	if _, err := rel.WriteTo(failWriter{}); err == nil {
		t.Fatal("WriteTo succeeded with a failing client")
	}
	if rel.outcome != outcomeClientGone || !rel.done {
		t.Fatalf("outcome %v, done %v; want client_gone", rel.outcome, rel.done)
	}
}

func TestUpdateFleetKeepsWorkers(t *testing.T) {
	r, err := New(DefaultConfig(), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	rec := func(id, model string, st discovery.Status) discovery.Record {
		return discovery.Record{WorkerID: id, URL: "http://" + id, ModelName: model, Engine: "sim",
			DisaggMode: discovery.DisaggMixed, DPSize: 1, RequestTransport: "http", Status: st}
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{
		rec("127.0.0.1:1", "m", discovery.StatusActive), rec("127.0.0.1:2", "m", discovery.StatusActive)}})
	v1 := r.view.Load()
	w1 := v1.models["m"].Workers[0]
	w1.inflight.Add(3)

	r.UpdateFleet(&discovery.Snapshot{Revision: 2, Workers: []discovery.Record{
		rec("127.0.0.1:1", "m", discovery.StatusDraining), rec("127.0.0.1:2", "m", discovery.StatusActive)}})
	v2 := r.view.Load()
	if got := v2.models["m"].Workers; len(got) != 1 || got[0].ID() != "127.0.0.1:2" {
		t.Fatalf("candidates after drain = %v, want only 127.0.0.1:2", got)
	}
	if v2.workers[0] != w1 || w1.InFlight() != 3 || w1.Record().Status != discovery.StatusDraining {
		t.Fatal("a worker whose url did not change must keep its Worker (pool, in-flight count)")
	}
	if v1.models["m"].cursor != v2.models["m"].cursor {
		t.Fatal("the model's rotation cursor must survive fleet updates")
	}

	r.UpdateFleet(&discovery.Snapshot{Revision: 3, Workers: []discovery.Record{
		rec("127.0.0.1:2", "m", discovery.StatusActive)}})
	if len(r.workers) != 1 || r.workers["127.0.0.1:1"] != nil {
		t.Fatalf("removed worker still tracked: %v", r.workers)
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 4})
	if len(r.cursors) != 0 {
		t.Fatalf("cursor of a vanished model kept: %v", r.cursors)
	}
}

// BenchmarkEventPump is the relay's per-event work alone: one read of one
// event and its write (one op = one event).
func BenchmarkEventPump(b *testing.B) {
	ev := []byte(testEvent)
	src := &chunkReader{chunks: [][]byte{ev}}
	dst := &countWriter{}
	p := eventPump{buf: make([]byte, relayBufSize)}
	b.SetBytes(int64(len(ev)))
	b.ReportAllocs()
	for b.Loop() {
		if _, rerr, werr := p.step(dst, src); rerr != nil || werr != nil {
			b.Fatal(rerr, werr)
		}
	}
}

// TestStartMigrationFindsTrackerReset: a pooled relay's tracked stream
// leaves its Tracker written; the next request's startMigration does not
// reset it, relying on relay.reset (migration.empty) having done so.
// Fails when a path between them writes the Tracker again, or empty
// stops resetting it.
func TestStartMigrationFindsTrackerReset(t *testing.T) {
	r, err := New(DefaultConfig(), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	rel := testRelay(r, relayBufSize)
	for stream := range 2 {
		rel.scan.Stream = true
		rel.startMigration()
		tr := &rel.mig.track
		if !rel.mig.on {
			t.Fatalf("stream %d not tracked", stream)
		}
		if tr.Strip || tr.Done || tr.Finished || len(tr.Text) != 0 || len(tr.OutIDs) != 0 || len(tr.ID) != 0 || tr.TextChunks != 0 || tr.HasPrompt {
			t.Fatalf("stream %d: startMigration found the last stream's tracker (strip %v, done %v, text %q)", stream, tr.Strip, tr.Done, tr.Text)
		}
		tr.Strip = true
		rel.pump.transform, rel.pump.lead = rel.trackedEvent, rel.trackLead()
		rel.att.src = &eofReader{data: simStreamIDs(t), size: 1 << 20}
		if _, err := rel.WriteTo(&countWriter{}); err != nil {
			t.Fatal(err)
		}
		if !tr.Done || len(tr.Text) == 0 || len(tr.OutIDs) == 0 || !tr.HasPrompt {
			t.Fatalf("stream %d not read by the tracker (done %v, text %q, %d ids)", stream, tr.Done, tr.Text, len(tr.OutIDs))
		}
		rel.reset()
		rel.r, rel.route, rel.dialect, rel.status = r, RouteChatCompletions, r.dialects[RouteChatCompletions], 200
		rel.att = attempt{rel: rel, status: 200}
	}
}

// TestResetEmptiesAStreamsMigrationOnly: relay.reset empties the
// migration of a request that asked for a stream, tracked or not (a break
// notes its worker either way), and leaves a unary request's as it is: a
// unary request never writes it (askIDs does not read it either), so its
// cache line is not touched. Fails when reset keys the emptying on
// mig.on, or when askIDs asks a unary request's worker for token ids.
func TestResetEmptiesAStreamsMigrationOnly(t *testing.T) {
	r, err := New(DefaultConfig(), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	rel := testRelay(r, relayBufSize)
	broken := &Worker{}
	rel.scan.Stream = true // a stream that was not tracked, then broke
	rel.mig.broken, rel.mig.drained = broken, true
	rel.reset()
	if rel.mig.broken != nil || rel.mig.drained {
		t.Fatalf("a streamed request's break outlived reset: broken %v, drained %v", rel.mig.broken, rel.mig.drained)
	}

	rel.scan.Stream = false // a unary request on a relay whose migration is on
	rel.mig.on = true
	broken.rec.Store(&discovery.Record{Engine: discovery.EngineVLLM}) // an engine asked for ids when tracked
	rel.att.ticket.Worker = broken
	body := []byte(`{"model":"m","messages":[]}`)
	if got := rel.askIDs(&rel.att, body); &got[0] != &body[0] {
		t.Fatalf("a unary request's body was rewritten: %s", got)
	}
	rel.reset()
	if !rel.mig.on {
		t.Fatal("reset emptied a unary request's migration: it wrote a line the request never touched")
	}
}

// simStreamIDs is a 16-token chat stream as `infera sim` writes it with
// return_token_ids.
func simStreamIDs(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../continuation/testdata/sim-chat-ids.sse")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMigrationEmpty: relay.reset empties a pooled relay's migration in
// place; every field but the kept buffers is zero after it. A new field
// fails here until empty clears it and this test sets it.
func TestMigrationEmpty(t *testing.T) {
	m := &migration{on: true, count: 3, reshape: true, broken: &Worker{}, drained: true,
		askBuf: make([]byte, 5, 64), scratch: make([]byte, 7, 32)}
	m.track.Strip, m.track.Done = true, true
	m.track.Text = append(m.track.Text, "hello"...)
	v := reflect.ValueOf(m).Elem()
	if n := v.NumField(); n != 8 {
		t.Fatalf("migration has %d fields, this test and migration.empty know 8", n)
	}
	m.empty()
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		switch name {
		case "askBuf", "scratch":
			if f.Len() != 0 || f.Cap() == 0 {
				t.Errorf("%s: len %d cap %d, want emptied and kept", name, f.Len(), f.Cap())
			}
		case "track":
			if m.track.Strip || m.track.Done || len(m.track.Text) != 0 || cap(m.track.Text) == 0 {
				t.Errorf("track not reset with its buffers kept: %+v", m.track)
			}
		default:
			if !f.IsZero() {
				t.Errorf("%s not cleared", name)
			}
		}
	}
}

// BenchmarkRelayReset: the per-request reset of a pooled relay.
func BenchmarkRelayReset(b *testing.B) {
	rel := relayPool.Get().(*relay)
	b.ReportAllocs()
	for b.Loop() {
		rel.reset()
	}
}

// TestRelayOwnResponse: a pooled relay's relayed attempt takes the relay's
// own response (relayBlock) while it is free, and any other (a second
// one, a prefill leg's) fasthttp's pooled one; released, the own one is
// empty and free again. Fails if a response still out is handed again, if
// reset forgets one out, or if a prefill leg takes the relayed attempt's.
func TestRelayOwnResponse(t *testing.T) {
	rel := relayPool.Get().(*relay)
	own := rel.uresp
	a := &rel.att
	a.rel = rel
	got := a.acquireResponse()
	if got != own {
		t.Fatal("the relayed attempt did not take the relay's own response")
	}
	if second := a.acquireResponse(); second == own {
		t.Fatal("the own response was handed twice while out")
	} else {
		rel.releaseResponse(second)
	}
	rel.reset()
	rel.att.rel = rel // as acquireRelay sets it
	if again := rel.att.acquireResponse(); again == own {
		t.Fatal("reset forgot that the own response is out")
	} else {
		rel.releaseResponse(again)
	}
	got.SetStatusCode(502)
	got.SetBody(make([]byte, 1000))
	rel.releaseResponse(got)
	if got.StatusCode() != 200 || len(got.Body()) != 0 {
		t.Fatalf("released own response: status %d, body %d bytes; want emptied", got.StatusCode(), len(got.Body()))
	}
	pre := &attempt{rel: rel}
	if p := pre.acquireResponse(); p == own {
		t.Fatal("a prefill leg took the relayed attempt's response")
	} else {
		rel.releaseResponse(p)
	}
	if got = a.acquireResponse(); got != own {
		t.Fatal("the own response was not free again")
	}
	rel.releaseResponse(got)
	rel.reset()
	relayPool.Put(rel)
}
