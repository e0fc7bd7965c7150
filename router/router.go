package router

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/openai"
)

// Config is the router's tuning; zero fields take the defaults below (the
// flag defaults of `infera serve`).
type Config struct {
	MaxBodyBytes      int           // largest request body; default 32 MiB
	ClientReadTimeout time.Duration // reading one client request; default 60s
	ClientIdleTimeout time.Duration // idle client keep-alive; default 120s
	ConnectTimeout    time.Duration // dialing a worker / waiting for a free conn; default 3s
	UpstreamTimeout   time.Duration // longest silence from a worker; default 5m
	IdleConnTimeout   time.Duration // pooled worker connection idle; default 3s
	MaxConnsPerWorker int           // default 1024
	ShutdownTimeout   time.Duration // grace for in-flight requests; default 30s
}

func (c Config) withDefaults() Config {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 32 << 20
	}
	if c.MaxConnsPerWorker <= 0 {
		c.MaxConnsPerWorker = 1024
	}
	def(&c.ClientReadTimeout, 60*time.Second)
	def(&c.ClientIdleTimeout, 120*time.Second)
	def(&c.ConnectTimeout, 3*time.Second)
	def(&c.UpstreamTimeout, 5*time.Minute)
	def(&c.IdleConnTimeout, 3*time.Second)
	def(&c.ShutdownTimeout, 30*time.Second)
	return c
}

// ErrServe wraps failures of the HTTP server itself.
var ErrServe = errors.New("router server")

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

	conns connSet // open upstream connections

	idPrefix [17]byte // random hex + '-', the stem of generated request ids
	idSeq    atomic.Uint64
}

// New returns a router using policy. It serves nothing until Serve (or use
// Handle with your own fasthttp server) and routes nothing until the first
// UpdateFleet.
func New(cfg Config, policy Policy, log zerolog.Logger) (*Router, error) {
	if policy == nil {
		return nil, fmt.Errorf("new router: %w", ErrUnknownPolicy)
	}
	r := &Router{
		cfg:     cfg.withDefaults(),
		policy:  policy,
		log:     log.With().Str("component", "router").Logger(),
		metrics: newMetrics(),
		workers: make(map[string]*Worker),
		cursors: make(map[string]*atomic.Uint64),
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
		Handler:            r.Handle,
		ErrorHandler:       r.handleParseError,
		Name:               "infera",
		MaxRequestBodySize: r.cfg.MaxBodyBytes,
		ReadTimeout:        r.cfg.ClientReadTimeout,
		IdleTimeout:        r.cfg.ClientIdleTimeout,
		// Large Authorization headers (JWTs) must fit.
		ReadBufferSize:  16 << 10,
		CloseOnShutdown: true,
		Logger:          fasthttpLogger{r.log},
	}
}

// Serve serves on ln until ctx is done, then shuts down: it stops accepting,
// waits up to ShutdownTimeout for in-flight requests, cuts the streams still
// running by closing their upstream connections, and closes idle pools.
// A Router serves once: after Serve it dials no worker again.
func (r *Router) Serve(ctx context.Context, ln net.Listener) error {
	srv := r.Server()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		r.shutdownPools()
		if err == nil {
			return nil
		}
		return fmt.Errorf("%w: %w", ErrServe, err)
	case <-ctx.Done():
	}

	grace, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ShutdownTimeout)
	err := srv.ShutdownWithContext(grace)
	cancel()
	if err != nil {
		n := r.conns.closeAll()
		r.log.Warn().Int("connections", n).Dur("grace", r.cfg.ShutdownTimeout).Msg("shutdown grace over, cutting running streams")
		// The relays now end at once; wait for their client connections.
		deadline := time.Now().Add(5 * time.Second)
		for srv.GetOpenConnectionsCount() > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	serveErr := <-errc
	r.shutdownPools()
	if serveErr != nil {
		return fmt.Errorf("%w: %w", ErrServe, serveErr)
	}
	return nil
}

// shutdownPools closes every upstream connection pool.
func (r *Router) shutdownPools() {
	r.conns.closeAll()
	r.fleetMu.Lock()
	defer r.fleetMu.Unlock()
	for _, w := range r.workers {
		w.client.CloseIdleConnections()
	}
}

// Handle is the fasthttp request handler.
func (r *Router) Handle(ctx *fasthttp.RequestCtx) {
	switch rt := routeOf(ctx.Path()); rt {
	case RouteChatCompletions, RouteCompletions:
		r.proxy(ctx, rt)
	case RouteModels, RouteWorkers, RouteHealth, RouteMetrics:
		r.serveInfo(ctx, rt)
	case RouteCacheView:
		r.serveCacheView(ctx)
	default:
		r.requestID(ctx)
		writeError(ctx, fasthttp.StatusNotFound, "unknown path "+clip(ctx.Path()), openai.TypeNotFound, "not_found")
		r.metrics.request(RouteOther, outcomeNotFound).Inc()
	}
}

// serveInfo answers the read-only endpoints.
func (r *Router) serveInfo(ctx *fasthttp.RequestCtx, rt Route) {
	r.requestID(ctx)
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
		ctx.SetBody(v.modelsJSON)
	case RouteWorkers:
		ctx.SetContentType("application/json")
		ctx.SetBody(v.workersJSON)
	case RouteHealth:
		ctx.SetContentType("application/json")
		ctx.SetBody(v.healthJSON)
	case RouteMetrics:
		r.metrics.write(ctx)
	}
	r.metrics.request(rt, outcomeOK).Inc()
}

// emptyView answers the info endpoints before the first fleet snapshot.
var emptyView = func() view {
	v := view{models: map[string]*Candidates{}}
	v.render()
	v.healthJSON = []byte(`{"status":"starting","active_workers":0,"workers":0,"revision":0}`)
	return v
}()

// handleParseError answers requests fasthttp could not read, in the OpenAI
// envelope.
func (r *Router) handleParseError(ctx *fasthttp.RequestCtx, err error) {
	rt := routeOf(ctx.Path())
	var small *fasthttp.ErrSmallBuffer
	var netErr net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, "request body exceeds the limit of "+itoa(r.cfg.MaxBodyBytes)+" bytes", openai.TypeInvalidRequest, "request_too_large")
		r.metrics.request(rt, outcomeTooLarge).Inc()
	case errors.As(err, &small):
		writeError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "request headers too large", openai.TypeInvalidRequest, "headers_too_large")
		r.metrics.request(rt, outcomeBadRequest).Inc()
	case errors.As(err, &netErr) && netErr.Timeout():
		writeError(ctx, fasthttp.StatusRequestTimeout, "timed out reading the request", openai.TypeInvalidRequest, "request_timeout")
		r.metrics.request(rt, outcomeBadRequest).Inc()
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "malformed HTTP request", openai.TypeInvalidRequest, "bad_request")
		r.metrics.request(rt, outcomeBadRequest).Inc()
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
	ctx.Response.Header.SetBytesV("X-Request-Id", r.appendRequestID(buf[:0], ctx.Request.Header.Peek("X-Request-Id")))
}

const maxRequestIDBytes = 128

func (r *Router) appendRequestID(dst, fromClient []byte) []byte {
	if validRequestID(fromClient) {
		return append(dst, fromClient...)
	}
	dst = append(dst, r.idPrefix[:]...)
	n := r.idSeq.Add(1)
	const hexDigits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, hexDigits[(n>>uint(shift))&0xf])
	}
	return dst
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
