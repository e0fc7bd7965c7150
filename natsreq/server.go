package natsreq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// ServerConfig configures a worker's request server.
type ServerConfig struct {
	WorkerID string
	// EngineURL is the engine's base URL on this host (http://127.0.0.1:PORT).
	EngineURL string
	// IdleTimeout bounds the wait for the engine's next bytes (0 = none);
	// MaxDuration bounds a whole request (0 = none).
	IdleTimeout time.Duration
	MaxDuration time.Duration
	// MaxPending > 0 takes requests from the INFERA_REQUESTS work queue
	// through this worker's durable consumer instead of a subscription.
	MaxPending int
	// Client proxies to the engine; nil: a client with no overall timeout.
	Client *http.Client
}

// Server is the worker side of requests over NATS: it takes the requests
// published to its subject (or its durable consumer), proxies each to its
// engine and streams the answer back in frames, cancels a request whose
// inbox arrives on its cancel subject, and on Stop drains: queued requests
// delivered, in-flight ones finished until the deadline, migratable ones
// then handed back with DrainingNotice, the rest cancelled, the durable
// consumer deleted.
//
// Concurrency: one goroutine per request in flight, owned by the Server;
// Stop waits for them. Methods are safe for concurrent use.
type Server struct {
	cfg  ServerConfig
	nc   *nats.Conn
	js   jetstream.JetStream // MaxPending > 0
	log  zerolog.Logger
	http *http.Client

	sub       *nats.Subscription // core path
	cc        jetstream.ConsumeContext
	cancelSub *nats.Subscription

	mu       sync.Mutex
	inflight map[string]*call
	stopping bool
	wg       sync.WaitGroup
}

// call is one request in flight.
type call struct {
	cancel     context.CancelFunc
	migratable bool
	handedBack bool
	done       chan struct{}
}

// NewServer returns a server on nc; Start subscribes.
func NewServer(cfg ServerConfig, nc *nats.Conn, log zerolog.Logger) (*Server, error) {
	if cfg.WorkerID == "" || cfg.EngineURL == "" || nc == nil {
		return nil, fmt.Errorf("natsreq: server needs a worker id, an engine url and a connection")
	}
	if cfg.IdleTimeout < 0 || cfg.MaxDuration < 0 || cfg.MaxPending < 0 {
		return nil, fmt.Errorf("natsreq: negative timeout or pending limit")
	}
	s := &Server{cfg: cfg, nc: nc, log: log.With().Str("component", "nats-requests").Logger(), http: cfg.Client,
		inflight: make(map[string]*call)}
	if s.http == nil {
		s.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 3 * time.Second,
			ResponseHeaderTimeout: cfg.IdleTimeout}}
	}
	return s, nil
}

// EnsureStream creates or updates the INFERA_REQUESTS work-queue stream:
// subjects infera.req.>, memory storage, discard old, 1,000,000 messages.
func EnsureStream(ctx context.Context, js jetstream.JetStream) error {
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:      StreamName,
		Subjects:  []string{SubjectPrefix + ".>"},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.MemoryStorage,
		Discard:   jetstream.DiscardOld,
		MaxMsgs:   1_000_000,
	})
	if err != nil {
		return fmt.Errorf("natsreq: stream %s: %w", StreamName, err)
	}
	return nil
}

// Start subscribes to the cancel subject and to the requests.
func (s *Server) Start(ctx context.Context) error {
	var err error
	s.cancelSub, err = s.nc.Subscribe(CancelSubject(s.cfg.WorkerID), s.onCancel)
	if err != nil {
		return fmt.Errorf("natsreq: subscribe cancel: %w", err)
	}
	subject := Subject(s.cfg.WorkerID)
	if s.cfg.MaxPending > 0 {
		s.js, err = jetstream.New(s.nc)
		if err == nil {
			err = EnsureStream(ctx, s.js)
		}
		var cons jetstream.Consumer
		if err == nil {
			cons, err = s.js.CreateOrUpdateConsumer(ctx, StreamName, jetstream.ConsumerConfig{
				Durable:       Durable(s.cfg.WorkerID),
				FilterSubject: subject,
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       AckWait,
				MaxDeliver:    1,
			})
		}
		if err == nil {
			s.cc, err = cons.Consume(func(m jetstream.Msg) {
				s.onRequest(m.Headers().Get(HeaderInbox), m.Data(), func() { _ = m.Ack() })
			})
		}
	} else {
		s.sub, err = s.nc.Subscribe(subject, func(m *nats.Msg) { s.onRequest(m.Reply, m.Data, nil) })
	}
	if err == nil {
		// The subscriptions are live on the server before Start returns
		// (and the worker registers): a router's first request must not
		// find nobody subscribed.
		err = s.nc.FlushTimeout(5 * time.Second)
	}
	if err != nil {
		_ = s.cancelSub.Unsubscribe()
		if s.sub != nil {
			_ = s.sub.Unsubscribe()
		}
		if s.cc != nil {
			s.cc.Stop()
		}
		return fmt.Errorf("natsreq: take requests on %s: %w", subject, err)
	}
	s.log.Info().Str("subject", subject).Str("engine", s.cfg.EngineURL).Int("max_pending", s.cfg.MaxPending).
		Msg("nats requests: serving")
	return nil
}

