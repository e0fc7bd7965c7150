package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// TCPConfig configures a TCP engine.
type TCPConfig struct {
	// Listener, when set, serves this engine's regions to peers; an
	// engine without one can only read and write other engines' regions.
	Listener net.Listener
	// Advertise is the Desc.Peer of this engine's regions (default: the
	// listener's address).
	Advertise string
	// DialTimeout bounds connecting to a peer (default 5 s).
	DialTimeout time.Duration
	// IOTimeout bounds every batch's network I/O on both sides when the
	// context has no earlier deadline (default 30 s).
	IOTimeout time.Duration
	// Admit, when set, decides on each accepted connection by its remote
	// address: one it rejects is closed before any frame (kvd's registry
	// fence). It must be safe for concurrent use.
	Admit func(remote net.Addr) bool
	// LocalAddr, when set, is the local address connections to peers are
	// dialed from (any port), so that a peer fencing by source address
	// recognises this host.
	LocalAddr net.Addr
	// Log receives connection-level failures.
	Log zerolog.Logger
}

// pipelineWindow bounds how many ops of one kind go out before their
// responses are read, so neither side's socket buffers can fill with
// unread frames while the other waits.
const pipelineWindow = 64

// TCP is the pure-Go engine: regions are served by name over a framed
// protocol (frame.go), and a batch is executed on pooled connections, one
// per peer at a time, with requests pipelined.
type TCP struct {
	cfg  TCPConfig
	peer string

	mu      sync.RWMutex
	closed  bool
	regions map[string]*Region
	served  map[net.Conn]struct{}
	idle    map[string][]*tcpConn

	wg      sync.WaitGroup
	batches freeList[tcpBatch]
}

var _ Engine = (*TCP)(nil)

// NewTCP starts a TCP engine (serving on cfg.Listener when set). Close
// stops it and closes the listener.
func NewTCP(cfg TCPConfig) (*TCP, error) {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.IOTimeout <= 0 {
		cfg.IOTimeout = 30 * time.Second
	}
	t := &TCP{
		cfg:     cfg,
		peer:    cfg.Advertise,
		regions: make(map[string]*Region),
		served:  make(map[net.Conn]struct{}),
		idle:    make(map[string][]*tcpConn),
	}
	if cfg.Listener != nil {
		if t.peer == "" {
			t.peer = cfg.Listener.Addr().String()
		}
		t.wg.Add(1)
		go t.accept(cfg.Listener)
	}
	return t, nil
}

// Addr is the address peers reach this engine at (Desc.Peer of its
// regions); empty for a client-only engine.
func (t *TCP) Addr() string { return t.peer }

// InOrder is true: a batch's ops run one group after another, each on one
// connection whose peer serves its requests in turn (transport.Ordered).
func (t *TCP) InOrder() bool { return true }

// Register serves buf under name.
func (t *TCP) Register(name string, buf []byte) (*Region, error) {
	if err := checkName(name); err != nil || len(buf) == 0 {
		return nil, fmt.Errorf("register %q: %w", name, ErrInvalid)
	}
	r := &Region{name: name, buf: buf, owner: t,
		desc: Desc{Peer: t.peer, Name: name, Len: uint64(len(buf)), Device: -1}}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("register %q: %w", name, ErrClosed)
	}
	if _, ok := t.regions[name]; ok {
		return nil, fmt.Errorf("register %q: %w", name, ErrExists)
	}
	t.regions[name] = r
	return r, nil
}

// Deregister stops serving r, waiting for transfers that use it.
func (t *TCP) Deregister(r *Region) error {
	if r == nil || r.owner != any(t) {
		return fmt.Errorf("deregister: %w", ErrNotRegistered)
	}
	t.mu.Lock()
	if t.regions[r.name] == r {
		delete(t.regions, r.name)
	}
	t.mu.Unlock()
	if !r.kill() {
		return fmt.Errorf("deregister %q: %w", r.name, ErrNotRegistered)
	}
	return nil
}

