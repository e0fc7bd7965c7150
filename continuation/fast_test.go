package continuation_test

import (
	"bytes"
	"slices"
	"strconv"
	"testing"

	"github.com/infera/infera/continuation"
	"github.com/infera/infera/openai"
)

// trackerState is what a tracker remembers of a stream, for comparing the
// fast path with the full read.
func trackerState(t *testing.T, tr *continuation.Tracker) string {
	t.Helper()
	prompt, err := tr.PromptIDs(nil)
	var b bytes.Buffer
	b.WriteString("text=" + strconv.Quote(string(tr.Text)))
	b.WriteString(" out=" + strconv.Quote(string(slices.AppendSeq([]byte(nil), func(yield func(byte) bool) {
		for _, id := range tr.OutIDs {
			for _, c := range strconv.FormatUint(uint64(id), 10) + "," {
				if !yield(byte(c)) {
					return
				}
			}
		}
	}))))
	b.WriteString(" prompt=" + strconv.FormatBool(tr.HasPrompt) + strconv.Itoa(len(prompt)) + strconv.FormatBool(err == nil))
	b.WriteString(" chunks=" + strconv.Itoa(tr.TextChunks) + "/" + strconv.Itoa(tr.IDChunks))
	b.WriteString(" fin=" + strconv.FormatBool(tr.Finished) + strconv.FormatBool(tr.Done) + strconv.FormatBool(tr.ToolsOrReasoning))
	b.WriteString(" poison=" + tr.Poisoned.String())
	b.WriteString(" id=" + string(tr.ID) + " created=" + string(tr.Created) + " model=" + string(tr.Model))
	return b.String()
}

// observeBoth feeds the same events to a tracker with its fast path and to
// one without, and fails at the first difference in what the client gets
// or in what the trackers remember.
func observeBoth(t *testing.T, strip bool, events ...[]byte) (fast *continuation.Tracker) {
	t.Helper()
	// a and b read payloads (Observe), c and d whole SSE events, e appends
	// them (AppendEvent), f finds them in the relay's buffer (AppendNext,
	// the next event after them) and writes over it, as the relay does.
	// A nil event starts another stream on the same trackers.
	var a, b, c, d, e, f continuation.Tracker
	all := []*continuation.Tracker{&a, &b, &c, &d, &e, &f}
	for _, tr := range all {
		tr.Reset(strip)
	}
	continuation.DisableFast(&b)
	continuation.DisableFast(&d)
	for i, ev := range events {
		if ev == nil {
			for _, tr := range all {
				tr.Reset(strip)
			}
			continue
		}
		ga := append([]byte(nil), a.Observe(ev)...)
		gb := b.Observe(ev)
		if !bytes.Equal(ga, gb) {
			t.Fatalf("event %d %q: fast path gave %q, full read %q", i, ev, ga, gb)
		}
		if sa, sb := trackerState(t, &a), trackerState(t, &b); sa != sb {
			t.Fatalf("event %d %q: fast path state %s, full read %s", i, ev, sa, sb)
		}
		sse := append(append([]byte("data: "), ev...), "\n\n"...)
		gc := append([]byte(nil), c.ObserveEvent(sse)...)
		gd := d.ObserveEvent(sse)
		if !bytes.Equal(gc, gd) {
			t.Fatalf("event %d %q: fast path gave %q, full read %q", i, sse, gc, gd)
		}
		if sc, sd := trackerState(t, &c), trackerState(t, &d); sc != sd {
			t.Fatalf("event %d %q: fast path state %s, full read %s", i, sse, sc, sd)
		}
		if ge := e.AppendEvent([]byte("x"), sse); string(ge) != "x"+string(gd) {
			t.Fatalf("event %d %q: AppendEvent gave %q, full read %q", i, sse, ge, gd)
		} else if len(ge)-1 > len(sse) {
			// The relay writes the copy over the bytes it read.
			t.Fatalf("event %d %q: AppendEvent's copy %q is longer", i, sse, ge)
		}
		if se, sd := trackerState(t, &e), trackerState(t, &d); se != sd {
			t.Fatalf("event %d %q: AppendEvent state %s, full read %s", i, sse, se, sd)
		}
		// The relay's buffer: what went out already ("x"), this event and
		// the next (or a line that is not an event's end).
		buf := append([]byte("x"), sse...)
		if i+1 < len(events) && events[i+1] != nil {
			buf = append(append(append(buf, "data: "...), events[i+1]...), "\n\n"...)
		} else {
			buf = append(buf, "\ndata: x"...)
		}
		k := openai.NextEvent(buf[1:])
		gf, n := f.AppendNext(buf[:1], buf[1:])
		if n == 0 {
			gf = f.AppendEvent(buf[:1], buf[1:1+len(sse)])
		} else if n != len(sse) || n != k {
			t.Fatalf("event %d %q: AppendNext took %d bytes of %q, the event is %d", i, sse, n, buf[1:], k)
		}
		if string(gf) != "x"+string(gd) {
			t.Fatalf("event %d %q: AppendNext over the read bytes gave %q, full read %q", i, sse, gf, gd)
		}
		if sf, sd := trackerState(t, &f), trackerState(t, &d); sf != sd {
			t.Fatalf("event %d %q: AppendNext state %s, full read %s", i, sse, sf, sd)
		}
		// A break here continues the same way (exact and text paths,
		// chat and completions clients).
		for _, o := range []continuation.Options{{Chat: true, Engine: continuation.EngineVLLM}, {Engine: continuation.EngineSGLang}} {
			body := `{"model":"m","max_tokens":50,"prompt":"p"}`
			if o.Chat {
				body = `{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"x"}]}`
			}
			cf, errf := continuation.Build([]byte(body), &f, o)
			cd, errd := continuation.Build([]byte(body), &d, o)
			if (errf == nil) != (errd == nil) || string(cf.Body) != string(cd.Body) || cf.Path != cd.Path || cf.Exact != cd.Exact || cf.Produced != cd.Produced {
				t.Fatalf("event %d %q: a break continues with %q (%v), the full read's with %q (%v)", i, sse, cf.Body, errf, cd.Body, errd)
			}
		}
	}
	return &a
}

