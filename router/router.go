package router

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/lifecycle"
	"github.com/infera/infera/natsreq"
	"github.com/infera/infera/openai"
	"github.com/infera/infera/router/upstream"
	"github.com/infera/infera/tracing"
)

// Config is the router's tuning. Start from DefaultConfig (the flag
// defaults of `infera serve`) and override fields: a zero means zero, and
// New rejects a zero where none makes sense (a timeout, a size).
type Config struct {
	MaxBodyBytes      int           // largest request body
	ClientReadTimeout time.Duration // reading one client request
	ClientIdleTimeout time.Duration // idle client keep-alive
	ConnectTimeout    time.Duration // dialing a worker / waiting for a free conn
	UpstreamTimeout   time.Duration // longest silence from a worker
	IdleConnTimeout   time.Duration // pooled worker connection idle
	MaxConnsPerWorker int           // concurrent connections to one worker
	ShutdownTimeout   time.Duration // grace for in-flight requests

	// Failover and circuit breaking.
	MaxRetries     int // retries on other workers before the first byte; 0: no failover
	MigrationLimit int // continuations of a broken stream on other workers; 0: none
	// Direct: an endpoint picker's headers name the worker (direct.go).
	Direct           bool
	BreakerThreshold int           // consecutive faults that open a breaker
	BreakerCooldown  time.Duration // first open period
	BreakerMaxCool   time.Duration // longest open period
	// Admission.
	MaxInflightPerWorker int           // 0: unlimited
	QueueTimeout         time.Duration // wait for a slot when all are full
	// Timeouts of one request.
	TTFTTimeout       time.Duration // first byte (a stream's first event; a unary answer)
	StreamIdleTimeout time.Duration // silence between events
	RequestTimeout    time.Duration // whole request
	HeartbeatInterval time.Duration // SSE comment cadence on a silent stream

	// Stalled workers (stall.go) and absurd requests.
	StallWindow        time.Duration // no answer byte this long with requests in flight: suspect; 0: off
	StallProbeInterval time.Duration // probes of a suspected or stalled worker
	MaxTokensCeiling   int64         // largest max_tokens passed on; 0: no ceiling
	// Disaggregated serving (pd.go).
	PDPrefillTimeout    time.Duration // the prefill leg's deadline; 0: TTFTTimeout
	PDMinUncachedTokens int           // fewer uncached prompt tokens: decode worker alone; 0: always disaggregate

	// Security and client limits.
	APIKeys            []string      // client keys for /v1/*; none: no auth
	AdminToken         string        // Bearer token of the admin endpoints; "": none
	AdminSeparate      bool          // admin endpoints only on the admin server (ServeAll's adminLn)
	EnableProfiling    bool          // /debug/pprof/* on the admin server (HandleAdmin) only
	MaxHeaderBytes     int           // request header block
	ClientWriteTimeout time.Duration // one write to a client
	MaxConnections     int           // concurrent client connections
	// Front door (frontdoor.go).
	MaxConnectionsPerIP int           // concurrent connections from one address; 0: no cap
	ClientHeaderTimeout time.Duration // a request's headers; then ClientReadTimeout for its body
	BodyBudgetBytes     int64         // large request bodies read or held at once
	LogPrompts          bool          // request bodies may appear in debug logs
	// KVDSocket is kvd's Unix socket: POST /v1/cache/prewarm forwards
	// prefetch hints there (prewarm.go); "": the route answers 503.
	KVDSocket string
	Tracer    *tracing.Tracer // OpenTelemetry traces (tracing.go); nil: off
	// NATSRequests sends requests over NATS to the workers whose record
	// says request_transport nats (natsleg.go); nil: such workers are
	// unroutable. Its owner closes it after Serve.
	NATSRequests *natsreq.Client

	// Now is the clock of the circuit breakers (tests)
	Now func() time.Time
}

// ErrConfig wraps invalid router settings.
var ErrConfig = errors.New("router: invalid router configuration")

