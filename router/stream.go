package router

import (
	"errors"
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/natsreq"
	"github.com/infera/infera/openai"
)

// attach makes resp the stream of attempt a and has its connection watch
// a (stream deadlines and heartbeats, see upstream.Conn).
func (rel *relay) attach(a *attempt, resp *fasthttp.Response) {
	a.resp, a.src = resp, a.x
	rel.pump.transform = rel.dialect.event
	rel.pump.usage.want = rel.wantUsage() // the divergence alarm (kvdivergence.go)
	rel.pump.end = rel
	if rel.dialect.stream {
		if !rel.firstByte {
			rel.xlate.Reset() // a continuation goes on with the client's stream
		}
		rel.pump.transform = rel.xlateEvent
	}
	rel.pump.lead = nil
	if rel.mig.on {
		rel.pump.transform = rel.trackEvent // migrate.go: then the dialect's
		rel.pump.lead = rel.trackLead()
	}
	if c := a.x.Conn(); c != nil {
		a.conn = c
		a.watch.Watcher = a
		c.Watch(&a.watch)
	}
}

// BeforeRead: the attempt's stream deadline, and heartbeats while the
// relay writes to its client; it also pushes the client's write deadline.
// Until the first event, with stall detection on, the beat also comes every
// stall tick, so that a stuck stream gives up its worker (heartbeat).
func (a *attempt) BeforeRead(now time.Time) (time.Time, time.Duration) {
	rel := a.rel
	r := rel.r
	rel.keepWriting(now)
	var beat time.Duration
	if rel.w != nil {
		beat = r.cfg.HeartbeatInterval
		a.nextBeat = now.Add(beat)
	}
	if r.cfg.StallWindow > 0 && !rel.firstByte {
		if t := r.stallTick(); beat == 0 || t < beat {
			beat = t
		}
	}
	return a.readDeadline(now), beat
}

// heartbeat runs at every beat of silence: it gives up a stuck worker
// (errAttemptStalled), and writes the SSE comment when one is due.
func (a *attempt) Heartbeat() error {
	rel := a.rel
	now := time.Now()
	if a.stuck(now) {
		a.stalledOut = true
		return errAttemptStalled
	}
	if rel.w == nil || now.Before(a.nextBeat) {
		return nil
	}
	a.nextBeat = a.nextBeat.Add(rel.r.cfg.HeartbeatInterval)
	return rel.heartbeat()
}

func (a *attempt) NoteReadTimeout() { a.readTimedOut = true }

// readDeadline is the hard deadline of the next upstream read of a
// stream: the first-byte deadline of the attempt until the first event
// went out, then the idle timeout from now; never past the request's.
func (a *attempt) readDeadline(now time.Time) time.Time {
	rel := a.rel
	var dl time.Time
	if rel.firstByte {
		dl = now.Add(rel.r.cfg.StreamIdleTimeout)
	} else {
		dl = a.start.Add(rel.r.cfg.TTFTTimeout)
	}
	if rel.deadline.Before(dl) {
		return rel.deadline
	}
	return dl
}

// heartbeat is an SSE comment: clients ignore it, and writing it is how a
// silent stream learns that its client is gone.
var heartbeat = []byte(": keep-alive\n\n")

// heartbeat writes one SSE comment to the client, between events (never
// inside one). A failed write is remembered: WriteTo ends the stream.
func (rel *relay) heartbeat() error {
	if rel.w == nil || rel.pump.midEvent {
		return nil
	}
	if _, err := rel.w.Write(heartbeat); err != nil {
		rel.clientErr = err
		return err
	}
	return nil
}

// holdBatch holds the events about to be written until the next write
// (frontConn.holdOnce, writehold.go): the engine's chunk they came in has
// not all arrived.
func (rel *relay) holdBatch() { rel.chunks.holdOnce() }

// keepWriting pushes the client connection's write deadline forward while a
// stream runs, so that ClientWriteTimeout bounds one stalled write rather
// than the whole stream. It runs at most every quarter of the timeout.
func (rel *relay) keepWriting(now time.Time) {
	d := rel.r.cfg.ClientWriteTimeout
	if rel.ctx == nil || now.Sub(rel.wdlAt) < d/4 {
		return
	}
	rel.wdlAt = now
	if c := rel.ctx.Conn(); c != nil {
		_ = c.SetWriteDeadline(now.Add(d))
	}
}

