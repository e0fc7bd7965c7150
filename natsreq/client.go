package natsreq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Errors of an exchange. ErrIdleTimeout and ErrTotalTimeout map to 504,
// ErrWorker (an rs-type error frame) and ErrTransport to 502; before the
// first byte all of them are retryable on another worker.
var (
	ErrIdleTimeout  = errors.New("natsreq: no reply within the idle timeout")
	ErrTotalTimeout = errors.New("natsreq: request exceeded the total timeout")
	ErrWorker       = errors.New("natsreq: worker error")
	ErrTransport    = errors.New("natsreq: transport error")
	ErrDraining     = errors.New("natsreq: worker draining")
	// ErrNoResponders: nobody takes requests on the worker's subject (a
	// worker gone, or draining, on core NATS): the server's no-responders
	// status came back at once. An ErrTransport.
	ErrNoResponders = fmt.Errorf("%w: no worker subscribed to the request subject", ErrTransport)
	ErrClosed       = errors.New("natsreq: client closed")
	// ErrPublishTimeout: the JetStream publish was not acknowledged by
	// ExchangeBy's deadline.
	ErrPublishTimeout = errors.New("natsreq: request not acknowledged by the stream before the deadline")
)

// ClientConfig configures the router's side.
type ClientConfig struct {
	IdleTimeout time.Duration // reset per frame; 0 = none
	MaxDuration time.Duration // whole request; 0 = none
	// MaxPending > 0: requests are JetStream-published to INFERA_REQUESTS
	// with rs-inbox, and Admit refuses a worker whose backlog reached it.
	MaxPending int
	// CancelGap overrides CancelGap when > 0 (tests).
	CancelGap time.Duration
}

// Client is the router's side of requests over NATS, independent of the
// router's request path: Admit reads a worker's backlog, Exchange sends
// one envelope and streams the frames back, cancelling the worker's
// request (its inbox on the cancel subject, CancelResends times
// CancelGap apart) when the exchange ends without done.
//
// Concurrency: safe for concurrent use; the cancel resends and the
// backlog reads (one per worker at a time) are goroutines owned by the
// Client, Close stops and waits for them.
type Client struct {
	cfg ClientConfig
	nc  *nats.Conn
	js  jetstream.JetStream
	log zerolog.Logger

	mu      sync.Mutex
	pending map[string]*pendingInfo
	closed  bool
	wg      sync.WaitGroup
	stop    chan struct{}
	// reads is the context of the background backlog reads, cancelled
	// by Close.
	reads       context.Context
	cancelReads context.CancelFunc
}

// pendingInfo is one worker's cached backlog.
type pendingInfo struct {
	at         time.Time // when the last read began (zero: never read)
	used       time.Time // when Admit last asked
	backlog    uint64
	ok         bool // the last read succeeded
	refreshing bool // a read is in flight
}

// NewClient returns a client on nc; with MaxPending > 0 it creates the
// INFERA_REQUESTS stream if needed.
func NewClient(ctx context.Context, cfg ClientConfig, nc *nats.Conn, log zerolog.Logger) (*Client, error) {
	if nc == nil || cfg.IdleTimeout < 0 || cfg.MaxDuration < 0 || cfg.MaxPending < 0 {
		return nil, fmt.Errorf("natsreq: bad client config")
	}
	if cfg.CancelGap <= 0 {
		cfg.CancelGap = CancelGap
	}
	c := &Client{cfg: cfg, nc: nc, log: log.With().Str("component", "nats-requests").Logger(),
		pending: make(map[string]*pendingInfo), stop: make(chan struct{})}
	c.reads, c.cancelReads = context.WithCancel(context.Background())
	if cfg.MaxPending > 0 {
		js, err := jetstream.New(nc)
		if err != nil {
			return nil, fmt.Errorf("natsreq: %w", err)
		}
		if err := EnsureStream(ctx, js); err != nil {
			return nil, err
		}
		c.js = js
	}
	return c, nil
}

// Admit reports whether workerID may take one more request: always
// without admission; else when its consumer's num_pending +
// num_ack_pending is below MaxPending. It never waits on NATS: it answers
// from the cached backlog and, once that is pendingCacheTTL old, starts
// one background read for the worker (at most one in flight per worker).
// A backlog never read yet, unreadable, or last read more than
// pendingMaxAge ago (its reads hanging in a NATS outage) is unknown and
// admits, as the reference admits a backlog it cannot read.
func (c *Client) Admit(workerID string) bool {
	if c.js == nil {
		return true
	}
	now := time.Now()
	c.mu.Lock()
	p := c.pending[workerID]
	if p == nil {
		c.forgetLocked(now)
		p = &pendingInfo{}
		c.pending[workerID] = p
	}
	p.used = now
	if !p.refreshing && !c.closed && now.Sub(p.at) >= pendingCacheTTL {
		p.refreshing = true
		c.wg.Add(1)
		go c.refresh(workerID, p)
	}
	admit := !p.ok || now.Sub(p.at) >= pendingMaxAge || p.backlog < uint64(c.cfg.MaxPending)
	c.mu.Unlock()
	return admit
}

