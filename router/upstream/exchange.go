package upstream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// ErrAborted is the error of an exchange cut by Abort.
var ErrAborted = errors.New("upstream: exchange aborted")

// Exchange is one request and its answer on a connection of a worker's
// pool (Pool). The leg holds the connection from the moment
// it is taken from the pool until Release, so that Abort can cut it at any
// moment — while the request is written, while the engine computes, while
// the answer streams — which is how an engine learns that the client left
// or that the leg's other half failed. A whole answer gives the
// connection back to the pool; a stream gives it back once read to its
// end, and closes it otherwise.
//
// Exchanges are reused: Begin readies one for the next leg. One goroutine
// runs Do, Read and Release; Abort may come from any goroutine.
type Exchange struct {
	mu      sync.Mutex
	aborted bool
	conn    net.Conn // the held connection as Abort sees it, nil when none

	held net.Conn      // the held connection, until release
	pool *Pool         // held's pool
	br   *bufio.Reader // a stream's reader, until Release
	// pooledReader: br is the pool's (a connection not Dial's), not the
	// connection's own (Conn.buffers).
	pooledReader bool
	resp         *fasthttp.Response
	body         io.Reader // a stream's body
	// chunked decodes a chunked stream's body in place of fasthttp's
	// body stream (readAnswer).
	chunked chunkedBody
	eof     bool // the stream was read to its end
	closed  bool // the connection must not go back to the pool

	// leg is an answer held on another transport (Hold), nil when none.
	leg Leg
}

// Leg is an answer that travels on another transport than a pooled
// connection (requests over NATS): an exchange that holds one (Hold) reads
// its body from it, aborts it with Abort and ends it with Release. Abort
// may come from any goroutine; Read and Release come from the leg's.
type Leg interface {
	io.Reader
	Abort()
	Release()
}

// Hold makes l the exchange's answer until Release; an exchange aborted
// since Begin aborts l at once.
func (x *Exchange) Hold(l Leg) {
	x.mu.Lock()
	x.leg = l
	aborted := x.aborted
	x.mu.Unlock()
	if aborted {
		l.Abort()
	}
}

// Begin readies x for a new leg: a past abort is forgotten. It runs on the
// leg's goroutine before the leg is published to whoever may abort it.
func (x *Exchange) Begin() {
	x.mu.Lock()
	x.aborted = false
	x.mu.Unlock()
}

// Abort cuts the exchange: its connection is closed now, and a Do not
// started yet fails with ErrAborted. It is safe from any goroutine, and
// until the next Begin.
func (x *Exchange) Abort() {
	x.mu.Lock()
	x.aborted = true
	c, l := x.conn, x.leg
	x.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
	if l != nil {
		l.Abort()
	}
}

// Aborted reports whether Abort cut the exchange since Begin.
func (x *Exchange) Aborted() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.aborted
}

// Conn is the held connection when Dial made it (what a stream's watcher
// watches), else nil.
func (x *Exchange) Conn() *Conn {
	c, _ := x.conn.(*Conn)
	return c
}

// Do writes req on a connection of p and reads its answer into resp
// before deadline. With stream (resp.StreamBody) only the headers are read
// and the connection stays held: Read reads the body, Release ends it.
// Otherwise the whole answer is read and the connection goes back to the
// pool at once (closed after a failure). owner, if not nil, is the
// connection's owner while the answer is awaited (Conn.SetOwner).
func (x *Exchange) Do(p *Pool, req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time, owner Owner) error {
	// What fasthttp's HostClient.DoDeadline would set on its way to the
	// connection. A request
	// built in origin form with its Host header (the relay's) goes out as
	// built: parsing its URI would only derive both again (~0.3 µs a
	// request at 64 connections, docs/performance.md).
	if len(req.Header.Host()) == 0 {
		req.URI().DisablePathNormalizing = p.cfg.DisablePathNormalizing
	}
	if len(req.Header.UserAgent()) == 0 && p.cfg.Name != "" {
		req.Header.SetUserAgent(p.cfg.Name)
	}
	return x.do(p, (*fastRequest)(req), req.ConnectionClose(), resp, deadline, owner)
}

// RequestWriter is a request that writes itself on the connection
// (DoWriter): its head and body, as they are to go out, into the
// connection's writer, with nothing built aside first.
type RequestWriter interface {
	WriteRequest(bw *bufio.Writer) error
	// MaxRequestLen bounds what AppendRequest appends; 0: the request
	// only writes itself (WriteRequest).
	MaxRequestLen() int
	// AppendRequest appends the request, head and body, to b: on a
	// connection that holds its writes (Conn.HoldWrites) it is framed
	// where it is held, not written into the connection's writer and
	// copied from there again (Conn.holdRequest).
	AppendRequest(b []byte) []byte
}