// The relay as fasthttp's response body stream.

// SupportsBodyWriteTo lets fasthttp hand WriteTo its chunked writer instead
// of copying through Read.
func (rel *relay) SupportsBodyWriteTo() bool { return true }

// WriteTo relays the upstream SSE stream to w event by event (see
// eventPump). A failed write (or heartbeat) means the client is gone: the
// upstream body is closed at once, which closes the worker connection so
// that the engine stops generating. A worker that fails before the first
// event reached the client — the stream ends, breaks or times out — is
// replaced by another (failover): the client has only seen headers and
// heartbeat comments. After the first event a failure ends the stream with
// one SSE error event, since the status line went out long ago.
func (rel *relay) WriteTo(w io.Writer) (int64, error) {
	rel.done = true // every return below ends the stream and sets the outcome
	if rel.chunks != nil {
		w = (*chunkWriter)(rel.chunks)
		if rel.r.cfg.HeartbeatInterval > 0 {
			// A batch held for the rest of its chunk goes out with the
			// next heartbeat at the latest (writehold.go).
			rel.pump.hold = rel
		}
		if rel.ownHead {
			rel.addHeadLines(rel.chunks)
			if rel.headNow {
				if err := rel.chunks.sendHead(); err != nil {
					rel.outcome, rel.err = outcomeClientGone, err
					rel.closeUpstream(&rel.att)
					return 0, err
				}
			}
		}
	}
	rel.w = w
	defer func() { rel.w = nil }()
	a := &rel.att
	var total int64
	for {
		n, rerr, werr := rel.pump.step(w, a.src)
		total += int64(n)
		if n > 0 && !rel.firstByte {
			rel.firstByte = true
			rel.traceFirstByte() // tracing.go
			rel.r.metrics.ttft[rel.route].Observe(time.Since(rel.start).Seconds())
			if w := a.ticket.Worker; w != nil {
				w.stall.noteServed(a.start.UnixNano(), a.ticket.State)
			}
		}
		if werr == nil && rel.clientErr != nil {
			werr = rel.clientErr
		}
		if werr != nil {
			rel.outcome, rel.err = outcomeClientGone, werr
			rel.closeUpstream(a)
			return total, werr
		}
		if rerr == nil {
			continue
		}
		if rerr == io.EOF && (rel.firstByte || rel.pump.n > 0) && rel.streamComplete() {
			// A last event without its blank line goes out as it is,
			// with the closing chunk; a closing chunk that came alone
			// (the engine wrote its last events apart from it) is held
			// too: on the goroutine door it then goes out from inside
			// the wait for the next request, with no read that finds
			// nothing first, as the end does when it comes with events.
			rel.holdLast()
			k, err := rel.pump.flush(w)
			total += int64(k)
			if err == nil {
				err = rel.sendEnd()
			}
			if err != nil {
				rel.outcome, rel.err = outcomeClientGone, err
				return total, err
			}
			rel.outcome = statusOutcome(rel.status)
			return total, nil
		}
		rel.unhold() // what follows goes out as it comes (never held in practice: see atEnd)
		why := reasonStreamEnded
		switch {
		case rerr == io.EOF && rel.firstByte:
			rerr = errStreamCut
		case rerr == io.EOF:
			rerr = errStreamEnded
		default:
			why = a.classify(rerr)
		}
		if rel.firstByte && why == reasonUpstreamError {
			why = reasonStreamError
		}
		rel.mig.broken = a.ticket.Worker // for a continuation (migrate.go)
		rel.mig.drained = errors.Is(rerr, natsreq.ErrDraining)
		rel.closeUpstream(a)
		a.fail(why, rerr)
		v := verdictFault
		if errors.Is(rerr, natsreq.ErrDraining) {
			v = verdictNeutral // a draining worker handed the stream back: not its fault
		}
		rel.endAttempt(a, a.status, rerr, v)
		// Before the first event: another worker's stream; after it: a
		// continuation (migrate.go), when the stream may be continued.
		if ok, _ := rel.failover(rerr); ok {
			continue
		}
		if rel.continuing() {
			rel.migrationFailed()
		}
		rel.outcome, rel.err = outcomeStreamError, rel.lastErr
		k, err := w.Write(rel.errorEvent())
		total += int64(k)
		return total, err
	}
}

