package upstream

import (
	"bufio"
	"crypto/tls"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// PoolConfig is what a Pool needs to know of its worker.
type PoolConfig struct {
	Addr string // host:port dialed
	// TLS: each connection dialed is wrapped in a TLS client (ServerName
	// the host of Addr), its handshake done on its first write.
	TLS bool
	// TLSConfig is the TLS client's configuration (nil: the defaults,
	// the system's roots); the pool uses a copy, its ServerName set when
	// empty.
	TLSConfig *tls.Config
	// Dial connects to Addr; nil dials plain TCP.
	Dial func(addr string) (net.Conn, error)
	// MaxConns caps the connections open at once (in use and idle);
	// <= 0 is fasthttp's default (512).
	MaxConns int
	// MaxConnWait is how long an exchange waits for a free connection at
	// the cap: fasthttp.ErrNoFreeConns after it, fasthttp.ErrTimeout when
	// the exchange's own deadline comes first; <= 0 does not wait.
	MaxConnWait time.Duration
	// IdleTimeout closes a connection idle this long (up to half as long
	// again: the sweeper's tick); <= 0 is fasthttp's default (10 s).
	IdleTimeout time.Duration
	// ReadBufferSize and WriteBufferSize size each connection's buffered
	// reader and writer (0: fasthttp's defaults).
	ReadBufferSize, WriteBufferSize int
	// MaxResponseBodySize caps a unary answer's body (0: no cap).
	MaxResponseBodySize int
	// Name is the User-Agent of a request that has none.
	Name string
	// DisablePathNormalizing: a request given a full URI keeps its path
	// as given.
	DisablePathNormalizing bool
}

// Pool is one worker's pool of upstream connections: at most MaxConns
// open, idle ones reused last-in first-out and closed once idle
// IdleTimeout by the pool's sweeper goroutine, which runs while there
// are idle connections (as fasthttp's cleaner runs while there are
// connections) and which Close stops. It
// replaces fasthttp's HostClient lease (its mutex, slice, time stamps and
// pooled connection wrapper, ~0.3 µs an exchange, docs/performance.md):
// an idle connection is stamped with the sweeper's tick count, not the
// clock.
//
// A Pool is safe for concurrent use.
type Pool struct {
	cfg       PoolConfig
	tlsConfig *tls.Config
	maxConns  int

	mu      sync.Mutex
	idle    []idleConn // oldest first
	open    int        // connections dialed or dialing, not closed
	waiters []*connWaiter
	tick    uint64 // sweeps so far
	closed  bool
	// sweeping: a sweeper runs (started by put, ended by the first sweep
	// that leaves no idle connection, or by Close).
	sweeping bool

	stop    chan struct{} // closed by Close
	sweeper sync.WaitGroup

	readers, writers sync.Pool // buffers of connections not Dial's
}

type idleConn struct {
	c    net.Conn
	tick uint64 // Pool.tick when it went idle
}

// connWaiter is an exchange waiting for a free connection at the cap: it
// is handed an idle connection, or a nil one with the right to dial (a
// slot freed by a connection closed).
type connWaiter struct {
	ch chan net.Conn
}

// idleTicks is how many sweeper ticks (each IdleTimeout/2) an idle
// connection outlives: then it has been idle at least IdleTimeout.
const idleTicks = 3

// NewPool returns the pool of cfg's worker.
func NewPool(cfg PoolConfig) *Pool {
	p := &Pool{cfg: cfg, maxConns: cfg.MaxConns, stop: make(chan struct{})}
	if p.maxConns <= 0 {
		p.maxConns = fasthttp.DefaultMaxConnsPerHost
	}
	if p.cfg.IdleTimeout <= 0 {
		p.cfg.IdleTimeout = fasthttp.DefaultMaxIdleConnDuration
	}
	if cfg.TLS {
		p.tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.TLSConfig != nil {
			p.tlsConfig = cfg.TLSConfig.Clone()
		}
		if p.tlsConfig.ServerName == "" {
			host, _, err := net.SplitHostPort(cfg.Addr)
			if err != nil {
				host = cfg.Addr
			}
			p.tlsConfig.ServerName = host
		}
		if p.tlsConfig.ClientSessionCache == nil {
			p.tlsConfig.ClientSessionCache = tls.NewLRUClientSessionCache(0)
		}
	}
	return p
}

// Close closes the idle connections and stops the sweeper; a connection
// in use is closed when its exchange gives it back. Exchanges that start
// afterwards still dial (a retired worker's last requests), their
// connections closed at their end. Close is idempotent.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	idle := p.takeIdle(len(p.idle))
	p.mu.Unlock()
	close(p.stop)
	p.sweeper.Wait()
	p.closeAll(idle)
}

// Open is the number of connections open (in use, idle or dialing).
func (p *Pool) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// Idle is the number of idle connections.
func (p *Pool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// acquire takes an idle connection, dials one under the cap, or waits for
// one up to min(wait, MaxConnWait).
func (p *Pool) acquire(wait time.Duration) (net.Conn, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1].c
		p.idle[n-1] = idleConn{}
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, nil
	}
	if p.open < p.maxConns {
		p.open++
		p.mu.Unlock()
		return p.dial()
	}
	if p.cfg.MaxConnWait <= 0 {
		p.mu.Unlock()
		return nil, fasthttp.ErrNoFreeConns
	}
	w := &connWaiter{ch: make(chan net.Conn, 1)}
	p.waiters = append(p.waiters, w)
	p.mu.Unlock()
	return p.await(w, wait)
}