// Close stops serving, closes every connection, deregisters every region
// and waits for the connection goroutines.
func (t *TCP) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	regions := t.regions
	t.regions = map[string]*Region{}
	for c := range t.served {
		_ = c.Close()
	}
	for _, cs := range t.idle {
		for _, c := range cs {
			_ = c.c.Close()
		}
	}
	t.idle = map[string][]*tcpConn{}
	t.mu.Unlock()
	var err error
	if t.cfg.Listener != nil {
		if cerr := t.cfg.Listener.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
			err = fmt.Errorf("close listener: %w", cerr)
		}
	}
	t.wg.Wait()
	for _, r := range regions {
		r.kill()
	}
	return err
}

// --- server side ---

func (t *TCP) accept(ln net.Listener) {
	defer t.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				t.cfg.Log.Warn().Err(err).Msg("transport accept failed")
			}
			return
		}
		if t.cfg.Admit != nil && !t.cfg.Admit(c.RemoteAddr()) {
			_ = c.Close()
			continue
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			_ = c.Close()
			return
		}
		t.served[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go t.serve(c)
	}
}

func (t *TCP) serve(c net.Conn) {
	defer t.wg.Done()
	defer func() {
		t.mu.Lock()
		delete(t.served, c)
		t.mu.Unlock()
		_ = c.Close()
	}()
	s := newTCPConn(c, "")
	for {
		if err := t.serveOne(s); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				t.cfg.Log.Warn().Err(err).Str("peer", c.RemoteAddr().String()).Msg("transport connection dropped")
			}
			return
		}
	}
}

// serveOne answers one request. It flushes responses only when no further
// pipelined request is already buffered.
func (t *TCP) serveOne(s *tcpConn) error {
	if s.br.Buffered() == 0 {
		if err := s.flush(); err != nil {
			return err
		}
	}
	s.keepArmed(t.cfg.IOTimeout)
	if n, err := io.ReadFull(s.br, s.hdr[:reqHeaderLen]); err != nil {
		if n == 0 && isTimeout(err) {
			return nil // idle past the deadline: re-armed on the next call
		}
		return err
	}
	var h reqHeader
	if err := decodeReqHeader(s.hdr[:reqHeaderLen], &h); err != nil {
		return fmt.Errorf("request header: %w", err)
	}
	name := s.name[:h.nameLen]
	if _, err := io.ReadFull(s.br, name); err != nil {
		return err
	}
	t.mu.RLock()
	r := t.regions[string(name)]
	t.mu.RUnlock()
	status := statusOK
	switch {
	case r == nil:
		status = statusNotFound
	case !r.acquire():
		status, r = statusNotFound, nil
	case !inRange(h.off, h.n, uint64(len(r.buf))):
		status = statusOutOfRange
	}
	if r != nil {
		defer r.release()
	}
	resp := respHeader{status: status, seq: h.seq}
	if h.op == Write {
		var err error
		if status == statusOK {
			_, err = io.ReadFull(s.br, r.buf[h.off:h.off+h.n])
		} else {
			err = discard(s.br, h.n)
		}
		if err != nil {
			return err
		}
		putRespHeader(s.hdr[:respHeaderLen], &resp)
		return s.put(s.hdr[:respHeaderLen])
	}
	if status == statusOK {
		resp.n = h.n
	}
	putRespHeader(s.hdr[:respHeaderLen], &resp)
	if err := s.put(s.hdr[:respHeaderLen]); err != nil {
		return err
	}
	if status != statusOK {
		return nil
	}
	return s.writePayload(r.buf[h.off : h.off+h.n])
}

func discard(br *bufio.Reader, n uint64) error {
	for n > 0 {
		step := n
		if step > 1<<30 {
			step = 1 << 30
		}
		if _, err := br.Discard(int(step)); err != nil {
			return err
		}
		n -= step
	}
	return nil
}

// --- client side ---

// tcpConn is one connection with its buffers; the client side pools them
// per peer, the server side owns one per accepted connection.
type tcpConn struct {
	c    net.Conn
	br   *bufio.Reader
	wbuf []byte
	peer string
	seq  uint32
	hdr  [reqHeaderLen]byte
	name [MaxNameLen]byte
	iov  [2][]byte
	vec  net.Buffers
	// vr reads a group's last read response in one readv (nil when the
	// connection offers no file descriptor).
	vr *vecReader
	// armed is the deadline set on c.
	armed time.Time
}

