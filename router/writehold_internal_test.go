package router

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/infera/infera/internal/epoll"
	"github.com/infera/infera/internal/testkit"
)

// recordConn records the writes made to it (a connection's socket end for
// frontConn); its other methods are net.Conn's zero value and unused here.
type recordConn struct {
	net.Conn
	writes []string
	err    error
}

func (c *recordConn) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	c.writes = append(c.writes, string(p))
	return len(p), nil
}

// mustWrite writes s to fc, failing the test unless all of it went.
func mustWrite(t *testing.T, fc *frontConn, s string) {
	t.Helper()
	if n, err := fc.Write([]byte(s)); n != len(s) || err != nil {
		t.Fatalf("Write(%q) = %d, %v", s, n, err)
	}
}

func TestFrontConnHoldsWritesForTheNext(t *testing.T) {
	rc := &recordConn{}
	fc := &frontConn{Conn: rc}
	write := func(s string) { t.Helper(); mustWrite(t, fc, s) }
	write("a")
	fc.holdWrites()
	write("headers+events")
	write("more")
	if len(rc.writes) != 1 {
		t.Fatalf("held writes reached the socket: %q", rc.writes)
	}
	fc.releaseHold()
	write("0\r\n\r\n")
	write("next")
	want := []string{"a", "headers+eventsmore0\r\n\r\n", "next"}
	if len(rc.writes) != len(want) {
		t.Fatalf("writes %q, want %q", rc.writes, want)
	}
	for i := range want {
		if rc.writes[i] != want[i] {
			t.Fatalf("writes %q, want %q", rc.writes, want)
		}
	}
	if fc.hold.buf != nil || fc.hold.on {
		t.Fatal("the hold outlived its release")
	}

	// A failed release reports none of the flushed bytes written.
	rc.err = errors.New("broken pipe")
	fc.holdWrites()
	write("last events")
	fc.releaseHold()
	if n, err := fc.Write([]byte("0\r\n\r\n")); n != 0 || !errors.Is(err, rc.err) {
		t.Fatalf("failed release: %d, %v", n, err)
	}
}

// bufferedChunks serves its chunks one per Read and says how many bytes it
// still holds, as an upstream exchange does when the engine's bytes are
// already read off its connection; with end, the stream's end is held too
// (the chunked body's last chunk, 0\r\n\r\n), until a Read returns io.EOF.
type bufferedChunks struct {
	chunks [][]byte
	end    bool
}

func (b *bufferedChunks) Read(p []byte) (int, error) {
	if len(b.chunks) == 0 {
		b.end = false
		return 0, io.EOF
	}
	n := copy(p, b.chunks[0])
	if b.chunks[0] = b.chunks[0][n:]; len(b.chunks[0]) == 0 {
		b.chunks = b.chunks[1:]
	}
	return n, nil
}

func (b *bufferedChunks) Buffered() int {
	n := 0
	if b.end {
		n = len("0\r\n\r\n")
	}
	for _, c := range b.chunks {
		n += len(c)
	}
	return n
}

type endNote struct {
	at     []int // the write count when atEnd came
	writes *[]string
}

func (e *endNote) atEnd() { e.at = append(e.at, len(*e.writes)) }