func (c Config) validate() (Config, error) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"client read timeout", c.ClientReadTimeout},
		{"client idle timeout", c.ClientIdleTimeout},
		{"connect timeout", c.ConnectTimeout},
		{"upstream timeout", c.UpstreamTimeout},
		{"idle conn timeout", c.IdleConnTimeout},
		{"shutdown timeout", c.ShutdownTimeout},
		{"breaker cooldown", c.BreakerCooldown},
		{"breaker max cooldown", c.BreakerMaxCool},
		{"queue timeout", c.QueueTimeout},
		{"ttft timeout", c.TTFTTimeout},
		{"stream idle timeout", c.StreamIdleTimeout},
		{"request timeout", c.RequestTimeout},
		{"heartbeat interval", c.HeartbeatInterval},
		{"client write timeout", c.ClientWriteTimeout},
		{"client header timeout", c.ClientHeaderTimeout},
	} {
		if d.v <= 0 {
			return c, fmt.Errorf("%w: %s %s must be positive", ErrConfig, d.name, d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"max body bytes", c.MaxBodyBytes},
		{"max conns per worker", c.MaxConnsPerWorker},
		{"breaker threshold", c.BreakerThreshold},
		{"max header bytes", c.MaxHeaderBytes},
		{"max connections", c.MaxConnections},
	} {
		if n.v <= 0 {
			return c, fmt.Errorf("%w: %s %d must be positive", ErrConfig, n.name, n.v)
		}
	}
	if c.BodyBudgetBytes < int64(c.MaxBodyBytes) {
		return c, fmt.Errorf("%w: body budget %d is below the largest body %d", ErrConfig, c.BodyBudgetBytes, c.MaxBodyBytes)
	}
	if c.StallWindow < 0 || c.MaxTokensCeiling < 0 || (c.StallWindow > 0 && c.StallProbeInterval <= 0) {
		return c, fmt.Errorf("%w: stall window and token ceiling must not be negative, a stall probe interval must be positive", ErrConfig)
	}
	if c.MaxRetries < 0 || c.MaxInflightPerWorker < 0 || c.MaxConnectionsPerIP < 0 || c.PDMinUncachedTokens < 0 || c.PDPrefillTimeout < 0 {
		return c, fmt.Errorf("%w: retries, in-flight caps, the PD prefill timeout and min uncached tokens must not be negative", ErrConfig)
	}
	if c.PDPrefillTimeout == 0 {
		c.PDPrefillTimeout = c.TTFTTimeout
	}
	c.BreakerMaxCool = max(c.BreakerMaxCool, c.BreakerCooldown)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// ErrServe wraps failures of the HTTP server itself.
var ErrServe = errors.New("router: serve")

// Router is the OpenAI front door: it routes each completion request to a
// worker of the fleet view and relays the answer.
type Router struct {
	cfg     Config
	policy  Policy
	log     zerolog.Logger
	metrics *metrics

	view atomic.Pointer[view] // nil until the first UpdateFleet

	fleetMu sync.Mutex                // serialises UpdateFleet
	workers map[string]*Worker        // by worker_id; guarded by fleetMu
	cursors map[string]*atomic.Uint64 // per model; guarded by fleetMu

	conns upstream.Set // open upstream connections
	scale ScaleAPI     // GET/POST /v1/admin/scale; nil: disabled (scale.go)

	front *frontDoor // client connection and body budgets

	dialects [numProxyRoutes]*dialect // each proxied route's API

	brk      breakerConfig
	ownClock bool // Config.Now was given (tests): the breakers read it, not the request's clock
	admit    admission
	keys     keySet // client API keys
	adminKey keySet // the admin token

	prewarm *prewarmer   // nil without Config.KVDSocket
	fleet   fleetSampler // GET /v1/admin/fleet (fleetsnap.go)

	idPrefix [17]byte // random hex + '-', the stem of generated request ids
	idSeq    atomic.Uint64

	// probes owns the stall probes (probeStalled), each bounded by its
	// request timeout; ServeAll waits for them before closing the pools.
	probes sync.WaitGroup
}

// New returns a router using policy. It serves nothing until Serve (or use
// Handle with your own fasthttp server) and routes nothing until the first
// UpdateFleet.
func New(cfg Config, policy Policy, log zerolog.Logger) (*Router, error) {
	if policy == nil {
		return nil, fmt.Errorf("new router: %w", ErrUnknownPolicy)
	}
	ownClock := cfg.Now != nil
	cfg, err := cfg.validate()
	if err != nil {
		return nil, fmt.Errorf("new router: %w", err)
	}
	r := &Router{
		cfg:      cfg,
		ownClock: ownClock,
		policy:   policy,
		log:      log.With().Str("component", "router").Logger(),
		metrics:  newMetrics(),
		workers:  make(map[string]*Worker),
		cursors:  make(map[string]*atomic.Uint64),
		dialects: defaultDialects(),
	}
	r.front = newFrontDoor(r.cfg)
	r.brk = breakerConfig{threshold: int32(r.cfg.BreakerThreshold), cooldown: r.cfg.BreakerCooldown, maxCooldown: r.cfg.BreakerMaxCool}
	r.admit.limit = int64(r.cfg.MaxInflightPerWorker)
	r.keys = newKeySet(r.cfg.APIKeys)
	if r.cfg.AdminToken != "" {
		r.adminKey = newKeySet([]string{r.cfg.AdminToken})
	}
	if r.cfg.KVDSocket != "" {
		r.prewarm = &prewarmer{socket: r.cfg.KVDSocket}
	}
	r.metrics.register(r)
	var seed [8]byte
	_, _ = rand.Read(seed[:]) // never fails (crypto/rand panics instead)
	hex.Encode(r.idPrefix[:16], seed[:])
	r.idPrefix[16] = '-'
	return r, nil
}

// Policy returns the routing policy in use.
func (r *Router) Policy() Policy { return r.policy }

// Server returns a fasthttp server configured for the router.
func (r *Router) Server() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:      r.Handle,
		ErrorHandler: r.handleParseError,
		Name:         "infera",
		// Bodies reach Handle as streams (fasthttp pre-reads at most 8
		// KiB); above streamBodyThreshold Handle reads them against the
		// body budget (readLargeBody) up to MaxBodyBytes.
		StreamRequestBody:  true,
		MaxRequestBodySize: min(streamBodyThreshold, r.cfg.MaxBodyBytes),
		// ReadTimeout bounds the headers (from the connection's opening,
		// or the request's first byte on a keep-alive connection), so
		// idle connections that never send a request go quickly; once
		// the headers are in, the body gets ClientReadTimeout. A
		// slowloris client is cut when either runs out.
		ReadTimeout: min(r.cfg.ClientHeaderTimeout, r.cfg.ClientReadTimeout),
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: r.cfg.ClientReadTimeout, MaxRequestBodySize: min(streamBodyThreshold, r.cfg.MaxBodyBytes)}
		},
		// The router never asks for the request's time (RequestCtx.Time):
		// fasthttp then reads no clock for it on every request.
		LazyRequestTime: true,
		ConnState:       r.front.connState,
		IdleTimeout:     r.cfg.ClientIdleTimeout,
		// Set before each response; a stream pushes it forward as it
		// goes (relay.keepWriting), so this bounds one stalled write.
		WriteTimeout: r.cfg.ClientWriteTimeout,
		// The header block must fit the read buffer: larger ones get 431.
		ReadBufferSize: r.cfg.MaxHeaderBytes,
		// The front door's listener (ServeAll) enforces MaxConnections
		// with an OpenAI error; fasthttp's own cap, which answers in plain
		// text, stays above it.
		Concurrency:     r.cfg.MaxConnections * fasthttpConcurrencySlack,
		CloseOnShutdown: true,
		Logger:          fasthttpLogger{r.log},
	}
}