func (s *Server) onCancel(m *nats.Msg) {
	s.mu.Lock()
	c := s.inflight[string(m.Data)]
	s.mu.Unlock()
	if c != nil {
		c.cancel()
	}
}

// onRequest starts one request's proxy; ack (JetStream) runs once it is
// fully proxied.
func (s *Server) onRequest(inbox string, data []byte, ack func()) {
	if ack == nil {
		ack = func() {}
	}
	if inbox == "" {
		s.log.Warn().Msg("nats request without reply inbox; dropped")
		ack()
		return
	}
	env, err := ParseEnvelope(data)
	if err != nil {
		s.reply(inbox, TypeError, []byte(err.Error()), 0)
		ack()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	if s.cfg.MaxDuration > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), s.cfg.MaxDuration)
	}
	c := &call{cancel: cancel, migratable: env.Migratable, done: make(chan struct{})}
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		cancel()
		s.reply(inbox, TypeError, []byte(CancelledText), 0)
		ack()
		return
	}
	s.inflight[inbox] = c
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer close(c.done)
		defer ack()
		defer cancel()
		err := s.proxy(ctx, inbox, &env)
		s.mu.Lock()
		delete(s.inflight, inbox)
		handed := c.handedBack
		s.mu.Unlock()
		switch {
		case err == nil || handed:
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			s.reply(inbox, TypeError, []byte(MaxDurationText), 0)
		case ctx.Err() != nil:
			s.reply(inbox, TypeError, []byte(CancelledText), 0)
		default:
			s.reply(inbox, TypeError, []byte(err.Error()), 0)
		}
	}()
}

// proxyChunk is the read size of a streamed answer.
const proxyChunk = 32 << 10

// proxy sends the request to the engine and its answer to inbox: data
// frames, then done with the engine's status.
func (s *Server) proxy(ctx context.Context, inbox string, env *Envelope) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.EngineURL+env.Path, bytes.NewReader(env.Body))
	if err != nil {
		return err
	}
	for k, v := range env.Headers {
		req.Header.Set(k, v)
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// The idle deadline: a stalled engine is abandoned locally too.
	var idle *time.Timer
	if s.cfg.IdleTimeout > 0 {
		rctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		idle = time.AfterFunc(s.cfg.IdleTimeout, func() { cancel(errIdle) })
		defer idle.Stop()
		stop := context.AfterFunc(rctx, func() { resp.Body.Close() })
		defer stop()
		ctx = rctx
	}
	if !env.Stream {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return readErr(ctx, err)
		}
		s.reply(inbox, TypeData, body, 0)
		s.reply(inbox, TypeDone, nil, resp.StatusCode)
		return nil
	}
	buf := make([]byte, proxyChunk)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if idle != nil {
				idle.Reset(s.cfg.IdleTimeout)
			}
			s.reply(inbox, TypeData, buf[:n], 0)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return readErr(ctx, err)
		}
	}
	s.reply(inbox, TypeDone, nil, resp.StatusCode)
	return nil
}

var errIdle = errors.New("natsreq: engine idle timeout")

func readErr(ctx context.Context, err error) error {
	if c := context.Cause(ctx); errors.Is(c, errIdle) {
		return c
	}
	return err
}