// Reads are buffered in small chunks: headers are tens of bytes, and a
// payload read finds at most readBuf bytes already buffered (copied), the
// rest going straight from the socket into the region; the last read
// response of a group skips the buffer (one readv of header and payload,
// see readLast). Writes batch pipelined headers and small payloads.
const (
	readBuf  = 4 << 10
	writeBuf = 64 << 10
)

func newTCPConn(c net.Conn, peer string) *tcpConn {
	s := &tcpConn{c: c, peer: peer, br: bufio.NewReaderSize(c, readBuf), wbuf: make([]byte, 0, writeBuf)}
	if peer != "" { // client side
		s.vr = newVecReader(c)
	}
	return s
}

// Deadlines. Re-arming a connection's deadline costs about as much as a
// 64 KiB loopback copy, so it is not done per request: a context deadline
// is armed exactly (and only when it changes), and otherwise the armed
// deadline is left alone while it is at least half of IOTimeout away. So
// IOTimeout bounds a batch's (or a request's) I/O to between half of it and
// all of it.

// armFor arms the client connection for one batch under ctx.
func (s *tcpConn) armFor(ctx context.Context, timeout time.Duration) {
	now := time.Now()
	want := now.Add(timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(want) {
		if !s.armed.Equal(dl) {
			s.armed = dl
			_ = s.c.SetDeadline(dl)
		}
		return
	}
	if s.armed.Before(now.Add(timeout/2)) || s.armed.After(want) {
		s.armed = want
		_ = s.c.SetDeadline(want)
	}
}

// keepArmed keeps the server connection's deadline at least half of
// timeout away.
func (s *tcpConn) keepArmed(timeout time.Duration) {
	now := time.Now()
	if s.armed.Before(now.Add(timeout / 2)) {
		s.armed = now.Add(timeout)
		_ = s.c.SetDeadline(s.armed)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// put buffers b (a header or a name: always smaller than the buffer).
func (s *tcpConn) put(b []byte) error {
	if len(s.wbuf)+len(b) > cap(s.wbuf) {
		if err := s.flush(); err != nil {
			return err
		}
	}
	s.wbuf = append(s.wbuf, b...)
	return nil
}

func (s *tcpConn) putString(b string) error {
	if len(s.wbuf)+len(b) > cap(s.wbuf) {
		if err := s.flush(); err != nil {
			return err
		}
	}
	s.wbuf = append(s.wbuf, b...)
	return nil
}

// flush writes what is buffered.
func (s *tcpConn) flush() error {
	if len(s.wbuf) == 0 {
		return nil
	}
	_, err := s.c.Write(s.wbuf)
	s.wbuf = s.wbuf[:0]
	return err
}

// writePayload sends p after what is buffered. A payload that does not fit
// in the buffer goes around it, buffered bytes and p in one writev, so it
// is not copied and its header does not cost a separate segment.
func (s *tcpConn) writePayload(p []byte) error {
	if len(s.wbuf)+len(p) <= cap(s.wbuf) {
		s.wbuf = append(s.wbuf, p...)
		return nil
	}
	if len(s.wbuf) == 0 {
		_, err := s.c.Write(p)
		return err
	}
	s.iov[0], s.iov[1] = s.wbuf, p
	s.vec = s.iov[:]
	_, err := s.vec.WriteTo(s.c)
	s.iov[0], s.iov[1] = nil, nil
	s.wbuf = s.wbuf[:0]
	return err
}

// getConn takes a pooled connection to peer (reused) or dials one.
func (t *TCP) getConn(ctx context.Context, peer string) (c *tcpConn, reused bool, err error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, false, ErrClosed
	}
	if cs := t.idle[peer]; len(cs) > 0 {
		c := cs[len(cs)-1]
		t.idle[peer] = cs[:len(cs)-1]
		t.mu.Unlock()
		return c, true, nil
	}
	t.mu.Unlock()
	d := net.Dialer{Timeout: t.cfg.DialTimeout, LocalAddr: t.cfg.LocalAddr}
	nc, err := d.DialContext(ctx, "tcp", peer)
	if err != nil {
		return nil, false, fmt.Errorf("dial %s: %w: %w", peer, ErrUnavailable, err)
	}
	return newTCPConn(nc, peer), false, nil
}

func (t *TCP) putConn(c *tcpConn) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = c.c.Close()
		return
	}
	t.idle[c.peer] = append(t.idle[c.peer], c)
	t.mu.Unlock()
}

