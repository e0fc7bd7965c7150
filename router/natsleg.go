package router

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/natsreq"
	"github.com/infera/infera/router/upstream"
)

// Requests over NATS (--request-transport nats). A worker whose record
// says request_transport nats is routable when the router has a NATS
// client (Config.NATSRequests); each of its legs is then an attempt like
// any other whose exchange travels as a natsreq envelope instead of an
// HTTP request (attempt.exchange branches here): the attempt's
// upstream.Exchange holds the leg (Hold), so that aborting the exchange
// (a client that left, the other half of a pair) cancels it, and
// releasing it ends it (natsreq publishes the inbox to the worker's
// cancel subject unless the worker finished). The answer is shaped as the
// relay reads an HTTP answer: a stream whose first data frame is not a
// JSON object is a 200 event stream read frame by frame through the
// exchange (with the attempt's deadlines and heartbeats, as upstream.Conn
// runs them); anything else is read whole up to its done frame, whose
// rs-status is the answer's status. Failures before the answer are
// classified as HTTP ones (timeouts as timeouts, error frames as upstream
// errors), so failover moves the request to another worker.
//
// A disaggregated pair goes over NATS only when its protocol is
// concurrent and both workers take NATS (pdOverNATS); serial-pull
// protocols stay on HTTP, as the reference does (the record's URL is the
// engine's). Both legs' backlogs are checked first: either full is 429
// with the PD body, no retry.
//
// With --nats-req-max-pending a worker whose JetStream backlog reached it
// is skipped at pick (backlogged); when every untried candidate is, the
// client gets the reference's 429.

// unroutable is discovery.Record.Unroutable for a router that does (nats)
// or does not speak NATS.
func unroutable(rec *discovery.Record, nats bool) string {
	if nats && rec.RequestTransport == config.RequestTransportNATS {
		if rec.Status == discovery.StatusDead {
			return "unroutable: status dead"
		}
		return ""
	}
	return rec.Unroutable()
}

func (r *Router) unroutable(rec *discovery.Record) string {
	return unroutable(rec, r.cfg.NATSRequests != nil)
}

// active is discovery.Record.Active for this router.
func (r *Router) active(rec *discovery.Record) bool {
	return (rec.Status == discovery.StatusActive || rec.Status == "") && r.unroutable(rec) == ""
}

// overNATS reports whether w takes its requests over NATS from this router.
func (r *Router) overNATS(w *Worker) bool {
	if r.cfg.NATSRequests == nil {
		return false
	}
	rec := w.Record()
	return rec != nil && rec.RequestTransport == config.RequestTransportNATS
}

// backlogged reports whether w, a worker over NATS with admission, has a
// backlog at the limit (natsreq.Client.Admit: the cached backlog, read
// again in the background every 200 ms; unreadable or unknown = admit).
// It never waits on NATS.
func (r *Router) backlogged(w *Worker) bool {
	return r.overNATS(w) && !r.cfg.NATSRequests.Admit(w.id)
}

// errBacklog: every untried candidate's backlog is over the limit.
var errBacklog = errors.New("router: worker request backlog over limit")

// backlogError is errBacklog naming the last worker refused (pd: a leg
// of a disaggregated pair).
type backlogError struct {
	worker string
	pd     bool
}

func (e *backlogError) Error() string {
	return "router: worker " + e.worker + " request backlog over limit"
}
func (e *backlogError) Is(target error) bool { return target == errBacklog }

// failBacklog answers a request every candidate refused for its backlog:
// 429, Retry-After: 1 and the reference's body.
func (rel *relay) failBacklog(be *backlogError) {
	ctx := rel.ctx
	rel.echoID()
	ctx.Response.Header.Set("Retry-After", natsreq.RetryAfter)
	ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	ctx.SetContentType("application/json")
	if be.pd {
		ctx.Response.SetBodyString(natsreq.PDBacklogBody)
	} else {
		ctx.Response.SetBodyRaw(natsreq.AppendBacklogBody(ctx.Response.Body()[:0], be.worker))
	}
	rel.r.metrics.rejected[rejected429].Inc()
	rel.r.finish(rel, outcomeTooManyRequests, fasthttp.StatusTooManyRequests)
}

