package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/valyala/fasthttp"
)

const chunkedHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

// chunkedRead is what one reader made of a chunked body: its data, how
// the body ended, its trailer section and the bytes left after it.
type chunkedRead struct {
	data    string
	end     string
	trailer string
	rest    string
}

// endClass names how a body read ended, as the relay tells endings
// apart: the body's end, a cut inside a chunk's data (a truncated answer,
// io.ErrUnexpectedEOF) or broken framing.
func endClass(err error) string {
	switch {
	case err == nil || err == io.EOF:
		return "end"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "cut"
	}
	return "broken"
}

// readWithFasthttp reads body, the bytes after chunkedHead, through
// fasthttp's own streamed body.
func readWithFasthttp(body []byte) chunkedRead {
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	resp.StreamBody = true
	br := bufio.NewReader(io.MultiReader(strings.NewReader(chunkedHead), bytes.NewReader(body)))
	if err := resp.ReadLimitBody(br, 0); err != nil {
		return chunkedRead{end: "head: " + err.Error()}
	}
	data, err := io.ReadAll(resp.BodyStream())
	return finishRead(data, err, &resp.Header, br)
}

// readWithExchange reads the same bytes through the exchange's own
// reading of an answer (readAnswer, chunkedBody), from src.
func readWithExchange(t testing.TB, src io.Reader, size int) chunkedRead {
	_, resp, br, failed := streamAnswer(t, src, size)
	defer fasthttp.ReleaseResponse(resp)
	if failed != nil {
		return *failed
	}
	data, err := io.ReadAll(resp.BodyStream())
	return finishRead(data, err, &resp.Header, br)
}

// streamAnswer reads chunkedHead and then src's bytes, through a reader of
// size bytes, as the exchange reads a streamed answer: up to its body,
// which x reads with its chunkedBody. failed: the head could not be read.
// resp is the caller's to release.
func streamAnswer(t testing.TB, src io.Reader, size int) (x *Exchange, resp *fasthttp.Response, br *bufio.Reader, failed *chunkedRead) {
	x = new(Exchange)
	resp = fasthttp.AcquireResponse()
	resp.StreamBody = true
	br = bufio.NewReaderSize(io.MultiReader(strings.NewReader(chunkedHead), src), size)
	if err := x.readAnswer(br, resp, 0); err != nil {
		return x, resp, br, &chunkedRead{end: "head: " + err.Error()}
	}
	if resp.BodyStream() != &x.chunked {
		t.Fatalf("a streamed chunked answer reads through %T, want the exchange's chunkedBody", resp.BodyStream())
	}
	x.body = resp.BodyStream() // as Do keeps it
	return x, resp, br, nil
}

// readInPlace reads the same bytes through the exchange's in-place reading
// (Exchange.Next) as the relay's pump does: batches of pieces, each begun
// by Next(true), one Read of up to 7 bytes where that gives none. Every piece must be the
// reader's own bytes, not a copy, and each is written over once taken, as
// the pump's in-place copies write over what was read: what is read after
// it must not change.
func readInPlace(t testing.TB, src io.Reader, size int) chunkedRead {
	x, resp, br, failed := streamAnswer(t, src, size)
	defer fasthttp.ReleaseResponse(resp)
	if failed != nil {
		return *failed
	}
	if !x.InPlace() {
		t.Fatal("a streamed chunked answer is not read in place")
	}
	var data []byte
	small := make([]byte, 7)
	var err error
	for wait := true; err == nil; {
		var piece []byte
		piece, err = x.Next(wait)
		if len(piece) == 0 && err == nil && !wait {
			wait = true // the batch is over: the next one begins waiting
			continue
		}
		if len(piece) == 0 && err == nil {
			var n int
			n, err = x.Read(small)
			data = append(data, small[:n]...)
			wait = true
			continue
		}
		if len(piece) > 0 {
			// The reader's next bytes are those after the piece and
			// its CRLF, if read: the piece is in its buffer.
			next, _ := br.Peek(0)
			if gap := cap(piece) - len(piece) - cap(next); gap < 0 || gap > 2 {
				t.Fatalf("piece %q is not in the reader's buffer", piece)
			}
			data = append(data, piece...)
			for i := range piece {
				piece[i] = 'Z'
			}
		}
		wait = false
	}
	if err == io.EOF {
		if !x.eof {
			t.Fatal("the end read in place is not noted")
		}
		err = nil
	}
	return finishRead(data, err, &resp.Header, br)
}