// tcpBatch is complete when Submit returns: the TCP engine executes a
// batch synchronously on the caller's goroutine.
type tcpBatch struct {
	t   *TCP
	err error
}

func (b *tcpBatch) Poll() (bool, error) { return true, b.err }

func (b *tcpBatch) Release() {
	b.err = nil
	_ = b.t.batches.put(b)
}

// Submit validates ops, then runs them: consecutive ops to the same peer
// and of the same kind are pipelined on one connection, up to
// pipelineWindow at a time. Invalid ops fail Submit; transfer failures are
// the Batch's error (the first one; later ops still run).
func (t *TCP) Submit(ctx context.Context, ops []Op) (Batch, error) {
	for i := range ops {
		if err := checkOp(t, &ops[i]); err != nil {
			return nil, fmt.Errorf("submit op %d: %w", i, err)
		}
		if err := checkName(ops[i].Remote.Name); err != nil {
			return nil, fmt.Errorf("submit op %d: remote name: %w", i, err)
		}
	}
	b := t.batches.get()
	if b == nil {
		b = &tcpBatch{t: t}
	}
	for i := 0; i < len(ops); {
		j := i + 1
		for j < len(ops) && j-i < pipelineWindow && ops[j].Kind == ops[i].Kind && ops[j].Remote.Peer == ops[i].Remote.Peer {
			j++
		}
		if err := t.runGroup(ctx, ops[i:j]); err != nil && b.err == nil {
			b.err = err
		}
		i = j
	}
	return b, nil
}

// runGroup runs ops of one kind against one peer. Failures a peer reports
// for single ops keep the connection; I/O and protocol failures drop it and
// fail the remaining ops. A pooled connection that turns out broken (the
// peer restarted or dropped it) is retried once on a fresh one: reads and
// writes of registered regions are idempotent.
func (t *TCP) runGroup(ctx context.Context, ops []Op) error {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("transfer to %s: %w: %w", ops[0].Remote.Peer, ErrTimeout, err)
		}
		c, reused, err := t.getConn(ctx, ops[0].Remote.Peer)
		if err != nil {
			return err
		}
		c.armFor(ctx, t.cfg.IOTimeout)
		opErr, ioErr := c.run(ops)
		if ioErr == nil {
			t.putConn(c)
			return opErr
		}
		_ = c.c.Close()
		switch {
		case errors.Is(ioErr, ErrProtocol):
			return fmt.Errorf("transfer with %s: %w", c.peer, ioErr)
		case errors.Is(ioErr, ErrNotRegistered):
			return fmt.Errorf("transfer with %s: %w", c.peer, ioErr)
		case isTimeout(ioErr):
			return fmt.Errorf("transfer with %s: %w: %w", c.peer, ErrTimeout, ioErr)
		case reused && attempt == 0:
			continue
		}
		return fmt.Errorf("transfer with %s: %w: %w", c.peer, ErrUnavailable, ioErr)
	}
}

