package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/config"
	"github.com/infera/infera/lifecycle"
	"github.com/infera/infera/tokenizer"
)

// Server lifecycle errors.
var (
	ErrServed = errors.New("sim server already served")
)

// shutdownGrace bounds how long Serve waits for connections to close after
// the scheduler stopped (which ends every in-flight request).
const shutdownGrace = 5 * time.Second

// maxBodyBytes bounds request bodies; fasthttp answers 413 above it.
const maxBodyBytes = 32 << 20

// Option changes a Server built by New.
type Option func(*Server)

// WithExit replaces the function called when --die-after-tokens is reached
// (os.Exit by default), so tests can observe the crash in-process. If it
// returns, the server behaves like a dead engine: it drops the connection
// of the stream that crossed the limit and of every later request.
func WithExit(exit func(code int)) Option {
	return func(s *Server) { s.exit = exit }
}

// withCacheObserver attaches an observer to the prefix cache (tests); it
// runs alongside the KV-event publisher when both are on.
func withCacheObserver(obs cacheObserver) Option {
	return func(s *Server) { s.obs = obs }
}

// withTokenizer supplies an already loaded tokenizer in place of loading
// --tokenizer (tests share one instead of parsing a large tokenizer.json per
// server).
func withTokenizer(tok tokenizer.Tokenizer) Option {
	return func(s *Server) { s.tok = tok }
}

// Server is one simulated engine. It is usable in-process: New, then Serve
// on any listener (or Run on the configured address) until ctx ends.
type Server struct {
	cfg  config.Sim
	log  zerolog.Logger
	exit func(int)
	obs  cacheObserver
	tok  tokenizer.Tokenizer // from withTokenizer, else loaded from cfg
	hf   *hfCodec            // nil: the bytes tokenizer

	kvd *kvdTier // kvd as the second-level cache; nil without --kvd-socket

	name     string
	nameJSON []byte // JSON string literal of the served model name
	labels   []byte // Prometheus labels: engine="0",model_name="..."
	models   []byte // GET /v1/models body
	// SGLang facade: /get_server_info and /get_model_info bodies.
	serverInfo, modelInfo []byte
	seed                  uint64
	idBase                [2]uint64

	sched   *scheduler
	http    *fasthttp.Server
	events  *kvEvents // nil without --kv-events-endpoint
	sockets atomic.Pointer[eventSockets]

	served   atomic.Bool
	addr     atomic.Pointer[string]
	readyAt  atomic.Int64 // unix nanos when slow start ends
	ready    atomic.Bool
	closing  chan struct{}
	readyCh  chan struct{}            // closed once Serve accepts
	ids      atomic.Uint64            // response ids
	draws    atomic.Uint64            // fault-injection draws
	hung     atomic.Int64             // requests held by --hang-before-first-token
	tokensOK atomic.Int64             // tokens sent to clients, for --die-after-tokens
	dead     atomic.Bool              // --die-after-tokens reached
	dpRanks  [maxDPRanks]atomic.Int64 // requests per X-Data-Parallel-Rank

	// PD roles (pd.go): pd is set by Serve before it accepts; pdp
	// publishes it to PDKVAddr. reqLog is --record-requests.
	pd     *pdSide
	pdp    atomic.Pointer[pdSide]
	reqLog *requestLog
	// ttftLog is --model-ttft-log (modelttft.go), opened by Serve before
	// the engine and the handlers start.
	ttftLog *modelTTFTLog
}