// DoWriter is Do for a request that writes itself (RequestWriter); it
// keeps its connection open afterwards (it says no Connection: close).
func (x *Exchange) DoWriter(p *Pool, req RequestWriter, resp *fasthttp.Response, deadline time.Time, owner Owner) error {
	return x.do(p, req, false, resp, deadline, owner)
}

// fastRequest is a fasthttp request as Do writes it.
type fastRequest fasthttp.Request

func (r *fastRequest) WriteRequest(bw *bufio.Writer) error { return (*fasthttp.Request)(r).Write(bw) }

// MaxRequestLen and AppendRequest: fasthttp's request only writes itself.
func (r *fastRequest) MaxRequestLen() int            { return 0 }
func (r *fastRequest) AppendRequest(b []byte) []byte { return b }

// do is Do and DoWriter: req written on a connection of p, its answer read
// into resp; reqClose: the request asked for the connection's close.
func (x *Exchange) do(p *Pool, req RequestWriter, reqClose bool, resp *fasthttp.Response, deadline time.Time, owner Owner) error {
	wait := time.Until(deadline)
	if wait <= 0 {
		return fasthttp.ErrTimeout
	}
	if x.Aborted() {
		return ErrAborted
	}
	conn, err := p.acquire(wait)
	if err != nil {
		return err
	}
	x.mu.Lock()
	aborted := x.aborted
	if !aborted {
		x.conn = conn
	}
	x.mu.Unlock()
	if aborted {
		p.put(conn) // unused: still good
		return ErrAborted
	}
	x.held, x.pool, x.eof, x.closed = conn, p, false, false
	uc, _ := conn.(*Conn)
	if uc != nil && owner != nil {
		uc.SetOwner(owner)
	}
	// A connection Dial made has its own reader and writer; another (a
	// TLS client, a plain dial) takes pooled ones, as fasthttp would.
	var br *bufio.Reader
	x.pooledReader = uc == nil
	// Not resp.ParseNetConn(conn), as fasthttp's client does: nothing
	// asks an upstream answer for its addresses, and the two interface
	// calls come on every exchange.
	err = conn.SetWriteDeadline(deadline)
	if err == nil {
		var bw *bufio.Writer
		if uc != nil {
			// The request goes out with the wait for its answer (see
			// Conn.HoldWrites): no read that finds nothing.
			uc.HoldWrites()
			br, bw = uc.buffers(p.cfg.ReadBufferSize, p.cfg.WriteBufferSize)
		} else {
			bw = p.acquireWriter(conn)
		}
		if uc == nil || !uc.holdRequest(req) {
			if err = req.WriteRequest(bw); err == nil {
				err = bw.Flush()
			}
		}
		if uc == nil {
			p.releaseWriter(bw)
		}
	}
	if err == nil {
		if err = conn.SetReadDeadline(deadline); err == nil {
			if br == nil {
				br = p.acquireReader(conn)
			}
			err = x.readAnswer(br, resp, p.cfg.MaxResponseBodySize)
		}
	}
	if uc != nil && owner != nil {
		// Cleared before release below puts the connection back in the
		// pool, where another exchange may take it (and set its owner).
		uc.SetOwner(nil)
	}
	if err == io.EOF {
		// Closed before the first byte of the answer: named as fasthttp's
		// own exchange names it.
		err = fasthttp.ErrConnectionClosed
	}
	if err == nil && resp.StreamBody && resp.BodyStream() != nil {
		x.br, x.resp, x.body = br, resp, resp.BodyStream()
		x.closed = reqClose
		return nil
	}
	if br != nil && x.pooledReader {
		p.releaseReader(br)
	}
	x.closed = err != nil || reqClose || resp.ConnectionClose() || uc != nil && uc.Holding()
	if x.release(err) && err != nil {
		err = fmt.Errorf("%w: %w", ErrAborted, err)
	}
	return err
}

// Read reads the streamed answer's body (or the held leg's), noting its
// end.
func (x *Exchange) Read(p []byte) (int, error) {
	if x.leg != nil {
		n, err := x.leg.Read(p)
		if err == io.EOF {
			x.eof = true
		}
		return n, err
	}
	if x.body == nil {
		return 0, io.EOF
	}
	n, err := x.body.Read(p)
	if err == io.EOF {
		x.eof = true
	}
	return n, err
}

// InPlace reports whether the streamed answer's body can be read in place
// (Next): a chunked answer that the exchange's own decoder reads from the
// connection's reader.
func (x *Exchange) InPlace() bool {
	return x.leg == nil && x.body != nil && x.body == io.Reader(&x.chunked)
}

