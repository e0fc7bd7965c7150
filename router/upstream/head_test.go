package upstream

import (
	"bufio"
	"bytes"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// answerRead is what one way of reading an answer made of it: the head's
// status, the headers the router reads and the body's framing, the body
// and how it ended, and the bytes left for the next answer.
type answerRead struct {
	err           string
	status        int
	contentType   string
	contentLength int
	close         bool
	body          string
	end           string
	trailer       string
	rest          string
}

// readAnswerVia reads data, split into two reads at split (0: one read),
// through the exchange's readAnswer (own) or fasthttp's reading of it
// (readAnswerFasthttp), as a unary or a streamed answer.
func readAnswerVia(data []byte, split int, stream, own bool) answerRead {
	var x Exchange
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	resp.StreamBody = stream
	br := bufio.NewReaderSize(&splitReader{b: data, at: split}, 4096)
	var err error
	if own {
		err = x.readAnswer(br, resp, 1<<20)
	} else {
		err = x.readAnswerFasthttp(br, resp, 1<<20)
	}
	if err != nil {
		return answerRead{err: err.Error()}
	}
	h := &resp.Header
	r := answerRead{status: h.StatusCode(), contentType: string(h.ContentType()), contentLength: h.ContentLength(), close: resp.ConnectionClose()}
	var body []byte
	if s := resp.BodyStream(); s != nil {
		body, err = io.ReadAll(s)
		_ = resp.CloseBodyStream()
	} else {
		body = resp.Body()
	}
	r.body, r.end = string(body), endClass(err)
	if err == nil {
		r.trailer = string(h.TrailerHeader())
		rest, _ := io.ReadAll(br)
		r.rest = string(rest)
	}
	return r
}

const simDate = "Date: Sat, 05 Dec 2026 07:00:00 GMT\r\n"

var headSeeds = []string{
	"HTTP/1.1 200 OK\r\n" + simDate + "Content-Type: application/json\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\n" + simDate + "Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n",
	"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy",
	"HTTP/1.1 200\r\ncontent-length: 2\r\nCONNECTION: Keep-Alive\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length:  7 \t\r\nContent-Type:\ttext/plain \r\nX-Odd: a\x80b\r\n\r\n1234567",
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
	"HTTP/1.1 304 Not Modified\r\n\r\n",
	"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\nok\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTrailer: X-Usage\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Usage: 1\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-Long: a\r\n b\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nConnection: close, te\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Type: a\x01b\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\n\r\nuntil close",
	"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 099 OK\r\nContent-Length: 2\r\n\r\nok",
	"\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
	"HTTP/1.1 200 OK\r\nContent-Le",
	"HTTP/1.1 200 OK\r\nCONTENT-TYPE: a\r\ncontent-LENGTH:2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Type\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\tx\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Lengthy: 2\r\nTransfer-Encodings: chunked\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: Chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
	"",
}

// FuzzHeadMatchesFasthttp: the same bytes give the same status, the same
// Content-Type, framing and Connection, the same body and ending and the
// same bytes left for the next answer through the exchange's own reading
// of a head and through fasthttp's, unary and streamed, whatever the
// reads are split into; and a head the exchange takes itself (parseHead)
// is one fasthttp reads the same way, to the same byte.
func FuzzHeadMatchesFasthttp(f *testing.F) {
	for _, s := range headSeeds {
		f.Add([]byte(s), false, uint16(0))
		f.Add([]byte(s), true, uint16(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, data []byte, stream bool, split uint16) {
		at := int(split) % (len(data) + 1)
		want := readAnswerVia(data, at, stream, false)
		if got := readAnswerVia(data, at, stream, true); got != want {
			t.Fatalf("answer %q (stream %v, split at %d):\n got %+v\nwant %+v", data, stream, at, got, want)
		}
		h, ok := parseHead(data)
		if !ok {
			return
		}
		var fh fasthttp.ResponseHeader
		br := bufio.NewReaderSize(bytes.NewReader(data), len(data)+16)
		if err := fh.Read(br); err != nil {
			t.Fatalf("head %q: the exchange reads it, fasthttp refuses it: %v", data, err)
		}
		got := answerRead{status: h.status, contentType: string(h.contentType), contentLength: h.contentLength, close: h.close, rest: strconv.Itoa(h.length)}
		want = answerRead{status: fh.StatusCode(), contentLength: fh.ContentLength(), close: fh.ConnectionClose(), rest: strconv.Itoa(len(data) - br.Buffered())}
		if got.contentType != "" {
			want.contentType = string(fh.ContentType())
		} else if ct := fh.ContentType(); !bytes.Equal(ct, []byte("text/plain; charset=utf-8")) {
			want.contentType = string(ct)
		}
		if got != want {
			t.Fatalf("head %q:\n got %+v\nwant %+v (fasthttp)", data, got, want)
		}
	})
}

// TestParseHeadCommonForms: the heads engines send (fasthttp's server as
// the simulator runs it, vLLM's and SGLang's uvicorn) are the exchange's
// own to read, with their status, Content-Type and framing.
func TestParseHeadCommonForms(t *testing.T) {
	for _, tc := range []struct {
		head        string
		status      int
		contentType string
		length      int
		close       bool
	}{
		{"HTTP/1.1 200 OK\r\n" + simDate + "Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n", 200, "text/event-stream", -1, false},
		{"HTTP/1.1 200 OK\r\n" + simDate + "Content-Type: application/json\r\nContent-Length: 1234\r\n\r\n", 200, "application/json", 1234, false},
		{"HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 07:00:00 GMT\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n", 200, "text/event-stream; charset=utf-8", -1, false},
		{"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 21\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n", 500, "application/json", 21, true},
		{"HTTP/1.1 429 \r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n", 429, "", 0, false},
	} {
		data := tc.head + "body after the head"
		h, ok := parseHead([]byte(data))
		if !ok {
			t.Fatalf("head %q: left to fasthttp, want the exchange's", tc.head)
		}
		if h.status != tc.status || string(h.contentType) != tc.contentType || h.contentLength != tc.length || h.close != tc.close || h.length != len(tc.head) {
			t.Fatalf("head %q: got %+v", tc.head, h)
		}
		if _, ok := parseHead([]byte(tc.head[:len(tc.head)-1])); ok {
			t.Fatalf("head %q less its last byte: read, want more bytes first", tc.head)
		}
	}
}

// TestParseHeadLeavesTheUnusualToFasthttp: every head outside the common
// form is fasthttp's to read (or refuse), as it always was.
func TestParseHeadLeavesTheUnusualToFasthttp(t *testing.T) {
	for _, head := range []string{
		"HTTP/1.1 100 Continue\r\n\r\n",                                     // interim answers
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",                    //
		"HTTP/1.1 101 Switching Protocols\r\nContent-Length: 0\r\n\r\n",     //
		"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",              // bodyless
		"HTTP/1.1 304 Not Modified\r\nContent-Length: 0\r\n\r\n",            //
		"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",                      // HTTP/1.0
		"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n",      // obs-fold
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", // duplicate length
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTrailer: X-Usage\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: upgrade\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\n",                       // until close
		"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n",    // bare LF
		"HTTP/1.1 200 OK\r\nContent-Length: 0\n\r\n",    //
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\n",    //
		"HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n", // space before the colon
		"HTTP/1.1 200 OK\r\nX-A: a\x00\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 0x1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1234567890123456789\r\n\r\n",
		"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 2000\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1  200 OK\r\nContent-Length: 0\r\n\r\n",
		"http/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
	} {
		if h, ok := parseHead([]byte(head + "next")); ok {
			t.Errorf("head %q: read by the exchange (%+v), want it left to fasthttp", head, h)
		}
		for _, stream := range []bool{false, true} {
			want := readAnswerVia([]byte(head+"next"), 0, stream, false)
			if got := readAnswerVia([]byte(head+"next"), 0, stream, true); got != want {
				t.Errorf("head %q (stream %v):\n got %+v\nwant %+v", head, stream, got, want)
			}
		}
	}
}

// TestReadAnswerOversizedHead: a head larger than the connection's reader
// is refused as fasthttp refuses it (its small-buffer error).
func TestReadAnswerOversizedHead(t *testing.T) {
	data := []byte("HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 5000) + "\r\nContent-Length: 0\r\n\r\n")
	for _, stream := range []bool{false, true} {
		want := readAnswerVia(data, 0, stream, false)
		got := readAnswerVia(data, 0, stream, true)
		if want.err == "" || got != want {
			t.Fatalf("oversized head (stream %v): got %+v, want fasthttp's refusal %+v", stream, got, want)
		}
	}
}

// TestReadAnswerSplitAtEveryByte: a unary and a streamed answer, each
// followed by the next answer's bytes, read the same through the
// exchange as through fasthttp wherever the connection's reads split
// them; a head that arrives whole is the exchange's to read (fasthttp
// would keep the Date header, the exchange does not).
func TestReadAnswerSplitAtEveryByte(t *testing.T) {
	for _, tc := range []struct {
		head, body string
		stream     bool
	}{
		{"HTTP/1.1 200 OK\r\n" + simDate + "Content-Type: application/json\r\nContent-Length: 11\r\n\r\n", `{"id":"x1"}`, false},
		{"HTTP/1.1 200 OK\r\n" + simDate + "Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n", "6\r\ndata:1\r\n6\r\ndata:2\r\n0\r\nX-Usage: 3\r\n\r\n", true},
		{"HTTP/1.1 200 OK\r\n" + simDate + "Content-Type: text/event-stream\r\nContent-Length: 6\r\n\r\n", "data:1", true},
	} {
		data := []byte(tc.head + tc.body + "HTTP/1.1 200 OK\r\n")
		for at := range len(data) + 1 {
			want := readAnswerVia(data, at, tc.stream, false)
			if got := readAnswerVia(data, at, tc.stream, true); got != want {
				t.Fatalf("answer %q split at %d:\n got %+v\nwant %+v", data, at, got, want)
			}
		}
		for _, at := range []int{0, len(tc.head)} {
			var x Exchange
			resp := fasthttp.AcquireResponse()
			resp.StreamBody = tc.stream
			br := bufio.NewReader(&splitReader{b: data, at: at})
			if err := x.readAnswer(br, resp, 0); err != nil {
				t.Fatal(err)
			}
			if len(resp.Header.Peek("Date")) != 0 {
				t.Fatalf("head %q arrived whole (split at %d): fasthttp read it, want the exchange", tc.head, at)
			}
			_ = resp.CloseBodyStream()
			fasthttp.ReleaseResponse(resp)
		}
	}
}

// TestReadAnswerAllocs: reading a unary answer and a streamed answer's
// head and body with the exchange's own head reader allocates nothing.
func TestReadAnswerAllocs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		data   string
		stream bool
	}{
		{"unary", "HTTP/1.1 200 OK\r\n" + simDate + "Content-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"id\":\"x1\"}", false},
		{"stream", "HTTP/1.1 200 OK\r\n" + simDate + "Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata:1\r\n0\r\n\r\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.data)
			src := bytes.NewReader(data)
			br := bufio.NewReader(src)
			var x Exchange
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseResponse(resp)
			buf := make([]byte, 64)
			read := func() {
				src.Reset(data)
				br.Reset(src)
				resp.StreamBody = tc.stream
				if err := x.readAnswer(br, resp, 0); err != nil {
					t.Fatal(err)
				}
				if body := resp.BodyStream(); body != nil {
					for {
						if _, err := body.Read(buf); err != nil {
							if err != io.EOF {
								t.Fatal(err)
							}
							break
						}
					}
				}
				if len(resp.Header.Peek("Date")) != 0 {
					t.Fatal("fasthttp read the head, want the exchange")
				}
				resp.Reset()
			}
			read()
			if n := testing.AllocsPerRun(100, read); n != 0 {
				t.Fatalf("%v allocations an answer, want 0", n)
			}
		})
	}
}