// AdminServer returns the fasthttp server of the admin address
// (--admin-listen): /v1/workers, /v1/admin/*, /metrics and /health.
func (r *Router) AdminServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:         r.HandleAdmin,
		ErrorHandler:    r.handleParseError,
		Name:            "infera-admin",
		ReadTimeout:     r.cfg.ClientReadTimeout,
		IdleTimeout:     r.cfg.ClientIdleTimeout,
		WriteTimeout:    r.cfg.ClientWriteTimeout,
		ReadBufferSize:  r.cfg.MaxHeaderBytes,
		Concurrency:     1024,
		CloseOnShutdown: true,
		Logger:          fasthttpLogger{r.log},
	}
}

// Serve serves on ln until ctx is done, then shuts down: it stops accepting,
// waits up to ShutdownTimeout for in-flight requests, cuts the streams still
// running by closing their upstream connections, and closes idle pools.
// A Router serves once: after Serve it dials no worker again.
func (r *Router) Serve(ctx context.Context, ln net.Listener) error {
	return r.ServeAll(ctx, ln, nil)
}

// ServeAll is Serve plus, when adminLn is not nil, the admin server on
// adminLn (see Config.AdminSeparate). Both stop together: the admin server
// after the client server has drained, so that /metrics covers the drain.
// It returns promptly when ctx is already done.
func (r *Router) ServeAll(ctx context.Context, ln, adminLn net.Listener) error {
	return r.serveFront(ctx, adminLn, func(mainCtx context.Context) error {
		// The front door counts connections outermost (its handlers find
		// *frontConn through ctx.Conn()); the bare-LF guard reads beneath it.
		srv := r.Server()
		r.front.ownTimeouts(srv) // frontConn applies them (frontdeadline.go)
		return lifecycle.Serve(mainCtx, srv, r.front.listener(lfListener{ln}, r), lifecycle.Options{
			Grace: r.cfg.ShutdownTimeout,
			Overdue: func() {
				n := r.conns.CloseAll()
				r.log.Warn().Int("connections", n).Dur("grace", r.cfg.ShutdownTimeout).Msg("shutdown grace over, cutting running streams")
			},
		})
	})
}