// vllmChunk is a chat chunk as vLLM writes it with return_token_ids.
func vllmChunk(text string, id int) []byte {
	return []byte(`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"content":` +
		strconv.Quote(text) + `},"logprobs":null,"finish_reason":null,"token_ids":[` + strconv.Itoa(id) + `]}]}`)
}

// TestFastPathReadsSteadyChunks: after the first chunks, a vLLM stream's
// chunks are read through the fast path, and the client's copies and
// the tracker's state are those of the full read.
func TestFastPathReadsSteadyChunks(t *testing.T) {
	first := []byte(`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3,4]}`)
	events := [][]byte{first}
	for i := range 16 {
		events = append(events, vllmChunk("tok"+strconv.Itoa(i)+" \u00e9\"\\", 1000+i))
	}
	events = append(events, []byte(`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[33]}]}`))
	for _, strip := range []bool{true, false} {
		tr := observeBoth(t, strip, events...)
		if n := continuation.FastChunks(tr); n != 15 {
			t.Errorf("strip %v: %d of 18 chunks through the fast path, want 15 (all but the first, the one that taught the layout and the last)", strip, n)
		}
		if strip {
			if got := tr.Observe(vllmChunk("x", 7)); bytes.Contains(got, []byte("token_ids")) || !bytes.Contains(got, []byte(`"finish_reason":null}]}`)) {
				t.Errorf("stripped chunk %s", got)
			}
		}
	}
}

// vllmStream is a vLLM chat stream with token ids: a first chunk with
// three prompt ids (the first from created), n steady chunks and a last
// one that finishes with finish.
func vllmStream(id string, created, n int, finish string) [][]byte {
	head := `{"id":"` + id + `","object":"chat.completion.chunk","created":` + strconv.Itoa(created) + `,"model":"m","choices":[{"index":0,`
	evs := [][]byte{[]byte(head + `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[` + strconv.Itoa(created%97) + `,2,3]}`)}
	for i := range n {
		evs = append(evs, []byte(head+`"delta":{"content":"t`+strconv.Itoa(i)+`"},"logprobs":null,"finish_reason":null,"token_ids":[`+strconv.Itoa(100+i)+`]}]}`))
	}
	return append(evs, []byte(head+`"delta":{"content":"!"},"logprobs":null,"finish_reason":"`+finish+`","stop_reason":null,"token_ids":[33]}]}`))
}