// reply publishes one frame to inbox; status > 0 adds rs-status.
func (s *Server) reply(inbox, typ string, data []byte, status int) {
	m := &nats.Msg{Subject: inbox, Data: data, Header: nats.Header{HeaderType: []string{typ}}}
	if status > 0 {
		m.Header[HeaderStatus] = []string{strconv.Itoa(status)}
	}
	if err := s.nc.PublishMsg(m); err != nil {
		s.log.Debug().Err(err).Msg("nats requests: reply not sent")
	}
}

// InFlight is the number of requests being proxied.
func (s *Server) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inflight)
}

// Stop drains within timeout (0: cancel at once): it waits for requests
// queued for this worker and not yet delivered, stops taking requests,
// waits for those in flight, hands migratable ones back (DrainingNotice),
// cancels the rest, deletes the durable consumer and unsubscribes.
func (s *Server) Stop(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	if timeout > 0 {
		s.awaitQueued(deadline)
	}
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	if s.sub != nil {
		_ = s.sub.Unsubscribe()
	}
	if s.cc != nil {
		s.cc.Stop()
		<-s.cc.Closed()
	}
	if timeout > 0 {
		done := make(chan struct{})
		go func() { s.wg.Wait(); close(done) }()
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-done:
		case <-t.C:
			s.log.Warn().Int("in_flight", s.InFlight()).Msg("nats requests: drain timeout")
		}
		t.Stop()
	}
	s.mu.Lock()
	handed := 0
	for inbox, c := range s.inflight {
		if c.migratable && timeout > 0 {
			c.handedBack = true
			handed++
			s.reply(inbox, TypeError, []byte(DrainingNotice), 0)
		}
		c.cancel()
	}
	s.mu.Unlock()
	if handed > 0 {
		s.log.Info().Int("handed_back", handed).Msg("nats requests: migratable requests handed back to the router")
	}
	s.wg.Wait()
	if s.js != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if timeout > 0 {
			s.refuseQueued(ctx)
		}
		if err := s.js.DeleteConsumer(ctx, StreamName, Durable(s.cfg.WorkerID)); err != nil {
			s.log.Debug().Err(err).Msg("nats requests: durable consumer not deleted")
		}
		cancel()
	}
	if s.cancelSub != nil {
		_ = s.cancelSub.Unsubscribe()
	}
	_ = s.nc.Flush()
}

// awaitQueued waits until the durable consumer has delivered everything
// queued for this worker, or deadline; an unreadable consumer ends the wait.
// The first look is one poll after the start, which gives routers a
// moment to see the record draining before the consumer stops.
func (s *Server) awaitQueued(deadline time.Time) {
	if s.js == nil {
		return
	}
	time.Sleep(max(0, min(queuedPoll, time.Until(deadline))))
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := s.js.Consumer(ctx, StreamName, Durable(s.cfg.WorkerID))
		var info *jetstream.ConsumerInfo
		if err == nil {
			info, err = c.Info(ctx)
		}
		cancel()
		if err != nil || info.NumPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.log.Warn().Uint64("queued", info.NumPending).Msg("nats requests: drain timeout with requests still queued")
			return
		}
		time.Sleep(min(queuedPoll, time.Until(deadline)))
	}
}

// refuseQueued answers the requests a router queued after the consumer
// stopped taking them (it had not seen the record draining yet), so that
// they go elsewhere at once instead of waiting for the router's deadline:
// a migratable one gets DrainingNotice, the rest CancelledText, as requests
// still running at the drain deadline do; nothing reached an engine, so
// the router retries them on another worker.
func (s *Server) refuseQueued(ctx context.Context) {
	cons, err := s.js.Consumer(ctx, StreamName, Durable(s.cfg.WorkerID))
	if err != nil {
		return
	}
	refused := 0
	for {
		batch, err := cons.FetchNoWait(64)
		if err != nil {
			break
		}
		n := 0
		for m := range batch.Messages() {
			n++
			text := CancelledText
			if env, err := ParseEnvelope(m.Data()); err == nil && env.Migratable {
				text = DrainingNotice
			}
			if inbox := m.Headers().Get(HeaderInbox); inbox != "" {
				s.reply(inbox, TypeError, []byte(text), 0)
			}
			_ = m.Ack()
		}
		refused += n
		if n == 0 || ctx.Err() != nil {
			break
		}
	}
	if refused > 0 {
		s.log.Info().Int("refused", refused).Msg("nats requests: requests queued after the drain began sent back to the router")
	}
}