// atEnd: the read that met the end of the stream completed the events the
// pump writes next (eventPump.end). When they complete the stream (WriteTo
// then ends it), only the response's closing chunk can follow them: the
// client connection holds them, and WriteTo sends both in one write
// (sendEnd, writehold.go). They are not empty (a transform may drop
// every event: see step), so that they are the client's first event if
// no other came before, and WriteTo takes its success path.
func (rel *relay) atEnd() {
	if rel.streamComplete() {
		rel.holdLast()
	}
}

// holdLast holds the client connection's last writes, when it is the front
// door's: for its next read on the goroutine front door (frontheld.go: no
// read that finds nothing after the answer), or else until sendEnd (or,
// on a path that does not end the stream, unhold).
func (rel *relay) holdLast() {
	if rel.held != nil {
		return
	}
	if fc, ok := rel.clientConn(); ok {
		if fc.holdForRead() {
			return // sent from inside the wait for the next request (frontheld.go)
		}
		fc.holdWrites()
		rel.held = fc
	}
}

// sendEnd sends what holdLast held (holdWrites) with the response's
// closing chunk, at once (writehold.go): the client has the whole stream
// before the request's bookkeeping (Close) and fasthttp's work after the
// handler. Only a chunked answer without trailers ends with the closing
// chunk sendEnd writes; the relay's streams are one (SetBodyStream, size
// -1).
func (rel *relay) sendEnd() error {
	fc := rel.held
	if fc == nil {
		return nil
	}
	rel.held = nil
	return fc.sendEnd()
}

// unhold ends holdLast: the connection's next write (the closing chunk's
// flush, after Close) sends what it held.
func (rel *relay) unhold() {
	if rel.held != nil {
		rel.held.releaseHold()
		rel.held = nil
	}
}

// errorEvent renders the SSE error event that ends a failed stream, into
// the pump's buffer (the incomplete event there is dropped: half a JSON
// chunk helps no one), in the route's dialect.
func (rel *relay) errorEvent() []byte {
	rel.pump.n = 0
	code, msg := "upstream_stream_error", "worker failed mid-stream: "
	switch {
	case rel.lastWhy == reasonTTFTTimeout || rel.lastWhy == reasonIdleTimeout || rel.lastWhy == reasonRequestTimeout:
		code, msg = "upstream_timeout", "worker timed out: "
	case !rel.firstByte:
		code, msg = "upstream_error", "no worker produced the stream: "
	}
	if pm, ok := rel.pdStreamError(); ok {
		return rel.dialect.errorEvent(rel.pump.buf[:0], pm, openai.TypeServer, "prefill_failed")
	}
	return rel.dialect.errorEvent(rel.pump.buf[:0], msg+rel.lastErr.Error(), openai.TypeServer, code)
}

// Read is the plain fallback should fasthttp read the body instead of
// calling WriteTo: bytes pass through unchanged.
func (rel *relay) Read(p []byte) (int, error) {
	src := rel.att.src
	if src == nil {
		return 0, io.EOF
	}
	n, err := src.Read(p)
	if n > 0 && !rel.firstByte {
		rel.firstByte = true
		rel.r.metrics.ttft[rel.route].Observe(time.Since(rel.start).Seconds())
	}
	switch {
	case err == io.EOF:
		rel.done, rel.outcome = true, statusOutcome(rel.status)
	case err != nil:
		rel.done, rel.outcome, rel.err = true, outcomeStreamError, err
	}
	return n, err
}