// TestFastPathTriesFollowers: once a tracker knows an engine's layouts,
// each chunk of a stream is tried against the layout that follows the
// last one matched: the first chunk's, then the steady one (not the
// first chunk's again), which stays; only the last chunk tries two (the
// steady one fails on its finish reason).
func TestFastPathTriesFollowers(t *testing.T) {
	const steady = 7
	for _, strip := range []bool{true, false} {
		events := vllmStream("chatcmpl-a1", 1730000000, steady, "length")
		events = append(events, nil)
		events = append(events, vllmStream("chatcmpl-b2", 1730000001, steady, "stop")...)
		events = append(events, nil)
		events = append(events, vllmStream("chatcmpl-c3", 1730000002, steady, "length")...)
		tr := observeBoth(t, strip, events...)
		if n := continuation.FastChunks(tr); n != steady+2 {
			t.Fatalf("strip %v: %d of the third stream's %d chunks through the fast path, want all", strip, n, steady+2)
		}
		if n := continuation.Tries(tr); n != 1+steady+2 {
			t.Errorf("strip %v: the third stream's %d chunks tried %d layouts, want %d (one each, two for the last)", strip, steady+2, n, 1+steady+2)
		}
	}
}

// TestFastPathAcrossStreams: the layouts a tracker learnt outlive the
// stream: the next stream from the same engine — another id, another
// time, another prompt and finish reason — is read through them from its
// first chunk to its last, with the client's copies and the state of the
// full read. Its first chunk moves the other layouts to the new id and
// time: one rebase a stream, not one a layout.
func TestFastPathAcrossStreams(t *testing.T) {
	stream := vllmStream
	// The second stream's id longer than the first's (its layouts are
	// copied), and as long (stamped over in place).
	for _, c := range []struct {
		strip bool
		id    string
	}{{true, "chatcmpl-b22"}, {false, "chatcmpl-b22"}, {true, "chatcmpl-b2"}, {false, "chatcmpl-b2"}} {
		strip := c.strip
		events := stream("chatcmpl-a1", 1730000000, 6, "length")
		events = append(events, nil)
		events = append(events, stream(c.id, 1730000099, 9, "stop")...)
		tr := observeBoth(t, strip, events...)
		if n := continuation.FastChunks(tr); n != 11 {
			t.Errorf("strip %v: %d of the second stream's 11 chunks through the fast path, want all", strip, n)
		}
		if r, s := continuation.Rebases(tr), continuation.Restamps(tr); r != 1 || s != 2 {
			t.Errorf("strip %v: second stream: %d rebases, %d restamps; want 1 (its first chunk's layout) and 2 (the steady and the last chunk's)", strip, r, s)
		}
		// The steady and the last chunk's layouts, copied with a longer id,
		// are still read in a straight line: one layout tried a chunk, two
		// for the first (the last chunk's, which no stream followed yet)
		// and the last (the steady one fails on its finish reason).
		if n := continuation.Tries(tr); n != 2+9+2 {
			t.Errorf("strip %v: the second stream's 11 chunks tried %d layouts, want %d", strip, n, 2+9+2)
		}
		if string(tr.ID) != `"`+c.id+`"` || string(tr.Created) != "1730000099" || !tr.Finished || string(tr.Text) != "t0t1t2t3t4t5t6t7t8!" {
			t.Errorf("strip %v: second stream read as id %s created %s finished %v text %q", strip, tr.ID, tr.Created, tr.Finished, tr.Text)
		}
		if p, err := tr.PromptIDs(nil); err != nil || len(p) != 3 || p[0] != 1730000099%97 {
			t.Errorf("strip %v: prompt ids %v, %v", strip, p, err)
		}
	}
}