// serveFront runs a front door (front, serving the client address until
// its context ends and then draining it) beside the admin server on
// adminLn (nil: none), then stops everything else the router runs: the
// one shutdown sequence of both front doors (ServeAll, ServeLoop).
func (r *Router) serveFront(ctx context.Context, adminLn net.Listener, front func(context.Context) error) error {
	mainCtx, stopMain := context.WithCancel(ctx)
	defer stopMain()
	context.AfterFunc(mainCtx, r.fleet.stop) // fleet streams end before the drain waits on them
	adminCtx, stopAdmin := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAdmin()
	var adminErr chan error
	if adminLn != nil {
		adminErr = make(chan error, 1)
		go func() {
			err := lifecycle.Serve(adminCtx, r.AdminServer(), lfListener{adminLn}, lifecycle.Options{Grace: r.cfg.ShutdownTimeout})
			// An admin server that failed on its own takes the router down
			// too rather than run without its management plane.
			stopMain()
			adminErr <- err
		}()
	}
	err := front(mainCtx)
	stopAdmin()
	var aerr error
	if adminErr != nil {
		aerr = <-adminErr
	}
	// No connection is accepted and no request runs any more: wait for
	// the goroutines requests and refusals started.
	r.front.closers.Wait()
	r.probes.Wait()
	r.shutdownPools()
	r.prewarm.close()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrServe, err)
	}
	if aerr != nil {
		return fmt.Errorf("%w: admin: %w", ErrServe, aerr)
	}
	return nil
}

// shutdownPools closes every upstream connection pool.
func (r *Router) shutdownPools() {
	r.conns.CloseAll()
	r.fleetMu.Lock()
	defer r.fleetMu.Unlock()
	for _, w := range r.workers {
		w.pool.Close()
	}
}

// Handle is the fasthttp request handler of the client address. With
// Config.AdminSeparate the admin endpoints are not found here.
func (r *Router) Handle(ctx *fasthttp.RequestCtx) {
	if fc, ok := ctx.Conn().(*frontConn); ok {
		// A pipelined request's: the answer before it is still in
		// fasthttp's buffer, or held (sendHeldFirst), and this one may
		// stream.
		fc.ans.on = false
		_ = fc.sendHeldFirst() // (a failed write fails this answer's too)
	}
	if ctx.Request.IsBodyStream() && !r.readBody(ctx) {
		return
	}
	rt := routeOf(ctx.Path())
	if rt.admin() && r.cfg.AdminSeparate {
		rt = RouteOther
	}
	r.serve(ctx, rt, false)
	holdAnswer(ctx)
}

// HandleAdmin is the fasthttp request handler of the admin address: the
// admin endpoints and /health only.
func (r *Router) HandleAdmin(ctx *fasthttp.RequestCtx) {
	if r.cfg.EnableProfiling && isProfilePath(ctx.Path()) {
		r.serveProfile(ctx)
		return
	}
	rt := routeOf(ctx.Path())
	if !rt.admin() && rt != RouteHealth && rt != RouteReady {
		rt = RouteOther
	}
	r.serve(ctx, rt, true)
}