// TestEventPumpReadsWhatIsBuffered: the events the source already holds
// leave in one write, and the end of the stream read with them is told
// before that write (the relay then holds it for the closing chunk).
func TestEventPumpReadsWhatIsBuffered(t *testing.T) {
	evs := []string{"data: a\n\n", "data: b\n\nda", "ta: c\n\n", "data: [DONE]\n\n"}
	src := &bufferedChunks{end: true}
	for _, e := range evs {
		src.chunks = append(src.chunks, []byte(e))
	}
	var writes []string
	note := &endNote{writes: &writes}
	p := eventPump{buf: make([]byte, 64), end: note}
	w := writerFunc(func(b []byte) (int, error) {
		writes = append(writes, string(b))
		return len(b), nil
	})
	_, rerr, werr := p.step(w, src)
	if werr != nil || rerr != io.EOF {
		t.Fatalf("step: read %v, write %v; want io.EOF, nil", rerr, werr)
	}
	all := "data: a\n\ndata: b\n\ndata: c\n\ndata: [DONE]\n\n"
	if len(writes) != 1 || writes[0] != all {
		t.Fatalf("writes %q, want the whole stream in one", writes)
	}
	if len(note.at) != 1 || note.at[0] != 0 {
		t.Fatalf("atEnd at writes %v, want once before the first", note.at)
	}

	// A source that holds nothing more is written as it reads, and a
	// read that does not meet the end says nothing of it.
	src.chunks = [][]byte{[]byte("data: x\n\n")}
	writes, note.at = nil, nil
	p.step(w, readerOnly{src})
	if len(writes) != 1 || len(note.at) != 0 {
		t.Fatalf("plain source: writes %q, atEnd %v", writes, note.at)
	}

	// The buffer bounds what one step reads.
	src.chunks = [][]byte{bytes.Repeat([]byte("data: yy\n\n"), 10)}
	writes = nil
	p.step(w, src)
	if len(writes) != 1 || len(writes[0]) != 60 {
		t.Fatalf("full buffer: writes %q, want the 6 events that fit 64 bytes", writes)
	}
}

// readerOnly hides a source's Buffered.
type readerOnly struct{ io.Reader }

type endCount struct{ n int }

func (e *endCount) atEnd() { e.n++ }

// FuzzEventPump: whatever the engine sends and however it arrives (read
// sizes, bytes already buffered or not), the pump relays it byte for
// byte, and says at most once that the end came with the events it
// writes (never when the end came in a read of its own).
func FuzzEventPump(f *testing.F) {
	f.Add([]byte("data: a\n\ndata: b\r\n\r\n: comment\n\nevent: x\rdata: c\r\rdata: [DONE]\n\ntrailing"), uint8(3), true)
	f.Add([]byte("data: "+string(bytes.Repeat([]byte("x"), 200))+"\n\ndata: y\n\n"), uint8(10), true)
	f.Add([]byte("data: a\n\n"), uint8(0), false)
	f.Fuzz(func(t *testing.T, stream []byte, size uint8, buffered bool) {
		n := int(size)%40 + 1
		bc := &bufferedChunks{end: true}
		for rest := stream; len(rest) > 0; {
			k := min(n, len(rest))
			bc.chunks = append(bc.chunks, rest[:k])
			rest = rest[k:]
		}
		var src io.Reader = bc
		if !buffered {
			src = readerOnly{bc}
		}
		var out bytes.Buffer
		ends := &endCount{}
		p := eventPump{buf: make([]byte, 64), end: ends}
		out.Write(pumpToEOF(t, &p, &out, src, len(stream)+2))
		if !bytes.Equal(out.Bytes(), stream) {
			t.Fatalf("relayed %q, want %q", out.Bytes(), stream)
		}
		if ends.n > 1 || !buffered && ends.n != 0 {
			t.Fatalf("atEnd told %d times (buffered source: %v)", ends.n, buffered)
		}
	})
}

// sendEnd sends what is held with the closing chunk at once; fasthttp's own
// closing chunk after it is dropped, in whatever pieces it comes, and what
// follows it (the next answer) goes out; anything else there is an error.
func TestFrontConnSendEnd(t *testing.T) {
	rc := &recordConn{}
	fc := &frontConn{Conn: rc}
	write := func(s string) { t.Helper(); mustWrite(t, fc, s) }
	fc.holdWrites()
	write("headers")
	write("last events")
	if len(rc.writes) != 0 {
		t.Fatalf("held writes reached the socket: %q", rc.writes)
	}
	if err := fc.sendEnd(); err != nil {
		t.Fatal(err)
	}
	if want := "headerslast events0\r\n\r\n"; len(rc.writes) != 1 || rc.writes[0] != want {
		t.Fatalf("writes %q, want [%q]", rc.writes, want)
	}
	if fc.hold.buf != nil || fc.hold.on {
		t.Fatal("the hold outlived sendEnd")
	}
	write("0\r\n") // fasthttp's closing chunk, dropped ...
	write("\r\nHTTP/1.1 200 OK\r\n\r\nnext")
	if want := []string{"headerslast events0\r\n\r\n", "HTTP/1.1 200 OK\r\n\r\nnext"}; len(rc.writes) != 2 || rc.writes[1] != want[1] {
		t.Fatalf("writes %q, want %q", rc.writes, want)
	}
	write("after") // ... once
	if len(rc.writes) != 3 || rc.writes[2] != "after" {
		t.Fatalf("writes %q", rc.writes)
	}

	fc.holdWrites()
	write("events")
	if err := fc.sendEnd(); err != nil {
		t.Fatal(err)
	}
	if n, err := fc.Write([]byte("0\r\nTrailer: x\r\n\r\n")); !errors.Is(err, errEndMismatch) || n != 3 {
		t.Fatalf("a trailer after the end: %d, %v", n, err)
	}

	// A failed end is the write's error.
	rc.err = errors.New("broken pipe")
	fc.hold.endLeft = 0
	fc.holdWrites()
	write("events")
	if err := fc.sendEnd(); !errors.Is(err, rc.err) {
		t.Fatalf("failed end: %v", err)
	}
}