func finishRead(data []byte, err error, h *fasthttp.ResponseHeader, br *bufio.Reader) chunkedRead {
	r := chunkedRead{data: string(data), end: endClass(err)}
	if err == nil {
		r.trailer = string(h.TrailerHeader())
		rest, _ := io.ReadAll(br)
		r.rest = string(rest)
	}
	return r
}

var chunkedSeeds = []string{
	"5\r\nhello\r\n0\r\n\r\n",
	"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n",
	"A;name=value\r\n0123456789\r\n0\r\n\r\n",
	"a \t\r\n0123456789\r\n0\r\n\r\n",
	"a ;ext\r\n0123456789\r\n0\r\n\r\n",
	"5\r\nhello\r\n0\r\nX-Usage: 5\r\nX-Other: a b\r\n\r\n",
	"5\r\nhello\r\n0\r\nContent-Length: 5\r\n\r\n",
	"5\r\nhello\r\n0\r\nX-Usage: 5\r\n",
	"5\r\nhello\r\n0\r\n",
	"5\r\nhello\r\n0",
	"5\r\nhel",
	"5\r\nhello",
	"5\r\nhello\r",
	"5\r\nhelloXY",
	"5\nhello\r\n0\r\n\r\n",
	"5\r\rhello\r\n0\r\n\r\n",
	"5",
	"",
	"\r\n",
	"x\r\nhello\r\n",
	"000000000000005\r\nhello\r\n0\r\n\r\n",
	"0000000000000005\r\nhello\r\n0\r\n\r\n",
	"fffffffffffffff\r\nabc",
	"5;a\nb\r\nhello\r\n0\r\n\r\n",
	"1\r\na\r\n1\r\nb\r\n1\r\nc\r\n00\r\n\r\n",
	"0\r\n\r\n",
	"0\r\n\r\n\r\n",
}

// FuzzChunkedMatchesFasthttp: the same bytes give the same data, the same
// kind of ending, the same trailer and the same bytes left for the next
// answer through fasthttp's body stream and through chunkedBody, whatever
// the reads are split into.
func FuzzChunkedMatchesFasthttp(f *testing.F) {
	for _, s := range chunkedSeeds {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, oneByte bool) {
		want := readWithFasthttp(body)
		var src io.Reader = bytes.NewReader(body)
		if oneByte {
			src = iotest.OneByteReader(src)
		}
		if got := readWithExchange(t, src, 4096); got != want {
			t.Fatalf("chunked body %q (one byte a read %v):\n got %+v\nwant %+v", body, oneByte, got, want)
		}
		src = bytes.NewReader(body)
		if oneByte {
			src = iotest.OneByteReader(src)
		}
		if got := readInPlace(t, src, 4096); got != want {
			t.Fatalf("chunked body %q read in place (one byte a read %v):\n got %+v\nwant %+v", body, oneByte, got, want)
		}
	})
}

// splitReader gives its bytes in two reads: those before at, then the
// rest.
type splitReader struct {
	b  []byte
	at int
}

func (r *splitReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	end := len(r.b)
	if r.at > 0 {
		end, r.at = r.at, 0
	}
	n := copy(p, r.b[:end])
	r.b = r.b[n:]
	return n, nil
}