// await waits for w's connection (or slot) up to min(wait, MaxConnWait).
func (p *Pool) await(w *connWaiter, wait time.Duration) (net.Conn, error) {
	timeout, errTimeout := p.cfg.MaxConnWait, fasthttp.ErrNoFreeConns
	if wait > 0 && wait < timeout {
		timeout, errTimeout = wait, fasthttp.ErrTimeout
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	var c net.Conn
	select {
	case c = <-w.ch:
	case <-t.C:
		p.mu.Lock()
		for i, o := range p.waiters {
			if o == w {
				p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
				p.mu.Unlock()
				return nil, errTimeout
			}
		}
		p.mu.Unlock()
		// Handed one as the timer fired: it is in the channel.
		c = <-w.ch
	}
	if c == nil {
		return p.dial()
	}
	return c, nil
}

// dial opens a connection on a slot already counted in open, which it
// frees again if the dial fails.
func (p *Pool) dial() (net.Conn, error) {
	var c net.Conn
	var err error
	if p.cfg.Dial != nil {
		c, err = p.cfg.Dial(p.cfg.Addr)
	} else {
		c, err = net.Dial("tcp", p.cfg.Addr)
	}
	if err != nil {
		p.freeSlot()
		return nil, err
	}
	if p.tlsConfig != nil {
		if _, ok := c.(interface{ Handshake() error }); !ok {
			c = tls.Client(c, p.tlsConfig)
		}
	}
	return c, nil
}

// put gives c back: to the first waiter, else to the idle connections
// (closed when the pool is).
func (p *Pool) put(c net.Conn) {
	p.mu.Lock()
	if len(p.waiters) > 0 {
		w := p.popWaiter()
		p.mu.Unlock()
		w.ch <- c
		return
	}
	if p.closed {
		p.open--
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	p.idle = append(p.idle, idleConn{c: c, tick: p.tick})
	if !p.sweeping {
		p.sweeping = true
		p.sweeper.Add(1)
		go p.sweep()
	}
	p.mu.Unlock()
}

// discard closes c, which does not go back to the pool, and frees its
// slot.
func (p *Pool) discard(c net.Conn) {
	_ = c.Close()
	p.freeSlot()
}

// freeSlot hands a closed connection's slot to the first waiter (to dial
// its own), else counts it free.
func (p *Pool) freeSlot() {
	p.mu.Lock()
	if len(p.waiters) > 0 {
		w := p.popWaiter()
		p.mu.Unlock()
		w.ch <- nil
		return
	}
	p.open--
	p.mu.Unlock()
}

// popWaiter takes the first waiter; p.mu is held.
func (p *Pool) popWaiter() *connWaiter {
	w := p.waiters[0]
	p.waiters[0] = nil
	p.waiters = p.waiters[1:]
	return w
}

// takeIdle removes the n oldest idle connections and their slots and
// returns them to be closed; p.mu is held.
func (p *Pool) takeIdle(n int) []net.Conn {
	if n == 0 {
		return nil
	}
	out := make([]net.Conn, n)
	for i := range n {
		out[i] = p.idle[i].c
	}
	m := copy(p.idle, p.idle[n:])
	clear(p.idle[m:])
	p.idle = p.idle[:m]
	p.open -= n
	return out
}

func (p *Pool) closeAll(cs []net.Conn) {
	for _, c := range cs {
		_ = c.Close()
	}
}

// sweep closes the connections idle at least IdleTimeout, every half of
// it, until none is left idle or Close.
func (p *Pool) sweep() {
	defer p.sweeper.Done()
	t := time.NewTicker(p.cfg.IdleTimeout / 2)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		if !p.expire() {
			return
		}
	}
}

// expire counts a sweeper tick and closes the connections idle for
// idleTicks of them; it reports whether idle ones are left to sweep (if
// not, the sweeper ends).
func (p *Pool) expire() bool {
	p.mu.Lock()
	p.tick++
	n := 0
	for n < len(p.idle) && p.tick-p.idle[n].tick >= idleTicks {
		n++
	}
	expired := p.takeIdle(n)
	more := len(p.idle) > 0
	if !more {
		p.sweeping = false
	}
	p.mu.Unlock()
	p.closeAll(expired)
	return more
}

// acquireReader returns a pooled reader of c, a connection not Dial's.
func (p *Pool) acquireReader(c net.Conn) *bufio.Reader {
	if br, ok := p.readers.Get().(*bufio.Reader); ok {
		br.Reset(c)
		return br
	}
	return bufio.NewReaderSize(c, bufSize(p.cfg.ReadBufferSize, defaultReadBufferSize))
}

func (p *Pool) releaseReader(br *bufio.Reader) {
	br.Reset(nil)
	p.readers.Put(br)
}

// acquireWriter returns a pooled writer of c, a connection not Dial's.
func (p *Pool) acquireWriter(c net.Conn) *bufio.Writer {
	if bw, ok := p.writers.Get().(*bufio.Writer); ok {
		bw.Reset(c)
		return bw
	}
	return bufio.NewWriterSize(c, bufSize(p.cfg.WriteBufferSize, defaultWriteBufferSize))
}

func (p *Pool) releaseWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	p.writers.Put(bw)
}