// TestLayoutPoolLends: trackers given a LayoutPool hold no layouts between
// streams: Reset gives the set back and a stream's first chunk takes one,
// most often the one another tracker just gave back, so that a tracker's
// first stream is read through layouts it never learnt, from its first
// chunk to its last. Every stream is read as the full read reads it.
func TestLayoutPoolLends(t *testing.T) {
	var pool continuation.LayoutPool
	var trs [2]continuation.Tracker
	var ref continuation.Tracker
	continuation.DisableFast(&ref)
	wholeFast := 0 // streams read through the fast path from their first chunk
	for s := range 20 {
		tr := &trs[s%2]
		tr.Pool = &pool
		tr.Reset(true)
		ref.Reset(true)
		events := vllmStream("chatcmpl-"+strconv.Itoa(100+s), 1730000000+s, 5, "length")
		for i, ev := range events {
			got := append([]byte(nil), tr.Observe(ev)...)
			if want := ref.Observe(ev); !bytes.Equal(got, want) {
				t.Fatalf("stream %d event %d: %q, full read %q", s, i, got, want)
			}
			if sf, sr := trackerState(t, tr), trackerState(t, &ref); sf != sr {
				t.Fatalf("stream %d event %d: state %s, full read %s", s, i, sf, sr)
			}
		}
		if continuation.FastChunks(tr) == len(events) {
			wholeFast++
		}
		tr.Reset(true)
		if continuation.HoldsLayouts(tr) {
			t.Fatalf("stream %d: the tracker kept its layouts after Reset", s)
		}
	}
	// Under the race detector sync.Pool drops some of what it is given;
	// without lending no stream's first chunk finds a layout.
	if wholeFast == 0 {
		t.Errorf("no stream of 20 read through the fast path from its first chunk")
	}
	t.Logf("%d of 20 streams read through the fast path from their first chunk", wholeFast)
}

// TestFastPathLongPrompt: a layout keeps none of the prompt's ids, so
// the first chunk of a long prompt's stream (here 40 KB of ids, ten times
// what a layout may hold) is read through its layout from the next
// stream on.
func TestFastPathLongPrompt(t *testing.T) {
	ids := make([]byte, 0, 48<<10)
	for i := range 8000 {
		ids = strconv.AppendInt(append(ids, ','), int64(10000+i), 10)
	}
	first := func(id string) []byte {
		return []byte(`{"id":"` + id + `","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1` + string(ids) + `]}`)
	}
	for _, strip := range []bool{true, false} {
		tr := observeBoth(t, strip, first("chatcmpl-1"), vllmChunk("a", 1), nil, first("chatcmpl-22"), vllmChunk("b", 2))
		if n := continuation.FastChunks(tr); n != 2 {
			t.Errorf("strip %v: %d of the second stream's 2 chunks through the fast path, want both", strip, n)
		}
		if p, err := tr.PromptIDs(nil); err != nil || len(p) != 8001 || p[8000] != 17999 {
			t.Errorf("strip %v: %d prompt ids (%v)", strip, len(p), err)
		}
	}
}

// TestFastPathNullFinish: a layout learnt from a chunk that did not
// finish holds its null finish reason as fixed bytes (one comparison with
// the bytes around it, not a hole): a chunk of that layout that finishes
// is read in full, and its own layout learnt from it reads the next.
func TestFastPathNullFinish(t *testing.T) {
	finishing := bytes.Replace(vllmChunk("b", 2), []byte(`"finish_reason":null`), []byte(`"finish_reason":"stop"`), 1)
	for _, strip := range []bool{true, false} {
		tr := observeBoth(t, strip, vllmChunk("a", 1), vllmChunk("a", 1), finishing)
		if n := continuation.FastChunks(tr); n != 1 {
			t.Errorf("strip %v: %d chunks through the fast path, want 1 (the second steady one)", strip, n)
		}
		tr = observeBoth(t, strip, vllmChunk("a", 1), finishing, vllmChunk("a", 1), finishing)
		if n := continuation.FastChunks(tr); n != 2 || !tr.Finished {
			t.Errorf("strip %v: %d chunks through the fast path (finished %v), want 2 (the second of each layout)", strip, n, tr.Finished)
		}
	}
}

// TestFastPathDeclines: chunks that differ from the layout outside its
// holes — another choice index, a finish reason that is neither null nor
// a string, another member, tool calls, an id array that is not one, a
// text that is not a string, an id or time of another type, bytes after
// the end — are read in full.
func TestFastPathDeclines(t *testing.T) {
	base := vllmChunk("a", 1)
	for _, c := range []string{
		`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":1,"delta":{"content":"b"},"logprobs":null,"finish_reason":null,"token_ids":[2]}]}`,
		`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":7,"token_ids":[2]}]}`,
		`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[2]}]}`,
		`{"id":7,"object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":null,"token_ids":[2]}]}`,
		`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":"1730000000","model":"m","choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":null,"token_ids":[2]}]}`,
		`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"content":null},"logprobs":null,"finish_reason":null,"token_ids":[2]}]}`,
		`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":null,"token_ids":[2.5]}]}`,
		`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":null,"token_ids":[4294967296]}]}`,
		`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"content":"b\x01"},"logprobs":null,"finish_reason":null,"token_ids":[2]}]}`,
		`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":null,"token_ids":[2]}]}]`,
		`{"id":"chatcmpl-8c1f","object":"chat.completion.chunk","created":1730000000,"model":"m","choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":null,"token_ids":[2]}`,
	} {
		for _, strip := range []bool{true, false} {
			tr := observeBoth(t, strip, base, base, []byte(c), base)
			if n := continuation.FastChunks(tr); n != 2 {
				t.Errorf("%s: %d chunks through the fast path, want 2 (the 2nd and 4th)", c, n)
			}
		}
	}
}