// TestChunkedSplitAtEveryByte: a body with extensions, several chunks and
// a trailer, followed by the next answer's bytes, reads whole wherever
// the connection's reads split it.
func TestChunkedSplitAtEveryByte(t *testing.T) {
	body := "4;ext=1\r\nab\r\n\r\n1a\r\n" + strings.Repeat("x", 26) + "\r\n2 \r\nyz\r\n0\r\nX-Usage: 7\r\n\r\nHTTP/1.1 200 OK\r\n"
	want := chunkedRead{
		data:    "ab\r\n" + strings.Repeat("x", 26) + "yz",
		end:     "end",
		trailer: "X-Usage: 7\r\n\r\n",
		rest:    "HTTP/1.1 200 OK\r\n",
	}
	if got := readWithFasthttp([]byte(body)); got != want {
		t.Fatalf("fasthttp reads the test body as %+v, want %+v", got, want)
	}
	for at := 1; at < len(body); at++ {
		// The head is read first: the split lands at body byte at.
		src := &splitReader{b: []byte(body), at: at}
		if got := readWithExchange(t, src, 128); got != want {
			t.Fatalf("split at %d: %+v, want %+v", at, got, want)
		}
		if got := readInPlace(t, &splitReader{b: []byte(body), at: at}, 128); got != want {
			t.Fatalf("split at %d, read in place: %+v, want %+v", at, got, want)
		}
	}
	if got := readInPlace(t, iotest.OneByteReader(strings.NewReader(body)), 128); got != want {
		t.Fatalf("one byte a read, in place: %+v, want %+v", got, want)
	}
	if got := readWithExchange(t, iotest.OneByteReader(strings.NewReader(body)), 128); got != want {
		t.Fatalf("one byte a read: %+v, want %+v", got, want)
	}
}

// TestChunkedCutMidChunk: a body that ends inside a chunk's data is
// io.ErrUnexpectedEOF after the data that came; one that ends inside the
// framing is ErrBrokenChunk.
func TestChunkedCutMidChunk(t *testing.T) {
	for _, tc := range []struct {
		body, data string
		want       error
	}{
		{"5\r\nhello\r\n6\r\n wo", "hello wo", io.ErrUnexpectedEOF},
		{"5\r\nhello\r\n", "hello", io.ErrUnexpectedEOF},
		{"5\r\nhello\r\n6", "hello", ErrBrokenChunk},
		{"5\r\nhello", "hello", ErrBrokenChunk},
		{"5\r\nhello\r\n0\r\nX-Usage", "hello", ErrBrokenChunk},
		{"5\nhello\r\n", "", ErrBrokenChunk},
		{"g\r\n", "", ErrBrokenChunk},
		{"1000000000000000\r\n", "", ErrBrokenChunk},
	} {
		var c chunkedBody
		var h fasthttp.ResponseHeader
		c.reset(bufio.NewReader(strings.NewReader(tc.body)), &h)
		data, err := io.ReadAll(&c)
		if string(data) != tc.data || !errors.Is(err, tc.want) {
			t.Errorf("%q: %q, %v; want %q, %v", tc.body, data, err, tc.data, tc.want)
		}
		if _, again := c.Read(make([]byte, 8)); again != err {
			t.Errorf("%q: a read after the failure gives %v, want %v again", tc.body, again, err)
		}
	}
}

// TestChunkedReadDoesNotWaitWithData: a read returns the chunks that have
// arrived, the last one in part, without waiting for the rest; the next
// read waits for it.
func TestChunkedReadDoesNotWaitWithData(t *testing.T) {
	pr, pw := io.Pipe()
	defer pr.Close()
	var c chunkedBody
	var h fasthttp.ResponseHeader
	c.reset(bufio.NewReader(pr), &h)
	go func() {
		_, _ = pw.Write([]byte("5\r\nhello\r\n6\r\n wo"))
		_, _ = pw.Write([]byte("rld\r\n0\r\n\r\n"))
		_ = pw.Close()
	}()
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "hello wo" {
		t.Fatalf("first read %q, %v; want the two chunks' arrived data", buf[:n], err)
	}
	rest, err := io.ReadAll(&c)
	if err != nil || string(rest) != "rld" {
		t.Fatalf("rest %q, %v", rest, err)
	}
}

// TestChunkedTimeoutInFraming: a deadline met inside a chunk's framing is
// a timeout to errors.Is (fasthttp's reader hides it in ErrBrokenChunk).
func TestChunkedTimeoutInFraming(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	go func() { _, _ = server.Write([]byte("5\r\nhello\r")) }()
	var c chunkedBody
	var h fasthttp.ResponseHeader
	c.reset(bufio.NewReader(client), &h)
	buf := make([]byte, 64)
	if err := client.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	n, err := c.Read(buf)
	if string(buf[:n]) != "hello" || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %q, %v; want hello and the deadline", buf[:n], err)
	}
}