// Close ends a streamed request; fasthttp calls it once the body is written
// or abandoned. Its bookkeeping (finish) waits for the stream's end when the
// client connection holds that for its next read (putOff).
func (rel *relay) Close() error {
	if rel.ownHead {
		rel.addHeadLines(rel.chunks) // WriteTo did not run
	}
	rel.unhold()
	if fc := rel.chunks; fc != nil {
		rel.chunks = nil
		// Headers still held: WriteTo did not run (a HEAD request, a
		// client gone first), the outcome says so.
		_ = fc.sendHead()
	}
	if !rel.done {
		// Closed before the stream ended: the client went away (or the
		// server is shutting down) before fasthttp could write it.
		rel.outcome = outcomeClientGone
	}
	rel.closeUpstream(&rel.att)
	if fc, ok := rel.clientConn(); ok && fc.putOff(rel) {
		return nil // finished once the stream's held end is out (frontheld.go)
	}
	rel.r.finish(rel, rel.outcome, rel.status)
	return nil
}

// closeUpstream closes attempt a's body stream; unless it was read to the
// end this closes the connection, which is how the engine learns the
// client is gone (or that its attempt timed out).
func (rel *relay) closeUpstream(a *attempt) {
	if a.conn != nil {
		// Before the connection can go back to the pool.
		a.conn.Watch(nil)
		a.conn = nil
	}
	if a.resp == nil {
		return
	}
	a.dropResponse(a.resp)
	a.resp, a.src = nil, nil
}

// eventPump moves an SSE stream from src to dst one read at a time: every
// complete event in the buffer goes out in one write as soon as it is
// complete (fasthttp's chunked writer flushes each write), an incomplete
// one waits for its next bytes. A source that says what it already holds
// (bufferedSource: the upstream exchange) is read on while it holds bytes,
// so that what the engine sent at once leaves in one write, and when that
// read meets the end of the stream, end is told before the write (the
// relay then sends it with the response's closing chunk). With a transform
// (the route dialect's event translation) each complete event goes through
// it first, into out.
// Nothing is allocated once out has grown to the stream's batch size.
type eventPump struct {
	buf []byte
	n   int // bytes buffered: the start of an incomplete event
	// midEvent: part of an oversized event went out, the rest has not;
	// nothing else (a heartbeat) may be written in between.
	midEvent bool

	// transform rewrites one complete event, appending to dst; nil: none.
	// Without one, an event larger than buf passes through in pieces;
	// with one, buf grows to hold it whole (up to maxTransformEvent).
	transform func(dst, ev []byte) []byte
	// lead, if not nil, goes with a transform whose copy of an event is
	// never longer than the event (a tracked stream's: ids cut out): it
	// transforms the event at the start of buf without the pump
	// delimiting it first, appending to dst, and returns its length (0:
	// not such an event; the pump delimits it and calls transform). With
	// a lead, the events' copies are written over the bytes they were
	// read from, not into out.
	lead  leader
	out   []byte   // transformed events of one step (pooled)
	usage usageTap // the divergence alarm (kvdivergence.go)
	// end, if not nil, is told when a read met the end of the stream,
	// before the events that read completed are written.
	end streamEnd
	// hold, if not nil, is told before a write of events whose engine
	// chunk has not all arrived (midChunker): it may hold them for the
	// next write (relay.holdBatch).
	hold batchHolder
}

// batchHolder holds the events about to be written for the next write
// (the relay: holdBatch).
type batchHolder interface{ holdBatch() }

// midChunker is a stream source that says whether the chunk it is
// reading has data still to arrive (upstream.Exchange.MidChunk).
type midChunker interface{ MidChunk() bool }

// leader is an eventPump's lead: AppendNext transforms the event at the
// start of buf (see eventPump.lead). A tracked stream's is its
// continuation.Tracker, called through the interface: a method value
// (track.AppendNext) would add its wrapper's call to every event.
type leader interface {
	AppendNext(dst, buf []byte) ([]byte, int)
}

// bufferedSource is a stream source that says how many bytes it holds
// already read (upstream.Exchange): while it holds some, step reads on
// before it writes.
type bufferedSource interface{ Buffered() int }