// refresh reads workerID's backlog into p, within pendingReadTimeout or
// until the Client closes.
func (c *Client) refresh(workerID string, p *pendingInfo) {
	defer c.wg.Done()
	at := time.Now()
	ctx, cancel := context.WithTimeout(c.reads, pendingReadTimeout)
	defer cancel()
	var backlog uint64
	cons, err := c.js.Consumer(ctx, StreamName, Durable(workerID))
	if err == nil {
		var info *jetstream.ConsumerInfo
		if info, err = cons.Info(ctx); err == nil {
			backlog = info.NumPending + uint64(info.NumAckPending)
		}
	}
	c.mu.Lock()
	p.refreshing = false
	p.at, p.backlog, p.ok = at, backlog, err == nil
	c.mu.Unlock()
	if err != nil {
		c.log.Debug().Err(err).Str("worker_id", workerID).Msg("nats requests: backlog unreadable, admitting")
	}
}

// forgetLocked drops the backlogs nobody asked for in pendingForget.
func (c *Client) forgetLocked(now time.Time) {
	for id, p := range c.pending {
		if !p.refreshing && now.Sub(p.used) >= pendingForget {
			delete(c.pending, id)
		}
	}
}

// Frame is one reply frame.
type Frame struct {
	Type   string // TypeData, TypeDone, TypeError
	Status int    // done: the engine's HTTP status
	Data   []byte
}

// ParseFrame reads a reply message's headers: no rs-type is data; done
// carries rs-status (200 when absent, as the reference reads it).
func ParseFrame(h nats.Header, data []byte) (Frame, error) {
	f := Frame{Type: TypeData, Data: data}
	if t := h.Get(HeaderType); t != "" {
		f.Type = t
	}
	switch f.Type {
	case TypeData, TypeError:
	case TypeDone:
		f.Status = 200
		if s := h.Get(HeaderStatus); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 100 || n > 999 {
				return f, fmt.Errorf("%w: rs-status %q", ErrTransport, s)
			}
			f.Status = n
		}
	default:
		return f, fmt.Errorf("%w: rs-type %q", ErrTransport, f.Type)
	}
	return f, nil
}

// Exchange is one request in flight. Next returns its frames; Close ends
// it (cancelling the worker's request unless done or an error frame came).
type Exchange struct {
	c        *Client
	workerID string
	inbox    string
	sub      *nats.Subscription
	ch       chan *nats.Msg
	ctx      context.Context
	start    time.Time
	last     time.Time // the last frame's arrival (zero: none yet)
	finished bool
	closed   bool
}

// Exchange publishes env to workerID and returns the exchange that reads
// its answer. ctx bounds the whole exchange: when it ends, Next fails and
// Close cancels the worker's request.
func (c *Client) Exchange(ctx context.Context, workerID string, env *Envelope) (*Exchange, error) {
	return c.ExchangeBy(ctx, workerID, env, time.Time{})
}

// ExchangeBy is Exchange whose JetStream publish (which waits for the
// stream's acknowledgement) gives up at publishBy (zero: the client's
// default API timeout) with ErrPublishTimeout: in a NATS outage the
// caller's first-byte deadline holds.
func (c *Client) ExchangeBy(ctx context.Context, workerID string, env *Envelope, publishBy time.Time) (*Exchange, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	inbox := c.nc.NewInbox()
	ch := make(chan *nats.Msg, 256)
	sub, err := c.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, fmt.Errorf("%w: subscribe %w", ErrTransport, err)
	}
	payload := env.AppendJSON(nil)
	if c.js != nil {
		m := &nats.Msg{Subject: Subject(workerID), Data: payload, Header: nats.Header{HeaderInbox: []string{inbox}}}
		pctx := ctx
		if !publishBy.IsZero() {
			var cancel context.CancelFunc
			pctx, cancel = context.WithDeadline(ctx, publishBy)
			defer cancel()
		}
		if _, err = c.js.PublishMsg(pctx, m); err != nil && ctx.Err() == nil && errors.Is(pctx.Err(), context.DeadlineExceeded) {
			// The request may still reach the stream (a server that
			// resumes): the worker is told to cancel it, as for an
			// exchange abandoned without done.
			_ = sub.Unsubscribe()
			c.sendCancel(workerID, inbox)
			return nil, ErrPublishTimeout
		}
	} else {
		err = c.nc.PublishMsg(&nats.Msg{Subject: Subject(workerID), Reply: inbox, Data: payload})
	}
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("%w: publish: %w", ErrTransport, err)
	}
	return &Exchange{c: c, workerID: workerID, inbox: inbox, sub: sub, ch: ch, ctx: ctx, start: time.Now()}, nil
}