// New builds a sim server from a validated configuration.
func New(cfg config.Sim, log zerolog.Logger, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sim config: %w", err)
	}
	s := &Server{
		cfg:     cfg,
		log:     log,
		exit:    os.Exit,
		name:    cfg.Name(),
		seed:    uint64(cfg.Seed),
		idBase:  [2]uint64{rand.Uint64(), rand.Uint64()},
		closing: make(chan struct{}),
		readyCh: make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	if err := s.loadTokenizer(); err != nil {
		return nil, err
	}
	s.nameJSON = appendJSONString(nil, []byte(s.name))
	if cfg.Flavor == config.FlavorSGLang {
		s.labels = append(append([]byte(`model_name="`), promEscape(s.name)...), '"')
	} else {
		s.labels = append(append([]byte(`engine="0",model_name="`), promEscape(s.name)...), '"')
	}
	s.models = s.renderModels(time.Now().Unix())
	if cfg.Flavor == config.FlavorSGLang {
		s.renderSGLangInfo()
	}

	ms := 1e6 * cfg.TimeScale // nanoseconds per simulated millisecond
	t := timing{
		overhead:     cfg.StepOverheadMs * ms,
		perPrefill:   1e3 / cfg.PrefillTokensPerS * ms,
		perDecodeSeq: cfg.DecodeMsPerToken * ms,
		perKVDBlock:  cfg.KVD.LoadMsPerBlock * ms,
		scale:        cfg.TimeScale,
	}
	obs := s.obs
	if cfg.KVEventsEndpoint != "" {
		s.events = newKVEvents(&cfg, log)
		obs = teeObserver(obs, s.events)
	}
	if cfg.KVD.Socket != "" {
		s.kvd = newKVDTier(&cfg, s.name, log)
		obs = teeObserver(obs, s.kvd)
	}
	cache := newPrefixCache(cfg.KVBlocks, cfg.BlockSize, obs)
	s.sched = newScheduler(cache, cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens, t, cfg.TimeScale == 0, s.events)
	s.sched.kvd = s.kvd

	s.http = &fasthttp.Server{
		Handler:               s.handle,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		MaxRequestBodySize:    maxBodyBytes,
		CloseOnShutdown:       true,
		IdleTimeout:           2 * time.Minute,
		Logger:                httpLogger{log},
	}
	return s, nil
}

// loadTokenizer opens --tokenizer unless a tokenizer was supplied; bytes
// leaves s.hf nil, which keeps the byte fast paths.
func (s *Server) loadTokenizer() error {
	tok := s.tok
	if tok == nil {
		if s.cfg.Tokenizer == "bytes" {
			return nil
		}
		var err error
		if tok, err = tokenizer.Open(s.cfg.Tokenizer); err != nil {
			return fmt.Errorf("%w: load %s: %w", ErrTokenizer, s.cfg.Tokenizer, err)
		}
	}
	switch t := tok.(type) {
	case tokenizer.Bytes:
		return nil
	case *tokenizer.HF:
		hf, err := newHFCodec(t)
		if err != nil {
			return err
		}
		s.hf = hf
		return nil
	}
	return fmt.Errorf("%w: unsupported tokenizer %s", ErrTokenizer, tok.Name())
}

// Addr is the address Serve listens on ("" before Serve).
func (s *Server) Addr() string {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return ""
}

// KVEventsEndpoint is the bound KV-event PUB endpoint, tcp://host:port with
// the real port ("" before Serve or without --kv-events-endpoint).
func (s *Server) KVEventsEndpoint() string {
	if es := s.sockets.Load(); es != nil {
		return es.endpoint()
	}
	return ""
}

// KVEventsReplayEndpoint is the bound replay endpoint ("" when none).
func (s *Server) KVEventsReplayEndpoint() string {
	if es := s.sockets.Load(); es != nil {
		return es.replayEndpoint()
	}
	return ""
}