// inPlaceSource is a stream source whose bytes can be read where they
// arrived, without a copy into the pump's buffer (upstream.Exchange: a
// chunked answer's data in the connection's reader; see stepInPlace).
type inPlaceSource interface {
	bufferedSource
	InPlace() bool
	Next(wait bool) ([]byte, error)
}

// streamEnd is told by the pump when the end of the stream came with the
// events about to be written (the relay: see atEnd).
type streamEnd interface{ atEnd() }

// reset empties the pump in place, keeping its buffers.
func (p *eventPump) reset() {
	buf, out := p.buf, p.out[:0]
	if len(buf) > relayBufSize {
		// Grown for one oversized translated event: not kept in the pool.
		buf, out = make([]byte, relayBufSize), nil
	}
	*p = eventPump{}
	p.buf, p.out = buf, out
}

// maxTransformEvent bounds one event a transform must see whole; a larger
// one ends the stream with an error event.
const maxTransformEvent = 16 << 20

var errEventTooLarge = errors.New("worker stream event exceeds " + itoa(maxTransformEvent) + " bytes")

// step does one read (with what the source already holds) and the write it
// enables. It returns the bytes written, the read error (io.EOF at the end)
// and the write error.
func (p *eventPump) step(dst io.Writer, src io.Reader) (written int, readErr, writeErr error) {
	if p.n == 0 && p.transform != nil {
		if s, ok := src.(inPlaceSource); ok && s.InPlace() {
			if written, readErr, writeErr, ok = p.stepInPlace(dst, s); ok {
				return written, readErr, writeErr
			}
		}
	}
	if p.n == len(p.buf) && p.transform != nil {
		// A translated event must be whole: the buffer grows for it (up
		// to maxTransformEvent; reuse shrinks it back).
		if len(p.buf) >= maxTransformEvent {
			return written, errEventTooLarge, nil
		}
		p.buf = append(p.buf, make([]byte, len(p.buf))...)
	}
	if p.n == len(p.buf) {
		// One event larger than the whole buffer: pass on what there is.
		// The bytes stay exact; only the flush falls inside the event.
		k, err := dst.Write(p.buf[:p.n])
		p.n = 0
		p.midEvent = true
		if err != nil {
			return k, nil, err
		}
		written = k
	}
	m, readErr := src.Read(p.buf[p.n:])
	if m <= 0 {
		return written, readErr, nil
	}
	p.n += m
	if b, ok := src.(bufferedSource); ok {
		// What the engine has already sent goes out in one write, and a
		// stream whose end is already here ends with it (see streamEnd).
		for readErr == nil && p.n < len(p.buf) && b.Buffered() > 0 {
			m, readErr = src.Read(p.buf[p.n:])
			p.n += m
		}
	}
	end := 0
	out := p.out[:0]
	lead := p.lead
	if lead != nil && p.usage.want {
		lead = nil // the alarm reads each event whole, before its transform
	}
	// inPlace: the events' copies are written over the bytes before the
	// event being read (never longer than their events, so they never
	// reach it); a tracked stream's bytes are moved once, in cache.
	inPlace := lead != nil
	if inPlace {
		out = p.buf[:0]
	}
	for {
		if lead != nil {
			var k int
			if out, k = lead.AppendNext(out, p.buf[end:p.n]); k > 0 {
				end += k
				continue
			}
		}
		k := openai.NextEvent(p.buf[end:p.n])
		if k < 0 {
			break
		}
		p.usage.note(p.buf[end : end+k]) // the divergence alarm (kvdivergence.go)
		if p.transform != nil {
			if inPlace {
				// Capped at the event's end: a copy that broke the
				// promise would be appended elsewhere (a new array, the
				// copies before it moved along), never over unread bytes.
				out = out[: len(out) : end+k]
			}
			out = p.transform(out, p.buf[end:end+k])
			switch {
			case !inPlace:
			case len(out) <= end+k: // appended in place: the next may go past the event
				out = p.buf[:len(out)]
			default:
				inPlace = false
			}
		}
		end += k
	}
	if end == 0 {
		return written, readErr, nil
	}
	chunk := p.buf[:end]
	if p.transform != nil {
		chunk = out
		if !inPlace {
			p.out = out[:0]
		}
	}
	k, err := p.send(dst, chunk, readErr)
	written += k
	if err != nil {
		return written, readErr, err
	}
	p.n = copy(p.buf, p.buf[end:p.n])
	return written, readErr, nil
}