// natsTimeout marks a NATS deadline as a timeout for classify.
type natsTimeout struct{ err error }

func (e natsTimeout) Error() string { return e.err.Error() }
func (e natsTimeout) Unwrap() error { return e.err }
func (e natsTimeout) Timeout() bool { return true }

// errNATSDeadline is a watched read that hit the attempt's deadline.
var errNATSDeadline = natsTimeout{errors.New("router: no frame from the worker over nats before the deadline")}

// natsError maps an exchange's failure for classify.
func natsError(err error) error {
	if errors.Is(err, natsreq.ErrIdleTimeout) || errors.Is(err, natsreq.ErrTotalTimeout) {
		return natsTimeout{err}
	}
	return err
}

// natsLeg is one request over NATS held by an attempt's exchange. Read
// and Release run on the leg's goroutine, Abort on any.
type natsLeg struct {
	a        *attempt
	nx       *natsreq.Exchange
	cancel   context.CancelFunc
	buf      []byte // the current data frame's unread bytes
	err      error  // the read error once the frames ended (io.EOF after done)
	released bool
}

// Abort implements upstream.Leg: the exchange's context ends, its wait
// fails and Release cancels the worker's request.
func (l *natsLeg) Abort() { l.cancel() }

// Release implements upstream.Leg: unless the worker finished, it is told
// to cancel (natsreq.Exchange.Close).
func (l *natsLeg) Release() {
	if l.released {
		return
	}
	l.released = true
	l.nx.Close()
	l.cancel()
}

// Read implements upstream.Leg: a stream's bytes, frame by frame, under
// the attempt's stream deadlines and heartbeats.
func (l *natsLeg) Read(p []byte) (int, error) {
	for len(l.buf) == 0 {
		if l.err != nil {
			return 0, l.err
		}
		f, err := l.nextWatched()
		switch {
		case err != nil:
			l.err = natsError(err)
		case f.Type == natsreq.TypeDone:
			l.err = io.EOF
		default:
			l.buf = f.Data
		}
	}
	n := copy(p, l.buf)
	l.buf = l.buf[n:]
	return n, nil
}

// nextWatched waits for the next frame as upstream.Conn.Read waits for the
// next bytes of a watched stream: heartbeats every beat of silence, the
// attempt's hard deadline.
func (l *natsLeg) nextWatched() (natsreq.Frame, error) {
	a := l.a
	now := time.Now()
	hard, every := a.BeforeRead(now)
	beat := now.Add(every)
	for {
		dl, isBeat := hard, false
		if every > 0 && beat.Before(hard) {
			dl, isBeat = beat, true
		}
		t := time.NewTimer(time.Until(dl))
		f, err := l.nx.NextBefore(t.C)
		t.Stop()
		if !errors.Is(err, natsreq.ErrNoFrameYet) {
			if err == nil {
				a.ticket.Worker.stall.noteProgress(time.Now().UnixNano())
			}
			return f, err
		}
		if !isBeat {
			a.NoteReadTimeout()
			return f, errNATSDeadline
		}
		if herr := a.Heartbeat(); herr != nil {
			return f, herr
		}
		beat = beat.Add(every)
	}
}