// TestObserveSteadyAllocs: reading a stream's steady chunks allocates
// nothing once the tracker's buffers have grown.
func TestObserveSteadyAllocs(t *testing.T) {
	var tr continuation.Tracker
	tr.Reset(true)
	ev := append(append([]byte("data: "), vllmChunk("token", 1234)...), "\n\n"...)
	for range 3 {
		tr.ObserveEvent(ev)
	}
	if n := testing.AllocsPerRun(1000, func() {
		if len(tr.OutIDs) > 1<<12 {
			tr.Reset(true)
		}
		tr.ObserveEvent(ev)
	}); n != 0 {
		t.Fatalf("%v allocations per chunk", n)
	}
}

// FuzzFastAgrees: whatever two chunks an engine sends, in any order, the
// fast path gives the client the same bytes and the tracker the same state
// as reading every chunk in full.
func FuzzFastAgrees(f *testing.F) {
	for _, p := range [][2]string{
		{string(vllmChunk("a", 1)), string(vllmChunk("bc\\n", 22))},
		{`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"x","logprobs":null,"finish_reason":null,"token_ids":[5]}]}`,
			`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"yz","logprobs":null,"finish_reason":null,"token_ids":[6,7]}]}`},
		{`{"id":"s","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":null}],"sglext":{"completion_token_ids":[[5]]}}`,
			`{"id":"s","object":"text_completion","choices":[{"index":0,"text":"\u00e9","finish_reason":null}],"sglext":{"completion_token_ids":[[9,8]]}}`},
		{`{"choices":[{"token_ids":[1],"index":0,"delta":{"content":"a"}}]}`, `{"choices":[{"token_ids":[],"index":0,"delta":{"content":""}}]}`},
		{`{"choices":[{"index":0,"delta":{"content":"a"}}]}`, `{"choices":[{"index":0,"delta":{"content":"b","tool_calls":[{"index":1}]}}]}`},
		// Two streams' chunks of one layout (id, time, model differ) and a
		// first and a last chunk.
		{string(vllmChunk("a", 1)), `{"id":"chatcmpl-9","object":"chat.completion.chunk","created":17,"model":"m2","choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":null,"token_ids":[2]}]}`},
		{`{"id":"c-1","created":5,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"prompt_token_ids":[1,2]}`,
			`{"id":"c-22","created":6,"model":"m","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop","stop_reason":null,"token_ids":[9]}]}`},
	} {
		f.Add([]byte(p[0]), []byte(p[1]), true)
		f.Add([]byte(p[0]), []byte(p[1]), false)
	}
	f.Fuzz(func(t *testing.T, a, b []byte, strip bool) {
		// A third stream: the chunks with another id and time where they
		// have them, read through layouts moved to them by the first.
		other := func(c []byte) []byte {
			c = bytes.ReplaceAll(c, []byte(`"id":"`), []byte(`"id":"z`))
			return bytes.ReplaceAll(c, []byte(`"created":`), []byte(`"created":9`))
		}
		// A fourth: another id and time of the same lengths (the layouts
		// are stamped over in place).
		sameLength := func(c []byte) []byte {
			c = bytes.Clone(c)
			for _, key := range []string{`"id":"`, `"created":`} {
				if i := bytes.Index(c, []byte(key)); i >= 0 && i+len(key) < len(c) {
					switch j := i + len(key); c[j] {
					case '"', '\\':
					case '9':
						c[j] = '8'
					case 'y':
						c[j] = 'x'
					default:
						if c[j] >= '0' && c[j] < '9' {
							c[j]++
						} else {
							c[j] = 'y'
						}
					}
				}
			}
			return c
		}
		observeBoth(t, strip, a, a, b, a, b, b, nil, b, a, a, b, nil, other(a), other(b), other(a), other(b),
			nil, sameLength(a), sameLength(b), sameLength(a), sameLength(b))
	})
}