// send writes one step's events: the end of the stream, when the read met
// it, is told first (streamEnd).
func (p *eventPump) send(dst io.Writer, chunk []byte, readErr error) (int, error) {
	if readErr == io.EOF && p.end != nil && len(chunk) > 0 {
		p.end.atEnd()
	}
	k, err := dst.Write(chunk)
	p.midEvent = false
	return k, err
}

// stepInPlace is step for a source read in place (inPlaceSource), with a
// transform and nothing buffered in the pump: the events are delimited and
// transformed where they arrived, in the upstream connection's reader,
// and with a lead (a tracked stream) their copies are written over the
// bytes already read there, the chunks' framing included, so that the
// batch is one run of bytes; without the copy of every byte into the
// pump's buffer first. A piece that ends inside an event is copied into
// the pump's buffer, and step goes on from there as usual. It returns
// false, having read nothing, when the source has no data in place to
// give (its framing has not all arrived): step reads the usual way.
func (p *eventPump) stepInPlace(dst io.Writer, src inPlaceSource) (written int, readErr, writeErr error, ok bool) {
	piece, readErr := src.Next(true)
	if len(piece) == 0 {
		if readErr != nil {
			return 0, readErr, nil, true
		}
		return 0, nil, nil, false
	}
	lead := p.lead
	if lead != nil && p.usage.want {
		lead = nil // the alarm reads each event whole, before its transform
	}
	// base is the first piece's start, where in-place copies begin: the
	// later pieces lie after it in the same buffer (nothing is read from
	// the connection before the write), at cap(base)-cap(piece).
	base := piece
	inPlace := lead != nil
	out := p.out[:0]
	if inPlace {
		out = base[:0]
	}
	var tail []byte // an incomplete event: copied into buf for the next step
	for len(piece) > 0 {
		off := cap(base) - cap(piece)
		end := 0
		for {
			if lead != nil {
				var k int
				if out, k = lead.AppendNext(out, piece[end:]); k > 0 {
					end += k
					continue
				}
			}
			k := openai.NextEvent(piece[end:])
			if k < 0 {
				break
			}
			ev := piece[end : end+k]
			p.usage.note(ev) // the divergence alarm (kvdivergence.go)
			if inPlace {
				out = out[: len(out) : off+end+k] // see step: never over unread bytes
			}
			out = p.transform(out, ev)
			switch {
			case !inPlace:
			case len(out) <= off+end+k:
				out = base[:len(out)]
			default:
				inPlace = false
			}
			end += k
		}
		if end < len(piece) {
			tail = piece[end:]
			break
		}
		if piece, readErr = src.Next(false); readErr != nil {
			break
		}
	}
	if len(tail) > 0 {
		// What has arrived of the event (and nothing of what follows,
		// still in the source) goes to the pump's buffer, before a
		// read may reuse the source's.
		if len(tail) > len(p.buf) {
			p.buf = make([]byte, len(tail)+relayBufSize)
		}
		p.n = copy(p.buf, tail)
	}
	if !inPlace {
		p.out = out[:0]
	}
	if len(out) == 0 {
		return 0, readErr, nil, true
	}
	if readErr == nil && p.hold != nil {
		if m, ok := src.(midChunker); ok && m.MidChunk() {
			p.hold.holdBatch() // the rest of the chunk is on its way
		}
	}
	written, writeErr = p.send(dst, out, readErr)
	return written, readErr, writeErr, true
}

// flush writes what is buffered (a last event without its blank line),
// through the transform if any.
func (p *eventPump) flush(dst io.Writer) (int, error) {
	if p.n == 0 {
		return 0, nil
	}
	chunk := p.buf[:p.n]
	p.n = 0
	if p.transform != nil {
		p.out = p.transform(p.out[:0], chunk)
		chunk = p.out
	}
	return dst.Write(chunk)
}