// BenchmarkAnswerHead: an answer as an engine sends it read as Exchange.Do
// reads it, through fasthttp's head parser (fasthttp) and the exchange's
// own (exchange): a unary answer with its body, a stream's head.
func BenchmarkAnswerHead(b *testing.B) {
	unary := []byte("HTTP/1.1 200 OK\r\n" + simDate + "Content-Type: application/json\r\nContent-Length: 300\r\n\r\n" + strings.Repeat("x", 300))
	stream := []byte(chunkedHead[:len("HTTP/1.1 200 OK\r\n")] + simDate + chunkedHead[len("HTTP/1.1 200 OK\r\n"):])
	for _, kind := range []string{"unary", "stream"} {
		for _, via := range []string{"fasthttp", "exchange"} {
			b.Run(kind+"/"+via, func(b *testing.B) {
				data := unary
				if kind == "stream" {
					data = stream
				}
				src := bytes.NewReader(data)
				br := bufio.NewReaderSize(src, 4096)
				var x Exchange
				resp := fasthttp.AcquireResponse()
				defer fasthttp.ReleaseResponse(resp)
				b.ReportAllocs()
				for b.Loop() {
					src.Reset(data)
					br.Reset(src)
					resp.StreamBody = kind == "stream"
					var err error
					if via == "fasthttp" {
						err = x.readAnswerFasthttp(br, resp, 0)
					} else {
						err = x.readAnswer(br, resp, 0)
					}
					if err != nil {
						b.Fatal(err)
					}
					resp.Reset()
				}
			})
		}
	}
}