// exchangeNATS is attempt.exchange over NATS: it publishes req's envelope
// to a's worker and returns the answer as an HTTP one, within deadline
// (the first frame of a stream, the whole unary answer), giving up a
// worker confirmed stalled (stall.go) as an HTTP exchange does.
func (a *attempt) exchangeNATS(req *fasthttp.Request, deadline time.Time, stream bool, owner upstream.Owner) (*fasthttp.Response, error) {
	w := a.ticket.Worker
	if time.Until(deadline) <= 0 {
		return nil, fasthttp.ErrTimeout
	}
	if a.x.Aborted() {
		return nil, upstream.ErrAborted
	}
	// A stream is migratable: a draining worker hands it back (the
	// drain notice, an error frame) instead of cancelling it, and the
	// router continues it elsewhere like any stream that broke.
	env := natsreq.Envelope{Path: string(req.URI().RequestURI()), Stream: stream, Headers: natsHeaders(req), Body: req.Body(), Migratable: stream}
	ctx, cancel := context.WithCancel(context.Background())
	nx, err := a.rel.r.cfg.NATSRequests.ExchangeBy(ctx, w.id, &env, deadline)
	if err != nil {
		cancel()
		if errors.Is(err, natsreq.ErrPublishTimeout) {
			err = fasthttp.ErrTimeout // a NATS outage: the first-byte deadline
		}
		return nil, err
	}
	l := &natsLeg{a: a, nx: nx, cancel: cancel}
	a.x.Hold(l)
	resp := fasthttp.AcquireResponse()
	// The wait wakes every stall tick, as upstream.Conn's unwatched read
	// does: a worker confirmed stalled is given up after a stall window,
	// unless owner (a unary request) has no retry left.
	start := time.Now()
	tick := w.prog.StallTick()
	var body []byte
	for {
		dl, isTick := deadline, false
		if now := time.Now(); tick > 0 && now.Add(tick).Before(deadline) {
			dl, isTick = now.Add(tick), true
		}
		t := time.NewTimer(time.Until(dl))
		f, err := nx.NextBefore(t.C)
		t.Stop()
		if errors.Is(err, natsreq.ErrNoFrameYet) && isTick {
			if gerr := w.prog.GiveUp(time.Now(), start); gerr == nil || owner != nil && !owner.CanRetry() {
				continue
			}
			err = errAttemptStalled
		}
		if err != nil {
			switch {
			case errors.Is(err, errAttemptStalled):
			case errors.Is(err, natsreq.ErrNoFrameYet):
				err = fasthttp.ErrTimeout
			case ctx.Err() != nil:
				err = upstream.ErrAborted // before Release ends ctx
			default:
				err = natsError(err)
			}
			a.x.Release()
			fasthttp.ReleaseResponse(resp)
			return nil, err
		}
		w.stall.noteProgress(time.Now().UnixNano())
		if f.Type == natsreq.TypeDone {
			a.x.Release()
			resp.SetStatusCode(f.Status)
			resp.Header.SetContentType("application/json")
			resp.SetBodyRaw(body)
			return resp, nil
		}
		if stream && body == nil && len(f.Data) > 0 && f.Data[0] != '{' {
			// An event stream: the relay reads the rest through a.x.
			resp.SetStatusCode(fasthttp.StatusOK)
			resp.Header.SetContentType("text/event-stream")
			l.buf = f.Data
			resp.SetBodyStream(l, -1)
			return resp, nil
		}
		if len(body)+len(f.Data) > maxUnaryResponseBytes {
			a.x.Release()
			fasthttp.ReleaseResponse(resp)
			return nil, errUnaryTooLarge
		}
		body = append(body, f.Data...)
	}
}

// natsHeaders are req's headers as the envelope carries them (what the
// worker sets on its request to the engine).
func natsHeaders(req *fasthttp.Request) map[string]string {
	h := make(map[string]string, 8)
	for k, v := range req.Header.All() {
		switch string(k) {
		case fasthttp.HeaderHost, fasthttp.HeaderContentLength, fasthttp.HeaderConnection:
			continue
		}
		h[string(k)] = string(v)
	}
	return h
}

// pdOverNATS decides, once a pair and its protocol are known, whether its
// legs travel over NATS: a concurrent protocol with both workers on NATS.
// Either worker's backlog at the limit refuses the request (no retry).
func (rel *relay) pdOverNATS() error {
	pd, r := rel.pd, rel.r
	p, d := pd.pre.ticket.Worker, rel.att.ticket.Worker
	if pd.proto.topology != pdConcurrent || !r.overNATS(p) || !r.overNATS(d) {
		return nil
	}
	for _, w := range [...]*Worker{p, d} {
		if r.backlogged(w) {
			return &backlogError{worker: w.id, pd: true}
		}
	}
	pd.pre.nats, rel.att.nats = true, true
	return nil
}