// Run listens on the configured --host/--port and serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	addr := net.JoinHostPort(s.cfg.Host, strconv.Itoa(s.cfg.Port))
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves HTTP on ln until ctx ends, then stops the engine (in-flight
// requests end without completing), closes ln and waits for connections to
// close. It logs "sim listening" with the bound address once accepting. A
// Server serves once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if !s.served.CompareAndSwap(false, true) {
		_ = ln.Close()
		return ErrServed
	}
	var sockets *eventSockets
	if s.events != nil {
		var err error
		sockets, err = startEventSockets(ctx, s.events.ring, eventOpts{
			endpoint: s.cfg.KVEventsEndpoint, replay: s.cfg.KVEventsReplayEndpoint, topic: s.cfg.KVEventsTopic,
			connect: s.cfg.KVEventsConnect, delay: s.cfg.KVEventsDelay,
		}, s.log)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("kv events: %w", err)
		}
		s.sockets.Store(sockets)
	}
	pd, err := s.startPD()
	if err != nil {
		_ = ln.Close()
		if sockets != nil {
			sockets.close()
		}
		return err
	}
	if pd != nil {
		s.pd = pd
		s.pdp.Store(pd)
		defer pd.close()
	}
	if s.reqLog, err = openRequestLog(s.cfg.RecordRequests); err != nil {
		_ = ln.Close()
		if sockets != nil {
			sockets.close()
		}
		return err
	}
	defer s.reqLog.close()
	if s.ttftLog, err = openModelTTFTLog(s.cfg.ModelTTFTLog, s.cfg.TimeScale); err != nil {
		_ = ln.Close()
		if sockets != nil {
			sockets.close()
		}
		return err
	}
	if s.ttftLog != nil {
		s.sched.ttftLog = s.ttftLog
		s.ttftLog.start()
		// Runs once the body below has waited for the scheduler, the
		// log's only writer.
		defer func() {
			if cerr := s.ttftLog.close(); cerr != nil {
				s.log.Error().Err(cerr).Str("path", s.cfg.ModelTTFTLog).Msg("model ttft log incomplete")
			}
		}()
	}
	if s.kvd != nil {
		s.kvd.start()
		// Runs once the body below has waited for the scheduler.
		defer s.kvd.close()
	}
	addr := ln.Addr().String()
	s.addr.Store(&addr)
	s.readyAt.Store(time.Now().Add(s.cfg.SlowStart).UnixNano())

	schedCtx, stopSched := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSched()
	var wg sync.WaitGroup
	wg.Go(func() { s.sched.run(schedCtx) })
	// The HTTP server stops when ctx ends or the engine closes (below).
	httpCtx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHTTP()
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- lifecycle.Serve(httpCtx, s.http, ln, lifecycle.Options{Grace: shutdownGrace}) })

	ev := s.log.Info().Str("addr", addr).Str("model", s.name).
		Int("block_size", s.cfg.BlockSize).Int("kv_blocks", s.cfg.KVBlocks).
		Float64("time_scale", s.cfg.TimeScale).Str("tokenizer", s.cfg.Tokenizer)
	if pd != nil {
		ev = ev.Str("pd_role", pd.role).Str("pd_protocol", pd.protocol)
		if pd.port != 0 {
			ev = ev.Str("pd_kv_addr", net.JoinHostPort(pd.host, strconv.Itoa(pd.port)))
		}
	}
	if s.kvd != nil {
		ev = ev.Str("kvd_socket", s.cfg.KVD.Socket).Str("kvd_compat_key", s.cfg.KVD.CompatKey)
	}
	if sockets != nil {
		ev = ev.Str("kv_events_endpoint", sockets.endpoint()).Str("kv_events_format", s.cfg.KVEventsFormat)
		if r := sockets.replayEndpoint(); r != "" {
			ev = ev.Str("kv_events_replay_endpoint", r)
		}
	}
	ev.Msg("sim listening")

	close(s.readyCh)

	err = nil
	served := false
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		served = true
	}
	close(s.closing)
	stopSched()
	<-s.sched.stopped
	if sockets != nil {
		// After the scheduler's last batch, so subscribers get it if they
		// can take it before the close.
		sockets.close()
	}
	stopHTTP()
	if !served {
		err = <-serveErr
	}
	wg.Wait()
	s.log.Info().Str("addr", addr).Msg("sim stopped")
	return err
}

