package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/infera/infera/jsonx"
)

// Error kinds, the keys of Report.Errors.
const (
	// KindConnect: the TCP connection could not be made (refused, unreachable, DNS).
	KindConnect = "connect"
	// KindTimeout: the request did not finish within --timeout.
	KindTimeout = "timeout"
	// KindCanceled: the run was interrupted while the request was pending.
	KindCanceled = "canceled"
	// KindConnection: the connection failed after it was made, before a full
	// response arrived (reset, closed early).
	KindConnection = "connection"
	// KindHTTP4xx and KindHTTP5xx: the server answered with that status class.
	KindHTTP4xx = "http_4xx"
	KindHTTP5xx = "http_5xx"
	// KindStream: a stream broke, carried an error event or ended without [DONE].
	KindStream = "stream_error"
	// KindInvalidResponse: a 200 answer that is not an OpenAI completion.
	KindInvalidResponse = "invalid_response"
)

// WorkerHeader names the worker that served a request behind `infera serve`.
const WorkerHeader = "X-Infera-Worker"

// Bounds on what the client reads, so a broken server cannot exhaust memory.
const (
	maxUnaryBody   = 64 << 20
	maxErrorBody   = 512
	maxSSELine     = 16 << 20
	readBufferSize = 32 << 10
)

// result is the outcome of one request. One result is reused by a closed-loop
// worker for all its requests so that its ITL buffer is allocated once.
type result struct {
	kind    string // empty on success
	message string
	worker  string

	start      time.Time
	end        time.Time
	firstToken time.Time
	lastToken  time.Time
	chunks     int
	itl        []float64 // ms between consecutive content chunks
	done       bool      // saw data: [DONE]

	haveUsage                          bool
	promptTokens, outputTokens, cached int64
	words                              int
}

func (r *result) reset() {
	*r = result{itl: r.itl[:0]}
}

func (r *result) fail(kind, message string) {
	if r.kind == "" {
		r.kind, r.message = kind, message
	}
}

// client sends one request and measures it.
type client struct {
	http      *http.Client
	transport *http.Transport
	urls      []string // endpoint URLs, used round-robin
	next      atomic.Uint64
	auth      string
	model     string
	chat      bool
	stream    bool
	ignoreEOS bool

	bodies  sync.Pool // *bytes.Buffer: request bodies and unary responses
	readers sync.Pool // *bufio.Reader: SSE streams
	lines   sync.Pool // *[]byte: SSE lines longer than the read buffer, and event data
}

func newClient(urls []string, apiKey, model string, chat, stream, ignoreEOS bool, conns int, timeout time.Duration) *client {
	tr := &http.Transport{
		// A benchmark measures the path it is pointed at: no proxy from the
		// environment, no compression (the server's own CPU is what we load).
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		WriteBufferSize:     readBufferSize,
		ReadBufferSize:      readBufferSize,
	}
	c := &client{
		http:      &http.Client{Transport: tr},
		transport: tr,
		urls:      urls,
		model:     model,
		chat:      chat,
		stream:    stream,
		ignoreEOS: ignoreEOS,
	}
	if apiKey != "" {
		c.auth = "Bearer " + apiKey
	}
	c.bodies.New = func() any { return new(bytes.Buffer) }
	c.readers.New = func() any { return bufio.NewReaderSize(nil, readBufferSize) }
	c.lines.New = func() any { b := make([]byte, 0, 4096); return &b }
	return c
}

func (c *client) close() {
	c.transport.CloseIdleConnections()
}