// countConn counts the writes made to it and discards them.
type countConn struct {
	net.Conn
	writes int
}

func (c *countConn) Write(p []byte) (int, error) { c.writes++; return len(p), nil }

// writeChunk frames each write as fasthttp does; headers held by holdHead
// leave with the first chunk, events held for the stream's end (holdWrites)
// with the closing chunk (sendEnd), nothing else waits; on the goroutine
// door's hold for the next read (ans.on) the first chunk and its headers are
// held there.
func TestFrontConnWriteChunk(t *testing.T) {
	rc := &recordConn{}
	fc := &frontConn{Conn: rc}
	w := (*chunkWriter)(fc)
	chunk := func(s string) {
		t.Helper()
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("chunk %q: %d, %v", s, n, err)
		}
	}
	fc.holdHead()
	mustWrite(t, fc, "headers\r\n\r\n") // fasthttp's ImmediateHeaderFlush
	chunk("")                           // (nothing: an empty chunk would end the body)
	if len(rc.writes) != 0 {
		t.Fatalf("held headers reached the socket: %q", rc.writes)
	}
	chunk("data: 1\n\n")
	chunk(string(make([]byte, 300)))
	fc.holdWrites() // the stream's end
	chunk("data: [DONE]\n\n")
	if err := fc.sendEnd(); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, fc, "0\r\n\r\n") // fasthttp's closing chunk, dropped
	want := []string{
		"headers\r\n\r\n9\r\ndata: 1\n\n\r\n",
		"12c\r\n" + string(make([]byte, 300)) + "\r\n",
		"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
	}
	if len(rc.writes) != len(want) {
		t.Fatalf("writes %q, want %q", rc.writes, want)
	}
	for i := range want {
		if rc.writes[i] != want[i] {
			t.Fatalf("writes %q, want %q", rc.writes, want)
		}
	}
	if fc.hold.buf != nil || fc.hold.on || fc.hold.head {
		t.Fatal("a hold outlived the stream")
	}

	// No chunk at all (a HEAD request): sendHead sends the headers.
	rc.writes = nil
	fc.holdHead()
	mustWrite(t, fc, "headers\r\n\r\n")
	if err := fc.sendHead(); err != nil || len(rc.writes) != 1 || rc.writes[0] != "headers\r\n\r\n" {
		t.Fatalf("sendHead: %v, writes %q", err, rc.writes)
	}
	if err := fc.sendHead(); err != nil || len(rc.writes) != 1 {
		t.Fatalf("a second sendHead wrote: %v, %q", err, rc.writes)
	}

	// The goroutine door holding the end for the next read: headers and
	// events go to its hold, not the socket.
	rc.writes = nil
	fc.ans.on = true
	fc.ans.pending.Store(false)
	fc.holdHead()
	mustWrite(t, fc, "headers\r\n\r\n")
	if fc.ans.h.Ready() {
		t.Fatal("a recordConn has no socket to hold for")
	}
	chunk("data: 1\n\n") // (no socket: Hold refuses, written at once)
	if len(rc.writes) != 1 || rc.writes[0] != "headers\r\n\r\n9\r\ndata: 1\n\n\r\n" {
		t.Fatalf("writes %q", rc.writes)
	}
}