// serve resolves the request's id (the one place it is resolved: echoed
// in the response, handed to the request path), checks access and
// dispatches by route.
func (r *Router) serve(ctx *fasthttp.RequestCtx, rt Route, adminAddr bool) {
	var idBuf [maxRequestIDBytes]byte
	id := r.appendRequestID(idBuf[:0], clientRequestID(&ctx.Request.Header))
	// A generating route's ids may be echoed late, by the relay (relayhead.go).
	late := rt.generates() && r.headLate(ctx, adminAddr)
	if !late {
		echoRequestID(&ctx.Response.Header, id)
	}
	if !r.allowed(ctx, rt, adminAddr) {
		return
	}
	switch rt {
	case RouteChatCompletions, RouteCompletions, RouteMessages, RouteEmbeddings, RouteResponses:
		r.proxy(ctx, rt, id, late)
	case RouteCountTokens:
		r.countTokens(ctx)
	case RouteModel:
		r.serveModel(ctx)
	case RouteTokenize, RouteDetokenize:
		r.serveTokenize(ctx, rt)
	case RouteModels, RouteWorkers, RouteHealth, RouteReady, RouteMetrics:
		r.serveInfo(ctx, rt)
	case RouteCacheView:
		r.serveCacheView(ctx)
	case RoutePrewarm:
		r.servePrewarm(ctx)
	case RouteFleet:
		r.serveFleet(ctx)
	case RouteDashboard:
		r.serveDashboard(ctx)
	case RouteScale:
		r.ServeScale(ctx)
	default:
		writeError(ctx, fasthttp.StatusNotFound, "unknown path "+clip(ctx.Path()), openai.TypeNotFound, "not_found")
		r.metrics.request(RouteOther, outcomeNotFound).Inc()
	}
}

// allowed applies authentication: the admin token on admin endpoints when
// one is set; otherwise the client API keys on every /v1/* endpoint of the
// client address. /health, /metrics without a token and unknown paths are
// open.
func (r *Router) allowed(ctx *fasthttp.RequestCtx, rt Route, adminAddr bool) bool {
	var ks *keySet
	switch {
	case rt == RouteHealth || rt == RouteReady || rt == RouteOther || rt == RouteDashboard:
		// The dashboard page is static (no fleet data): it asks for the
		// admin token and sends it with its requests for the fleet.
		return true
	case rt.admin() && r.adminKey.enabled():
		ks = &r.adminKey
	case adminAddr || rt == RouteMetrics:
		return true
	case r.keys.enabled():
		ks = &r.keys
	default:
		return true
	}
	return r.authorized(ctx, ks, rt)
}

// serveInfo answers the read-only endpoints.
func (r *Router) serveInfo(ctx *fasthttp.RequestCtx, rt Route) {
	if !ctx.IsGet() && !ctx.IsHead() {
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "use GET for "+rt.Path(), openai.TypeInvalidRequest, "method_not_allowed")
		r.metrics.request(rt, outcomeMethodNotAllowed).Inc()
		return
	}
	v := r.view.Load()
	if v == nil {
		v = &emptyView
	}
	switch rt {
	case RouteModels:
		ctx.SetContentType("application/json")
		ctx.SetBody(appendModels(ctx.Response.Body()[:0], v.modelNames, time.Now()))
	case RouteWorkers:
		ctx.SetContentType("application/json")
		now := time.Now().UnixNano()
		for _, w := range v.workers {
			r.skipStalled(w, now) // a stall ends, or a probe starts, without traffic too
		}
		ctx.SetBody(v.appendWorkers(ctx.Response.Body()[:0]))
	case RouteHealth:
		ctx.SetContentType("application/json")
		ctx.SetBody(v.healthJSON)
	case RouteReady:
		ctx.SetContentType("application/json")
		ctx.SetBody(v.readyJSON)
		if v.routable == 0 {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			r.metrics.request(rt, outcomeNoWorker).Inc()
			return
		}
	case RouteMetrics:
		r.metrics.write(ctx)
	}
	r.metrics.request(rt, outcomeOK).Inc()
}

// emptyView answers the info endpoints before the first fleet snapshot.
var emptyView = func() view {
	v := view{models: map[string]*Candidates{}}
	v.render()
	v.healthJSON = []byte(`{"status":"starting","active_workers":0,"routable_workers":0,"ready":false,"workers":0,"revision":0}`)
	v.readyJSON = []byte(`{"status":"starting","routable_workers":0,"active_workers":0}`)
	return v
}()