// appendBody appends the JSON request body for it.
func (c *client) appendBody(b []byte, it *item) []byte {
	b = append(b, `{"model":`...)
	b = jsonx.AppendQuoted(b, c.model)
	if c.chat {
		b = append(b, `,"messages":[`...)
		for k, m := range it.messages {
			if k > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"role":`...)
			b = jsonx.AppendQuoted(b, m.role)
			b = append(b, `,"content":`...)
			b = jsonx.AppendQuoted(b, m.content)
			b = append(b, '}')
		}
		b = append(b, ']')
	} else {
		b = append(b, `,"prompt":`...)
		b = jsonx.AppendQuoted(b, renderPrompt(it.messages))
	}
	b = append(b, `,"max_tokens":`...)
	b = strconv.AppendInt(b, int64(it.maxTokens), 10)
	if c.ignoreEOS {
		b = append(b, `,"ignore_eos":true`...)
	}
	if c.stream {
		// include_usage makes the server end the stream with a usage chunk:
		// the only place a stream reports prompt and cached tokens.
		b = append(b, `,"stream":true,"stream_options":{"include_usage":true}`...)
	} else {
		b = append(b, `,"stream":false`...)
	}
	return append(b, '}')
}

// do sends it and fills res. reqCtx bounds this request (--timeout); runCtx
// is the whole run, whose cancellation is reported as "canceled".
func (c *client) do(reqCtx, runCtx context.Context, it *item, res *result) {
	buf := c.bodies.Get().(*bytes.Buffer)
	buf.Reset()
	buf.Write(c.appendBody(buf.AvailableBuffer(), it))
	res.words = it.words
	rb := &requestBody{pool: &c.bodies, buf: buf}
	rb.Reset(buf.Bytes())

	target := c.urls[0]
	if len(c.urls) > 1 {
		target = c.urls[(c.next.Add(1)-1)%uint64(len(c.urls))]
	}
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, target, rb)
	if err != nil {
		_ = rb.Close()
		res.fail(KindInvalidResponse, err.Error())
		return
	}
	req.ContentLength = int64(buf.Len())
	req.Header.Set("Content-Type", "application/json")
	if c.stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	res.start = time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		res.end = time.Now()
		res.fail(classify(err, reqCtx, runCtx, KindConnection), err.Error())
		return
	}
	defer resp.Body.Close()
	res.worker = resp.Header.Get(WorkerHeader)
	if resp.StatusCode != http.StatusOK {
		msg := make([]byte, maxErrorBody)
		n, _ := io.ReadFull(resp.Body, msg)
		res.end = time.Now()
		kind := KindHTTP4xx
		if resp.StatusCode >= 500 {
			kind = KindHTTP5xx
		} else if resp.StatusCode < 400 {
			kind = KindInvalidResponse
		}
		res.fail(kind, "HTTP "+strconv.Itoa(resp.StatusCode)+": "+string(bytes.TrimSpace(msg[:n])))
		return
	}
	if c.stream {
		c.readStream(reqCtx, runCtx, resp.Body, res)
	} else {
		out := c.bodies.Get().(*bytes.Buffer)
		c.readUnary(reqCtx, runCtx, resp.Body, out, res)
		c.bodies.Put(out)
	}
}

// requestBody hands its pooled buffer back when the transport closes it: the
// transport may still be reading a request body after Do has returned (when
// the server answered early), so the buffer cannot be reused before that.
type requestBody struct {
	bytes.Reader
	pool   *sync.Pool
	buf    *bytes.Buffer
	closed atomic.Bool
}

func (b *requestBody) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.pool.Put(b.buf)
	}
	return nil
}

// readUnary reads a non-streaming completion. Its first token reaches the
// client with the whole response, so TTFT is the end-to-end latency.
func (c *client) readUnary(reqCtx, runCtx context.Context, body io.Reader, buf *bytes.Buffer, res *result) {
	buf.Reset()
	_, err := buf.ReadFrom(io.LimitReader(body, maxUnaryBody+1))
	res.end = time.Now()
	if err != nil {
		res.fail(classify(err, reqCtx, runCtx, KindConnection), err.Error())
		return
	}
	data := buf.Bytes()
	if len(data) > maxUnaryBody {
		res.fail(KindInvalidResponse, "response body over "+strconv.Itoa(maxUnaryBody)+" bytes")
		return
	}
	if msg, ok := errorEvent(data); ok {
		res.fail(KindInvalidResponse, msg)
		return
	}
	if findKey(data, keyChoices) < 0 {
		res.fail(KindInvalidResponse, "response has no choices: "+snippet(data))
		return
	}
	res.firstToken = res.end
	res.lastToken = res.end
	if u, ok := scanUsage(data); ok {
		res.haveUsage = true
		res.promptTokens, res.outputTokens, res.cached = u.prompt, u.completion, u.cached
	}
}

// readStream reads an SSE stream, stamping each event that carries generated
// text: the first is the TTFT, the gaps between them the inter-token latencies.
func (c *client) readStream(reqCtx, runCtx context.Context, body io.Reader, res *result) {
	br := c.readers.Get().(*bufio.Reader)
	br.Reset(body)
	lp := c.lines.Get().(*[]byte)
	long := (*lp)[:0]
	dp := c.lines.Get().(*[]byte)
	data := (*dp)[:0]
	defer func() {
		br.Reset(nil)
		c.readers.Put(br)
		*lp, *dp = long[:0], data[:0]
		c.lines.Put(lp)
		c.lines.Put(dp)
	}()

	haveData := false
	for !res.done && res.kind == "" {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long, line...)
			if len(long) > maxSSELine {
				res.end = time.Now()
				res.fail(KindStream, "SSE line over "+strconv.Itoa(maxSSELine)+" bytes")
				return
			}
			continue
		}
		if len(long) > 0 {
			long = append(long, line...)
			line = long
		}
		if len(line) > 0 {
			line = trimEOL(line)
			switch {
			case len(line) == 0:
				if haveData {
					c.event(data, res)
					data, haveData = data[:0], false
				}
			case bytes.HasPrefix(line, prefixData):
				v := line[len(prefixData):]
				if len(v) > 0 && v[0] == ' ' {
					v = v[1:]
				}
				if haveData {
					data = append(data, '\n')
				}
				data, haveData = append(data, v...), true
			}
			// Comments (":") and the event/id/retry fields carry nothing we measure.
		}
		long = long[:0]
		if err != nil {
			if haveData && errors.Is(err, io.EOF) {
				c.event(data, res)
			}
			if res.done || res.kind != "" {
				break
			}
			res.end = time.Now()
			if errors.Is(err, io.EOF) {
				res.fail(KindStream, "stream ended without [DONE]")
			} else {
				res.fail(classify(err, reqCtx, runCtx, KindStream), err.Error())
			}
			return
		}
	}
	if res.end.IsZero() {
		res.end = time.Now()
	}
	if res.kind == "" {
		// Read the chunked terminator so the connection goes back to the pool.
		_, _ = br.Discard(maxErrorBody)
	}
}

var (
	prefixData = []byte("data:")
	doneMarker = []byte("[DONE]")
)

// event handles one SSE event's data.
func (c *client) event(data []byte, res *result) {
	now := time.Now()
	if bytes.Equal(bytes.TrimSpace(data), doneMarker) {
		res.done = true
		res.end = now
		return
	}
	if msg, ok := errorEvent(data); ok {
		res.end = now
		res.fail(KindStream, msg)
		return
	}
	if hasToken(data) {
		if res.chunks == 0 {
			res.firstToken = now
		} else {
			res.itl = append(res.itl, float64(now.Sub(res.lastToken))/float64(time.Millisecond))
		}
		res.lastToken = now
		res.chunks++
	}
	if u, ok := scanUsage(data); ok {
		res.haveUsage = true
		res.promptTokens, res.outputTokens, res.cached = u.prompt, u.completion, u.cached
	}
}

func trimEOL(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return b
}

// classify names the kind of a transport error. fallback is the kind of a
// failure of an established connection in the current phase.
func classify(err error, reqCtx, runCtx context.Context, fallback string) string {
	switch {
	case runCtx.Err() != nil:
		return KindCanceled
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(reqCtx.Err(), context.DeadlineExceeded):
		return KindTimeout
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return KindConnect
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return KindConnect
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return KindTimeout
	}
	return fallback
}

func snippet(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}

// The scanners below read the few fields the bench needs straight from the
// JSON bytes, without decoding the chunk: they run once per streamed token.

var (
	keyContent   = []byte(`"content"`)
	keyText      = []byte(`"text"`)
	keyReasoning = []byte(`"reasoning_content"`)
	keyUsage     = []byte(`"usage"`)
	keyPrompt    = []byte(`"prompt_tokens"`)
	keyOutput    = []byte(`"completion_tokens"`)
	keyCached    = []byte(`"cached_tokens"`)
	keyChoices   = []byte(`"choices"`)
	keyError     = []byte(`"error"`)
	keyMessage   = []byte(`"message"`)
)

// valueAfter returns the bytes after the first occurrence of key used as an
// object key (followed by a colon) from offset from, and the offset just past
// the key; nil when there is none. An occurrence preceded by a backslash is
// inside a string (an escaped quote) and skipped.
func valueAfter(data, key []byte, from int) ([]byte, int) {
	for from < len(data) {
		i := bytes.Index(data[from:], key)
		if i < 0 {
			return nil, -1
		}
		i += from
		from = i + len(key)
		if i > 0 && data[i-1] == '\\' {
			continue
		}
		v := skipSpace(data[from:])
		if len(v) == 0 || v[0] != ':' {
			continue
		}
		return skipSpace(v[1:]), from
	}
	return nil, -1
}

// findKey returns the offset of key used as an object key, or -1.
func findKey(data, key []byte) int {
	_, at := valueAfter(data, key, 0)
	return at
}

func skipSpace(b []byte) []byte { return b[jsonx.SkipSpace(b, 0):] }

// hasToken reports whether a chunk carries generated text: a content, text or
// reasoning_content key with a non-empty string value. The first chat chunk
// (role only, empty content) and the usage chunk carry none.
func hasToken(data []byte) bool {
	for _, key := range [...][]byte{keyContent, keyText, keyReasoning} {
		from := 0
		for {
			v, at := valueAfter(data, key, from)
			if at < 0 {
				break
			}
			if len(v) >= 2 && v[0] == '"' && v[1] != '"' {
				return true
			}
			from = at
		}
	}
	return false
}

type usage struct {
	prompt, completion, cached int64
}

// scanUsage reads the usage object of a completion or chunk; ok is false when
// there is none (absent or null).
func scanUsage(data []byte) (usage, bool) {
	from := 0
	for {
		v, at := valueAfter(data, keyUsage, from)
		if at < 0 {
			return usage{}, false
		}
		from = at
		if len(v) == 0 || v[0] != '{' {
			continue
		}
		end := objectEnd(v)
		if end < 0 {
			return usage{}, false
		}
		obj := v[:end]
		return usage{
			prompt:     intField(obj, keyPrompt),
			completion: intField(obj, keyOutput),
			cached:     intField(obj, keyCached),
		}, true
	}
}

// objectEnd returns the length of the JSON object at the start of b
// (through its closing brace), or -1 when it is not closed.
func objectEnd(b []byte) int {
	depth := 0
	inString := false
	for i := 0; i < len(b); i++ {
		ch := b[i]
		if inString {
			switch ch {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch ch {
		case '"':
			inString = true
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// intField returns the non-negative integer value of key in obj, 0 when it is
// absent, null or not an integer.
func intField(obj, key []byte) int64 {
	v, at := valueAfter(obj, key, 0)
	if at < 0 {
		return 0
	}
	var n int64
	for _, ch := range v {
		if ch < '0' || ch > '9' {
			break
		}
		n = n*10 + int64(ch-'0')
		if n > 1<<40 {
			return 0
		}
	}
	return n
}

// errorEvent reports whether data is an error object ({"error": ...} as its
// first key, as vLLM and OpenAI send) and returns its message.
func errorEvent(data []byte) (string, bool) {
	d := skipSpace(data)
	if len(d) == 0 || d[0] != '{' {
		return "", false
	}
	d = skipSpace(d[1:])
	if !bytes.HasPrefix(d, keyError) {
		return "", false
	}
	if v, at := valueAfter(d, keyMessage, 0); at >= 0 && len(v) > 0 && v[0] == '"' {
		sc := jsonx.Scanner{B: v, Lenient: true}
		if st, en, _, err := sc.String(); err == nil {
			return string(jsonx.AppendUnescaped(nil, v[st:en])), true
		}
	}
	return snippet(data), true
}