// TestChunkedReadAllocs: decoding a body — chunks, extensions, a trailer
// section — allocates nothing.
func TestChunkedReadAllocs(t *testing.T) {
	body := []byte("5;x=y\r\nhello\r\n6\r\n world\r\n" + strings.Repeat("10\r\n0123456789abcdef\r\n", 8) + "0\r\n\r\n")
	src := bytes.NewReader(body)
	br := bufio.NewReader(src)
	var c chunkedBody
	var h fasthttp.ResponseHeader
	buf := make([]byte, 16)
	read := func() {
		src.Reset(body)
		br.Reset(src)
		c.reset(br, &h)
		for {
			if _, err := c.Read(buf); err != nil {
				if err != io.EOF {
					t.Fatal(err)
				}
				return
			}
		}
	}
	read()
	if n := testing.AllocsPerRun(100, read); n != 0 {
		t.Fatalf("%v allocations a body, want 0", n)
	}
	// In place (next), Read where it gives nothing.
	inPlace := func() {
		src.Reset(body)
		br.Reset(src)
		c.reset(br, &h)
		wait := true
		for {
			b, err := c.next(wait)
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case len(b) > 0:
				wait = false
			case !wait:
				wait = true // the batch is over
			default:
				if _, err := c.Read(buf); err != nil && err != io.EOF {
					t.Fatal(err)
				}
			}
		}
	}
	inPlace()
	if n := testing.AllocsPerRun(100, inPlace); n != 0 {
		t.Fatalf("%v allocations a body read in place, want 0", n)
	}
}

// benchChunkedStream is a streamed answer as an engine sends it: a head,
// then 18 events of one chunk each (a role, 16 tokens, a usage event) and
// the last chunk.
func benchChunkedStream() []byte {
	var b bytes.Buffer
	b.WriteString(chunkedHead)
	event := "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" w4200\"}}]}\n\n"
	for range 18 {
		b.WriteString(strconv.FormatInt(int64(len(event)), 16))
		b.WriteString("\r\n" + event + "\r\n")
	}
	b.WriteString("0\r\n\r\n")
	return b.Bytes()
}

// segmentReader returns its bytes in segments: the head, then one chunk
// a read, as they arrive from an engine that sends each event at once.
type segmentReader struct {
	b    []byte
	segs []int // segment lengths
	i    int
}

func (r *segmentReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := len(r.b)
	if r.i < len(r.segs) {
		n = r.segs[r.i]
		r.i++
	}
	n = copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// BenchmarkChunkedStream: one streamed answer's head and body read as
// Exchange.Do and the relay read it, through fasthttp's body stream
// (fasthttp) and through readAnswer's chunkedBody (exchange): all its
// bytes at once (burst), or its head and then one chunk a read
// (arrivals).
func BenchmarkChunkedStream(b *testing.B) {
	stream := benchChunkedStream()
	chunk := (len(stream) - len(chunkedHead) - len("0\r\n\r\n")) / 18
	segs := []int{len(chunkedHead)}
	for range 18 {
		segs = append(segs, chunk)
	}
	for _, burst := range []bool{true, false} {
		for _, via := range []string{"fasthttp", "exchange"} {
			name := "arrivals/" + via
			if burst {
				name = "burst/" + via
			}
			b.Run(name, func(b *testing.B) { benchChunkedStreamVia(b, stream, segs, burst, via) })
		}
	}
}

func benchChunkedStreamVia(b *testing.B, stream []byte, segs []int, burst bool, via string) {
	src := &segmentReader{}
	br := bufio.NewReaderSize(src, 4096)
	buf := make([]byte, 16<<10)
	var x Exchange
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		*src = segmentReader{b: stream}
		if !burst {
			src.segs = segs
		}
		br.Reset(src)
		resp := fasthttp.AcquireResponse()
		resp.StreamBody = true
		var err error
		if via == "fasthttp" {
			err = resp.ReadLimitBody(br, 0)
		} else {
			err = x.readAnswer(br, resp, 0)
		}
		if err != nil {
			b.Fatal(err)
		}
		body := resp.BodyStream()
		for err == nil {
			_, err = body.Read(buf)
		}
		if err != io.EOF {
			b.Fatal(err)
		}
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
	}
}