// handleParseError answers requests fasthttp could not read, in the OpenAI
// envelope.
func (r *Router) handleParseError(ctx *fasthttp.RequestCtx, err error) {
	rt := routeOf(ctx.Path())
	var small *fasthttp.ErrSmallBuffer
	var netErr net.Error
	switch {
	case errors.Is(err, errBareLF):
		ctx.SetConnectionClose()
		writeError(ctx, fasthttp.StatusBadRequest, errBareLF.Error(), openai.TypeInvalidRequest, "bad_request")
		r.metrics.request(rt, outcomeBadRequest).Inc()
		r.metrics.rejected[rejected400].Inc()
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, "request body exceeds the limit of "+itoa(r.cfg.MaxBodyBytes)+" bytes", openai.TypeInvalidRequest, "request_too_large")
		r.metrics.request(rt, outcomeTooLarge).Inc()
		r.metrics.rejected[rejected413].Inc()
	case errors.As(err, &small):
		writeError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "request headers too large", openai.TypeInvalidRequest, "headers_too_large")
		r.metrics.request(rt, outcomeBadRequest).Inc()
		r.metrics.rejected[rejected431].Inc()
	case errors.As(err, &netErr) && netErr.Timeout():
		// A slow client (slowloris): answer if it still listens, and close.
		ctx.SetConnectionClose()
		writeError(ctx, fasthttp.StatusRequestTimeout, "timed out reading the request", openai.TypeInvalidRequest, "request_timeout")
		r.metrics.request(rt, outcomeBadRequest).Inc()
		r.metrics.rejected[rejected408].Inc()
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "malformed HTTP request", openai.TypeInvalidRequest, "bad_request")
		r.metrics.request(rt, outcomeBadRequest).Inc()
		r.metrics.rejected[rejected400].Inc()
	}
}

// writeError replaces the response with an OpenAI error envelope, keeping
// headers already set (X-Request-Id, X-Infera-Worker).
func writeError(ctx *fasthttp.RequestCtx, status int, message, errType, code string) {
	var buf [512]byte
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(openai.AppendError(buf[:0], message, errType, code))
}

// requestID sets X-Request-Id on the response: the client's own if it sent
// a sane one, else a fresh "<random>-<counter>".
func (r *Router) requestID(ctx *fasthttp.RequestCtx) {
	var buf [maxRequestIDBytes]byte
	r.setRequestID(ctx, buf[:0])
}

const maxRequestIDBytes = 128

func (r *Router) appendRequestID(dst, fromClient []byte) []byte {
	if validRequestID(fromClient) {
		return append(dst, fromClient...)
	}
	// The sequence number's sixteen digits by words (hexWord), not a
	// digit an append: ~280 instructions a request were the appends'
	// capacity checks and the per-digit loop (callgrind, docs/
	// performance.md).
	n := r.idSeq.Add(1)
	dst = append(dst, r.idPrefix[:]...)
	dst = binary.BigEndian.AppendUint64(dst, hexWord(uint32(n>>32)))
	return binary.BigEndian.AppendUint64(dst, hexWord(uint32(n)))
}

// hexWord is x's eight lower-case hex digits, the first in the word's most
// significant byte: x's nibbles spread one a byte, then each turned into
// its digit, '0'+v, and 39 more for a letter (v+6 carries into the high
// nibble from 10 up).
func hexWord(x uint32) uint64 {
	v := uint64(x)
	v = (v | v<<16) & 0x0000ffff0000ffff
	v = (v | v<<8) & 0x00ff00ff00ff00ff
	v = (v | v<<4) & 0x0f0f0f0f0f0f0f0f
	letters := (v + 0x0606060606060606) >> 4 & 0x0101010101010101
	return v + 0x3030303030303030 + letters*('a'-'0'-10)
}

// validRequestID accepts 1..128 visible ASCII characters, so that a client's
// id can be echoed in headers and logs without escaping.
func validRequestID(id []byte) bool {
	if len(id) == 0 || len(id) > maxRequestIDBytes {
		return false
	}
	for _, c := range id {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// clip returns b as a string for an error message, cut to a length that
// keeps a hostile value from bloating the answer.
func clip(b []byte) string {
	const most = 256
	if len(b) > most {
		return string(b[:most]) + "…"
	}
	return string(b)
}

// fasthttpLogger sends fasthttp's own messages (rare: accept errors and the
// like) to the router's logger.
type fasthttpLogger struct{ log zerolog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Warn().Msgf(format, args...)
}