// Ready is closed once Serve has bound its listener, started its KV event
// sockets and the engine: Addr and KVEventsEndpoint are set. (Readiness
// for traffic after --slow-start is /health's business.)
func (s *Server) Ready() <-chan struct{} { return s.readyCh }

// isReady reports whether --slow-start has passed.
func (s *Server) isReady() bool {
	if s.ready.Load() {
		return true
	}
	at := s.readyAt.Load()
	if at == 0 || time.Now().UnixNano() < at {
		return false
	}
	s.ready.Store(true)
	return true
}

// draw returns a deterministic pseudo-random number in [0, 1) for fault
// injection: reproducible for a seed and request order, lock-free.
func (s *Server) draw() float64 {
	n := s.draws.Add(1)
	return float64(splitmix64((s.seed^0x5851f42d4c957f2d)+n*0x9e3779b97f4a7c15)>>11) * 0x1p-53
}

// die is called when --die-after-tokens is reached.
func (s *Server) die() {
	if s.dead.CompareAndSwap(false, true) {
		s.log.Error().Int64("tokens", s.cfg.DieAfterTokens).Msg("sim crashing on purpose: --die-after-tokens reached")
		s.exit(1)
	}
}

// waitGone blocks until the client of c goes away or the server closes. It
// is used only by --hang-before-first-token requests, which send nothing
// and so cannot learn of a disconnect by a failed write. It reads the idle
// connection with a short deadline; a byte read (a pipelined request, which
// HTTP clients do not send while a response is pending) also ends the wait,
// and the connection is closed afterwards either way.
func (s *Server) waitGone(c net.Conn) {
	var b [1]byte
	for {
		select {
		case <-s.closing:
			return
		default:
		}
		if err := c.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
			return
		}
		_, err := c.Read(b[:])
		var ne net.Error
		if err != nil && errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		return
	}
}

// waitUnary waits for a submitted unary sequence like scheduler.wait, and
// returns seqRunning when the client goes away first (the caller aborts q).
// A unary answer writes nothing until it is complete, so, as for a hung
// request, the idle client connection is read meanwhile: EOF or an error
// means the client left. The reader is stopped (a past read deadline) and
// joined before the handler goes on, so that fasthttp has the connection to
// itself again; a byte read (a pipelined request) ends the watch and the
// connection is closed after the answer. The zero-latency mode finishes
// every sequence on admission and skips the watch (no goroutine, no
// allocation).
func (s *Server) waitUnary(ctx *fasthttp.RequestCtx, q *seq) uint32 {
	c := ctx.Conn()
	if s.sched.instant || c == nil {
		return s.sched.waitChoicesOr(q, nil)
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return s.sched.waitChoicesOr(q, nil)
	}
	gone, exited := make(chan struct{}), make(chan struct{})
	var stopping atomic.Bool
	var readByte bool
	go func() {
		defer close(exited)
		var b [1]byte
		n, _ := c.Read(b[:])
		if stopping.Load() && n == 0 {
			return
		}
		readByte = n > 0
		close(gone)
	}()
	st := s.sched.waitChoicesOr(q, gone)
	stopping.Store(true)
	_ = c.SetReadDeadline(time.Now())
	<-exited
	_ = c.SetReadDeadline(time.Time{})
	if readByte {
		ctx.SetConnectionClose()
		if st == seqRunning {
			return s.sched.waitChoicesOr(q, nil)
		}
	}
	return st
}

// httpLogger routes fasthttp's own messages (connection errors) to debug
// level: a client going away is routine for an engine.
type httpLogger struct{ log zerolog.Logger }

func (l httpLogger) Printf(format string, args ...any) {
	l.log.Debug().Msgf(format, args...)
}

// bufPool holds response buffers so unary answers, errors and metrics do not
// allocate per request.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > 1<<20 {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}