// On the goroutine door's hold for the next read (ans.on, a socket
// beneath), writeChunk frames each chunk straight into the held answer
// (heldChunk), after the headers held by holdHead: the held bytes are
// fasthttp's, in order. A chunk too large to hold goes its usual way, what
// was held first.
func TestFrontConnHeldChunk(t *testing.T) {
	a, b := testkit.TCPPair(t)
	fc := &frontConn{Conn: &lfGuardConn{Conn: a, checked: true}}
	if fc.socket() == nil {
		t.Fatal("no socket beneath a TCP connection")
	}
	w := (*chunkWriter)(fc)
	chunk := func(s string) {
		t.Helper()
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("chunk: %d, %v", n, err)
		}
	}
	fc.ans.on = true
	fc.holdHead()
	mustWrite(t, fc, "headers\r\n\r\n")
	chunk("data: 1\n\n")
	chunk(strings.Repeat("x", 300))
	mustWrite(t, fc, lastChunk) // fasthttp's closing chunk, held after them
	if fc.hold.buf != nil || fc.hold.on || fc.hold.head || !fc.ans.pending.Load() {
		t.Fatalf("hold %+v, pending %v", fc.hold, fc.ans.pending.Load())
	}
	want := "headers\r\n\r\n9\r\ndata: 1\n\n\r\n12c\r\n" + strings.Repeat("x", 300) + "\r\n" + lastChunk
	if got := string(fc.ans.h.Take()); got != want {
		t.Fatalf("held %q, want %q", got, want)
	}

	// Too large to hold: the headers and the first chunk, held, go first.
	fc.ans.pending.Store(false)
	fc.holdHead()
	mustWrite(t, fc, "headers\r\n\r\n")
	chunk("data: 1\n\n")
	big := strings.Repeat("y", epoll.MaxHeld)
	want = "headers\r\n\r\n9\r\ndata: 1\n\n\r\n10000\r\n" + big + "\r\n"
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, len(want))
		n, _ := io.ReadFull(b, buf)
		got <- string(buf[:n])
	}()
	chunk(big)
	if s := <-got; s != want {
		t.Fatalf("peer read %d bytes, want %d (%.40q)", len(s), len(want), s)
	}
	if fc.ans.on || fc.ans.pending.Load() || fc.ans.h.Holding() {
		t.Fatal("an answer still held after a chunk too large to hold")
	}
}

// appendHexLen writes what strconv.AppendUint(b, n, 16) writes, every
// digit count and digit included.
func TestAppendHexLen(t *testing.T) {
	ns := []uint64{0, 1, 9, 10, 15, 16, 0x12c, 0xabcdef, 0x0123_4567, 0x89ab_cdef, 0xffff_ffff, 1 << 32, 0xfedc_ba98_7654_3210}
	for sh := range 64 {
		ns = append(ns, 1<<sh, 1<<sh-1)
	}
	for _, n := range ns {
		got := string(appendHexLen([]byte("x"), n))
		if want := string(strconv.AppendUint([]byte("x"), n, 16)); got != want {
			t.Fatalf("%#x: %q, want %q", n, got, want)
		}
	}
}

// TestFrontConnWriteChunkAllocs: a stream's chunks, its held headers and
// end cost no allocation.
func TestFrontConnWriteChunkAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	cc := &countConn{}
	fc := &frontConn{Conn: cc}
	w := (*chunkWriter)(fc)
	head := []byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
	ev := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n")
	end := []byte(lastChunk)
	run := func() {
		fc.holdHead()
		_, _ = fc.Write(head)
		for range 16 {
			_, _ = w.Write(ev)
		}
		fc.holdWrites()
		_, _ = w.Write(ev)
		_ = fc.sendEnd()
		_, _ = fc.Write(end)
	}
	run()
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("a stream's chunk writes allocate %.1f times, want 0", n)
	}
	if cc.writes != 102*17 {
		t.Fatalf("%d writes for 102 streams of 17 chunks, want %d", cc.writes, 102*17)
	}
}
