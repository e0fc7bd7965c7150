package router

import (
	"errors"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/router/upstream"
)

var errBadWorkerURL = errors.New("worker url must be http(s)://host[:port][/path]")

// newPool builds the connection pool of one worker (upstream.Pool), which
// Close ends (retire, shutdownPools). A streaming request's response body
// is streamed (the relay reads it event by event, attempt.do sets
// Response.StreamBody); a unary answer is read whole, within the
// attempt's deadline and up to maxUnaryResponseBytes, which spares it the
// stream reader and a copy. Nothing is retried below the router: a POST
// must not be replayed blindly — retries belong to the router, around Pick
// and forward.
func (r *Router) newPool(addr string, tls bool, w *Worker) *upstream.Pool {
	return upstream.NewPool(upstream.PoolConfig{
		Addr:                   addr,
		TLS:                    tls,
		Name:                   upstreamUserAgent,
		MaxConns:               r.cfg.MaxConnsPerWorker,
		MaxConnWait:            r.cfg.ConnectTimeout,
		IdleTimeout:            r.cfg.IdleConnTimeout,
		MaxResponseBodySize:    maxUnaryResponseBytes,
		DisablePathNormalizing: disableUpstreamPathNormalizing,
		// A worker is trusted, but not infinitely: cap what the response
		// header parser may buffer.
		ReadBufferSize: 16 << 10,
		Dial:           func(addr string) (net.Conn, error) { return r.dial(addr, w) },
	})
}

// disableUpstreamPathNormalizing: a request to a worker given a full URI
// keeps its path as the route built it (newPool, originForm).
const disableUpstreamPathNormalizing = true

// doUnary sends req to w on a connection of its pool and reads the whole
// answer into resp within timeout: the router's own requests to a worker
// (its stall probe, /tokenize), outside any client's leg.
func (w *Worker) doUnary(req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error {
	var x upstream.Exchange
	x.Begin()
	return x.Do(w.pool, req, resp, time.Now().Add(timeout), nil)
}

// dial connects to a worker (upstream.Dial): every read and write gets its
// own deadline, and bytes read are the worker's progress (stall.go).
func (r *Router) dial(addr string, w *Worker) (net.Conn, error) {
	var p upstream.Progress
	if w != nil {
		p = &w.prog
	}
	c, err := upstream.Dial(&r.conns, addr, r.cfg.ConnectTimeout, r.cfg.UpstreamTimeout, p)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// workerProgress is a worker's progress accounting as its upstream
// connections see it (upstream.Progress); one per worker.
type workerProgress struct {
	r *Router
	w *Worker
}

// Progress implements upstream.Progress.
func (p *workerProgress) Progress(now int64) { p.w.stall.noteProgress(now) }

// StallTick implements upstream.Progress.
func (p *workerProgress) StallTick() time.Duration {
	if p.r.cfg.StallWindow <= 0 {
		return 0
	}
	return p.r.stallTick()
}

// GiveUp implements upstream.Progress: a read outside a relayed stream
// (response headers, a unary answer) gives up once its worker is confirmed
// stalled and the read has waited a stall window.
func (p *workerProgress) GiveUp(now, start time.Time) error {
	if p.r.skipStalled(p.w, now.UnixNano()) && p.w.Stalled() && now.Sub(start) >= p.r.cfg.StallWindow {
		return errAttemptStalled
	}
	return nil
}