// Next returns the streamed answer's next data that has already arrived,
// up to the end of its chunk, without copying it (InPlace must be true):
// a slice of the connection reader's buffer, valid until the next Read or
// Next(true), which may read from the connection; the buffer's bytes
// before it, already read, may be written over until then. With wait, and
// nothing buffered, it first waits for the answer's next bytes. nil and no
// error: nothing more without a Read (the framing has not all arrived);
// io.EOF: the end, noted as Read notes it.
func (x *Exchange) Next(wait bool) ([]byte, error) {
	b, err := x.chunked.next(wait)
	if err == io.EOF {
		x.eof = true
	}
	return b, err
}

// MidChunk reports whether the streamed answer's current chunk has data
// that has not arrived yet (a chunked answer read by the exchange's own
// decoder): the engine framed the chunk whole, so the rest is on its way.
func (x *Exchange) MidChunk() bool {
	return x.leg == nil && x.body == io.Reader(&x.chunked) && x.chunked.left > 0
}

// Release ends a streamed exchange (a no-op otherwise): the body stream is
// closed, and the connection goes back to the pool if the stream was read
// to its end, else it is closed (the engine learns the answer is not
// wanted). resp is the caller's to release afterwards. A held leg is
// released instead.
func (x *Exchange) Release() {
	if x.leg != nil {
		x.mu.Lock()
		l := x.leg
		x.leg = nil
		x.mu.Unlock()
		l.Release()
		return
	}
	if x.resp == nil {
		return
	}
	_ = x.resp.CloseBodyStream()
	if x.pooledReader {
		x.pool.releaseReader(x.br)
	}
	x.closed = x.closed || !x.eof || x.resp.ConnectionClose()
	x.br, x.resp, x.body = nil, nil, nil
	x.chunked.reset(nil, nil)
	x.release(nil)
}

// readAnswer reads resp from br as resp.ReadLimitBody does. A head in its
// common form is the exchange's to read (readHead: fasthttp's parse also
// copies and normalizes every header the router never reads); a streamed answer in the chunked transfer coding gets
// x.chunked as its body stream instead of fasthttp's (whose pooled stream
// and per-chunk reads cost ~1 µs a stream at 64 connections,
// docs/performance.md). Any other head, and a unary answer's chunked body
// with its trailer, is read by fasthttp (readAnswerFasthttp), from its
// first byte.
func (x *Exchange) readAnswer(br *bufio.Reader, resp *fasthttp.Response, maxBodySize int) error {
	if resp.SkipBody {
		return resp.ReadLimitBody(br, maxBodySize)
	}
	ok, err := readHead(br, resp, resp.StreamBody)
	switch {
	case err != nil:
		return err
	case !ok:
		return x.readAnswerFasthttp(br, resp, maxBodySize)
	}
	if resp.StreamBody && resp.Header.ContentLength() == -1 {
		x.chunked.reset(br, &resp.Header)
		resp.SetBodyStream(&x.chunked, -1)
		return nil
	}
	// A Content-Length body (a stream's through fasthttp's body stream).
	return resp.ReadBody(br, maxBodySize)
}

// readAnswerFasthttp reads resp from br with fasthttp's head parser: all
// of a unary answer, a stream's head (interim answers skipped) with the
// body skipped, then a chunked stream's body through x.chunked and any
// other streamed body (a Content-Length, or until close) as fasthttp
// would.
func (x *Exchange) readAnswerFasthttp(br *bufio.Reader, resp *fasthttp.Response, maxBodySize int) error {
	if !resp.StreamBody {
		return resp.ReadLimitBody(br, maxBodySize)
	}
	resp.SkipBody = true
	err := resp.ReadLimitBody(br, maxBodySize)
	resp.SkipBody = false
	if err != nil || bodyless(resp.Header.StatusCode()) {
		return err
	}
	if resp.Header.ContentLength() != -1 { // not chunked
		return resp.ReadBody(br, maxBodySize)
	}
	x.chunked.reset(br, &resp.Header)
	resp.SetBodyStream(&x.chunked, -1)
	return nil
}

// bodyless reports whether an answer of status code carries no body
// whatever its headers say (1xx, 204, 304), as fasthttp decides it.
func bodyless(code int) bool {
	return code >= 100 && code < 200 || code == fasthttp.StatusNoContent || code == fasthttp.StatusNotModified
}

// release gives the held connection back (or closes it); err is the
// exchange's failure, if any. It reports whether the exchange was aborted.
func (x *Exchange) release(err error) bool {
	x.mu.Lock()
	aborted := x.aborted
	x.conn = nil
	x.mu.Unlock()
	c, p := x.held, x.pool
	x.held, x.pool = nil, nil
	if x.closed || aborted || err != nil {
		p.discard(c)
	} else if c.SetDeadline(time.Time{}) != nil {
		p.discard(c)
	} else {
		p.put(c)
	}
	return aborted
}