// TestWordNameMatchesFold: a name matched eight bytes at a time says what
// the byte-by-byte fold says, for every byte at every place of the name,
// in a head long enough for the words and in one that is not.
func TestWordNameMatchesFold(t *testing.T) {
	for _, w := range []wordName{nameContentType, nameContentLength, nameTransferEncoding, nameDate} {
		for _, size := range []int{len(w.name), 8 * len(w.words)} {
			b := make([]byte, size)
			copy(b, strings.ToUpper(w.name))
			for c := range 256 {
				for at := range len(w.name) {
					was := b[at]
					b[at] = byte(c)
					if got, want := w.at(b), equalFoldLower(b[:len(w.name)], w.name); got != want {
						t.Fatalf("%q in %d bytes, byte %#x at %d: at %v, want %v", w.name, size, c, at, got, want)
					}
					b[at] = was
				}
			}
		}
	}
}

// TestValueEndMatchesByteRule: the word-at-a-time search for a value's
// end finds what the byte rule finds, for every byte at every place of a
// word and of the tail, with no tab and with a tab at every place before
// it (the search goes on after a tab, from within a word).
func TestValueEndMatchesByteRule(t *testing.T) {
	v := []byte(strings.Repeat("a", 19))
	for tab := -1; tab < len(v); tab++ {
		for c := range 256 {
			for at := tab + 1; at < len(v); at++ {
				if tab >= 0 {
					v[tab] = '\t'
				}
				v[at] = byte(c)
				want := len(v)
				if !isValueByte(byte(c)) {
					want = at
				}
				if got := valueEnd(v); got != want {
					t.Fatalf("value %q: end %d, want %d", v, got, want)
				}
				v[at] = 'a'
				if tab >= 0 {
					v[tab] = 'a'
				}
			}
		}
	}
}