// Inbox is the exchange's reply inbox.
func (x *Exchange) Inbox() string { return x.inbox }

// Next returns the next frame. A done frame ends the exchange; an error
// frame is returned as the frame and as ErrWorker (ErrDraining for a
// worker's hand-back). Deadlines and ctx end it with ErrIdleTimeout,
// ErrTotalTimeout or ctx's error.
func (x *Exchange) Next() (Frame, error) { return x.NextBefore(nil) }

// noRespondersStatus is the NATS server's status (Status header, no
// payload) on a reply inbox when nobody subscribed to the subject.
const (
	statusHeader       = "Status"
	noRespondersStatus = "503"
)

// ErrNoFrameYet is NextBefore's answer when wake came first; the exchange
// goes on.
var ErrNoFrameYet = errors.New("natsreq: no frame yet")

// NextBefore is Next, except that it returns ErrNoFrameYet when wake fires
// first (nil: never), leaving the exchange as it was: the caller's own
// deadlines and heartbeats. The idle deadline runs from the last frame.
func (x *Exchange) NextBefore(wake <-chan time.Time) (Frame, error) {
	if x.finished {
		return Frame{}, fmt.Errorf("%w: exchange finished", ErrTransport)
	}
	if x.last.IsZero() {
		x.last = x.start
	}
	var idle, total <-chan time.Time
	if d := x.c.cfg.IdleTimeout; d > 0 {
		t := time.NewTimer(time.Until(x.last.Add(d)))
		defer t.Stop()
		idle = t.C
	}
	if d := x.c.cfg.MaxDuration; d > 0 {
		t := time.NewTimer(time.Until(x.start.Add(d)))
		defer t.Stop()
		total = t.C
	}
	select {
	case m := <-x.ch:
		x.last = time.Now()
		if len(m.Data) == 0 && m.Header.Get(statusHeader) == noRespondersStatus {
			x.finished = true // nobody to cancel
			return Frame{}, ErrNoResponders
		}
		f, err := ParseFrame(m.Header, m.Data)
		if err != nil {
			return f, err
		}
		switch f.Type {
		case TypeDone:
			x.finished = true
		case TypeError:
			x.finished = true
			if string(f.Data) == DrainingNotice {
				return f, ErrDraining
			}
			return f, fmt.Errorf("%w: %s", ErrWorker, f.Data)
		}
		return f, nil
	case <-wake:
		return Frame{}, ErrNoFrameYet
	case <-idle:
		return Frame{}, fmt.Errorf("%w: nats request stalled: no reply within %.0fs (idle timeout)", ErrIdleTimeout, x.c.cfg.IdleTimeout.Seconds())
	case <-total:
		return Frame{}, fmt.Errorf("%w: nats request exceeded total timeout %.0fs", ErrTotalTimeout, x.c.cfg.MaxDuration.Seconds())
	case <-x.ctx.Done():
		return Frame{}, x.ctx.Err()
	}
}

// Close ends the exchange. Unless the worker finished it (done or an
// error frame), the worker is told to cancel: the inbox is published to
// its cancel subject CancelResends times, CancelGap apart, in the
// background.
func (x *Exchange) Close() {
	if x.closed {
		return
	}
	x.closed = true
	_ = x.sub.Unsubscribe()
	if x.finished {
		return
	}
	x.c.sendCancel(x.workerID, x.inbox)
}

func (c *Client) sendCancel(workerID, inbox string) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = c.nc.Publish(CancelSubject(workerID), []byte(inbox))
		return
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		for i := range CancelResends {
			if err := c.nc.Publish(CancelSubject(workerID), []byte(inbox)); err != nil {
				c.log.Debug().Err(err).Msg("nats requests: cancel not sent")
			}
			if i+1 == CancelResends {
				return
			}
			t := time.NewTimer(c.cfg.CancelGap)
			select {
			case <-t.C:
			case <-c.stop:
				t.Stop()
				return
			}
		}
	}()
}

// Close stops the cancel resends still waiting and the backlog reads in
// flight, and waits for them.
func (c *Client) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	close(c.stop)
	c.cancelReads()
	c.mu.Unlock()
	c.wg.Wait()
}