// run sends every request, then reads every response. opErr is the first
// failure the peer reported for one op; ioErr a broken connection.
func (c *tcpConn) run(ops []Op) (opErr, ioErr error) {
	base := c.seq
	for i := range ops {
		op := &ops[i]
		c.seq++
		putReqHeader(c.hdr[:], &reqHeader{op: op.Kind, nameLen: uint16(len(op.Remote.Name)), seq: c.seq, off: op.RemoteOff, n: op.Len})
		if err := c.put(c.hdr[:reqHeaderLen]); err != nil {
			return nil, err
		}
		if err := c.putString(op.Remote.Name); err != nil {
			return nil, err
		}
		if op.Kind == Write {
			if !op.Local.acquire() {
				// The header is out: the peer expects the payload.
				return nil, fmt.Errorf("local region %q: %w", op.Local.name, ErrNotRegistered)
			}
			err := c.writePayload(op.Local.buf[op.LocalOff : op.LocalOff+op.Len])
			op.Local.release()
			if err != nil {
				return nil, err
			}
		}
	}
	if err := c.flush(); err != nil {
		return nil, err
	}
	for i := range ops {
		op := &ops[i]
		if i == len(ops)-1 && op.Kind == Read && c.vr != nil && c.br.Buffered() == 0 && op.Local.acquire() {
			status, err := c.readLast(op)
			op.Local.release()
			if err != nil {
				return nil, err
			}
			if status != nil && opErr == nil {
				opErr = fmt.Errorf("%s %s/%s at %d+%d: %w", op.Kind, op.Remote.Peer, op.Remote.Name, op.RemoteOff, op.Len, status)
			}
			return opErr, nil
		}
		if _, err := io.ReadFull(c.br, c.hdr[:respHeaderLen]); err != nil {
			return nil, err
		}
		var h respHeader
		if err := decodeRespHeader(c.hdr[:respHeaderLen], &h); err != nil {
			return nil, fmt.Errorf("response header: %w", err)
		}
		if h.seq != base+uint32(i)+1 {
			return nil, fmt.Errorf("response out of sequence: %w", ErrProtocol)
		}
		if err := statusErr(h.status); err != nil {
			if opErr == nil {
				opErr = fmt.Errorf("%s %s/%s at %d+%d: %w", op.Kind, op.Remote.Peer, op.Remote.Name, op.RemoteOff, op.Len, err)
			}
			continue
		}
		if op.Kind == Write {
			if h.n != 0 {
				return nil, fmt.Errorf("write response with payload: %w", ErrProtocol)
			}
			continue
		}
		if h.n != op.Len {
			return nil, fmt.Errorf("read response length %d, want %d: %w", h.n, op.Len, ErrProtocol)
		}
		if !op.Local.acquire() {
			if err := discard(c.br, h.n); err != nil {
				return nil, err
			}
			if opErr == nil {
				opErr = fmt.Errorf("local region %q: %w", op.Local.name, ErrNotRegistered)
			}
			continue
		}
		_, err := io.ReadFull(c.br, op.Local.buf[op.LocalOff:op.LocalOff+op.Len])
		op.Local.release()
		if err != nil {
			return nil, err
		}
	}
	return opErr, nil
}

// readLast reads the response to op, the last read of a group, with the
// header and the payload that came with it in one readv straight into the
// local region (acquired by the caller), then the rest of the payload.
// Nothing can follow this response on the wire, so bytes after a header
// that announces no payload are a protocol error. status is the failure
// the peer reported; err a broken connection.
func (c *tcpConn) readLast(op *Op) (status, err error) {
	dst := op.Local.buf[op.LocalOff : op.LocalOff+op.Len]
	pay, err := c.vr.readHeaderPayload(c.hdr[:respHeaderLen], dst)
	if err != nil {
		return nil, err
	}
	var h respHeader
	if err := decodeRespHeader(c.hdr[:respHeaderLen], &h); err != nil {
		return nil, fmt.Errorf("response header: %w", err)
	}
	if h.seq != c.seq {
		return nil, fmt.Errorf("response out of sequence: %w", ErrProtocol)
	}
	if err := statusErr(h.status); err != nil {
		if pay != 0 {
			return nil, fmt.Errorf("bytes after a failed read's response: %w", ErrProtocol)
		}
		return err, nil
	}
	if h.n != op.Len {
		return nil, fmt.Errorf("read response length %d, want %d: %w", h.n, op.Len, ErrProtocol)
	}
	if _, err := io.ReadFull(c.br, dst[pay:]); err != nil {
		return nil, err
	}
	return nil, nil
}
