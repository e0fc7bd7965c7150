package router

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

var errBadWorkerURL = errors.New("worker url must be http(s)://host[:port][/path]")

// newHostClient builds the connection pool of one worker. Response bodies
// are streamed (the relay reads them event by event); fasthttp retries are
// off because a POST must not be replayed blindly — retries belong to the
// router, around Pick and forward.
func (r *Router) newHostClient(addr string, tls bool) *fasthttp.HostClient {
	return &fasthttp.HostClient{
		Addr:                      addr,
		IsTLS:                     tls,
		Name:                      "infera",
		MaxConns:                  r.cfg.MaxConnsPerWorker,
		MaxConnWaitTimeout:        r.cfg.ConnectTimeout,
		MaxIdleConnDuration:       r.cfg.IdleConnTimeout,
		MaxIdemponentCallAttempts: 1,
		StreamResponseBody:        true,
		DisablePathNormalizing:    true,
		// A worker is trusted, but not infinitely: cap what the response
		// header parser may buffer.
		ReadBufferSize: 16 << 10,
		Dial:           r.dial,
	}
}

// dial connects to a worker within the connect timeout and wraps the
// connection so that every read and write gets its own deadline: an
// engine may stream for many minutes, but must never go silent for longer
// than UpstreamTimeout. (fasthttp's ReadTimeout would instead bound the
// whole response, cutting long generations.)
func (r *Router) dial(addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: r.cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	dc := &deadlineConn{Conn: c, timeout: r.cfg.UpstreamTimeout, set: &r.conns}
	if !r.conns.add(dc) {
		_ = c.Close()
		return nil, errShuttingDown
	}
	return dc, nil
}

var errShuttingDown = errors.New("router is shutting down")

// deadlineConn is an upstream connection with a per-operation idle timeout.
type deadlineConn struct {
	net.Conn
	timeout time.Duration
	set     *connSet
	once    sync.Once
}

func (c *deadlineConn) Read(p []byte) (int, error) {
	if err := c.Conn.SetReadDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *deadlineConn) Close() error {
	c.once.Do(func() { c.set.remove(c) })
	return c.Conn.Close()
}

// connSet tracks open upstream connections so that shutdown can cut the
// streams still running when its grace period ends.
type connSet struct {
	mu     sync.Mutex
	conns  map[*deadlineConn]struct{}
	closed bool
}

func (s *connSet) add(c *deadlineConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = make(map[*deadlineConn]struct{})
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *connSet) remove(c *deadlineConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// closeAll closes every tracked connection and refuses new ones.
func (s *connSet) closeAll() int {
	s.mu.Lock()
	s.closed = true
	conns := make([]*deadlineConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	return len(conns)
}
