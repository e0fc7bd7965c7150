package kvd

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// MaxSocketPath is the longest socket path Listen takes: sun_path's 107
// bytes less the temporary suffix.
const MaxSocketPath = 103

// Lease limits (see ServerOptions).
const (
	DefaultMaxLeasesPerConn = 1024
	DefaultLeaseTimeout     = time.Minute
	// ReasonTooManyLeases: the connection holds MaxLeasesPerConn leases.
	ReasonTooManyLeases = "too_many_leases"
)

// DefaultMaxConns is the default cap on Unix-socket connections.
const DefaultMaxConns = 4096

// retainFrameBytes caps the read buffer a connection keeps between frames.
const retainFrameBytes = 16 << 20

// ServerOptions configure a Server.
type ServerOptions struct {
	// AllowUIDs are the peer uids accepted on the socket (SO_PEERCRED);
	// empty means the daemon's own uid and root.
	AllowUIDs []int
	// MaxFrameBytes bounds one request frame and one reply (0 =
	// DefaultMaxFrameBytes; at most MaxFrameLimit): a reply that would be
	// longer is replaced by an error frame, code reply_too_large.
	MaxFrameBytes int
	// MaxLeasesPerConn caps the set_reserve leases one connection holds
	// (0 = DefaultMaxLeasesPerConn): one more is refused with reason
	// too_many_leases. LeaseTimeout (0 = DefaultLeaseTimeout) is how long
	// a lease lives uncommitted: it is cancelled then, and a connection
	// that stays silent past it while holding leases, or whose reply
	// blocks that long (it does not read), is closed.
	MaxLeasesPerConn int
	LeaseTimeout     time.Duration
	// MaxConns caps the open connections (0 = DefaultMaxConns); one more
	// is closed at once, before its hello.
	MaxConns int
	Log      zerolog.Logger
	// Collectors are more metrics served on AdminHandler's /metrics (the
	// RESP listener's, the L4 tier's).
	Collectors []prometheus.Collector
	// PeerPrefetch takes a prefetch_hint that names a source kvd (a router
	// directing a pull from the host that computed the blocks; kvd/peer).
	// It must not block or keep the slices (they alias the frame). Nil:
	// such hints warm from L3 like any other.
	PeerPrefetch func(source string, model, compat []byte, keys [][]byte, deadline time.Duration)
}

// maxPrefetchDeadlineMs bounds a prefetch_hint's deadline_ms (10 min).
const maxPrefetchDeadlineMs = 600_000

// Server speaks the kvd protocol on a Unix socket over a Store.
type Server struct {
	store    *Store
	opt      ServerOptions
	log      zerolog.Logger
	serverID string

	nextConn atomic.Uint64
	mu       sync.Mutex
	conns    map[*net.UnixConn]struct{}
	wg       sync.WaitGroup

	Rejected        atomic.Int64 // connections refused by the peer check
	Refused         atomic.Int64 // connections closed over MaxConns
	RepliesTooLarge atomic.Int64 // replies replaced by reply_too_large
	LeasesRefused   atomic.Int64 // set_reserve refused over MaxLeasesPerConn
	LeasesExpired   atomic.Int64 // leases cancelled past LeaseTimeout
	BadFrames       atomic.Int64 // connections closed on an undecodable frame
	ConnsTotal      atomic.Int64
	ConnsActive     atomic.Int64
	RequestsByOp    [numOps]atomic.Int64
}

// NewServer returns a Server over store.
func NewServer(store *Store, opt ServerOptions) *Server {
	if opt.MaxFrameBytes <= 0 {
		opt.MaxFrameBytes = DefaultMaxFrameBytes
	}
	opt.MaxFrameBytes = min(opt.MaxFrameBytes, MaxFrameLimit)
	if opt.MaxLeasesPerConn <= 0 {
		opt.MaxLeasesPerConn = DefaultMaxLeasesPerConn
	}
	if opt.LeaseTimeout <= 0 {
		opt.LeaseTimeout = DefaultLeaseTimeout
	}
	if opt.MaxConns <= 0 {
		opt.MaxConns = DefaultMaxConns
	}
	if len(opt.AllowUIDs) == 0 {
		opt.AllowUIDs = []int{os.Getuid(), 0}
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	return &Server{store: store, opt: opt, log: opt.Log, serverID: "kvd-" + hex.EncodeToString(id[:]), conns: map[*net.UnixConn]struct{}{}}
}

// ID is the server_id sent in hello_ack.
func (s *Server) ID() string { return s.serverID }

// Listen binds the socket at path with mode 0600: it binds path+".tmp"
// (so path is at most MaxSocketPath bytes), sets the mode and renames it
// over path, so the socket is never
// reachable with a wider mode. A stale socket (nobody answers) is replaced;
// a live one gives ErrSocketInUse.
func Listen(path string) (*net.UnixListener, error) {
	if len(path) > MaxSocketPath {
		return nil, fmt.Errorf("%w: socket path longer than %d bytes", ErrConfig, MaxSocketPath)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen %s: exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: %w", path, ErrSocketInUse)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return ln, nil
}

// Serve accepts connections until ctx ends, then closes them all and
// returns. The caller removes the socket file.
func (s *Server) Serve(ctx context.Context, ln *net.UnixListener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var err error
	var retry AcceptRetry
	for {
		c, aerr := ln.AcceptUnix()
		if aerr != nil {
			if retry.Wait(ctx, aerr, s.log, "unix") {
				continue
			}
			if ctx.Err() == nil {
				err = fmt.Errorf("accept: %w", aerr)
			}
			break
		}
		retry.Reset()
		s.mu.Lock()
		if s.opt.MaxConns > 0 && len(s.conns) >= s.opt.MaxConns {
			s.mu.Unlock()
			s.Refused.Add(1)
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.handle(c)
	}
	ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) peerAllowed(c *net.UnixConn) (int, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, false
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return -1, false
	}
	return int(cred.Uid), slices.Contains(s.opt.AllowUIDs, int(cred.Uid))
}

type conn struct {
	s            *Server
	c            *net.UnixConn
	id           uint64
	arena        bool // this client mapped the arena
	hello        bool // the first frame was handled
	enc          *Encoder
	dec          *Decoder
	msg          Message
	buf          []byte
	r            *bufio.Reader
	out          []byte  // answers held back while pipelined requests are pending
	sc           Scratch // L3 buffers
	setArg       SetArgs
	leases       []connLease // uncommitted leases, oldest first
	readDeadline int64       // read and write deadline set on c while leases are held (unix ns)
	hits         []Hit       // batch scratch
	oks          []bool
	reasons      []string
}

func (s *Server) handle(c *net.UnixConn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	if uid, ok := s.peerAllowed(c); !ok {
		s.Rejected.Add(1)
		s.log.Warn().Int("uid", uid).Msg("peer not allowed on the kvd socket")
		return
	}
	s.ConnsTotal.Add(1)
	s.ConnsActive.Add(1)
	defer s.ConnsActive.Add(-1)
	cn := &conn{s: s, c: c, id: s.nextConn.Add(1), enc: NewEncoder(), dec: NewDecoder()}
	defer func() {
		if n := s.store.CancelConn(cn.id); n > 0 {
			s.log.Info().Int("leases", n).Msg("connection closed: cancelled its leases")
		}
	}()
	cn.r = bufio.NewReaderSize(c, 64<<10)
	r := cn.r
	defer func() { _ = cn.flush() }() // answers to the frames before a bad one
	for {
		var err error
		if len(cn.leases) > 0 {
			// Silent past its oldest lease's deadline, or not reading
			// its replies (a write blocked that long): closed, and
			// CancelConn releases the slots.
			if dl := cn.leases[0].deadline; dl != cn.readDeadline {
				_ = c.SetDeadline(time.Unix(0, dl))
				cn.readDeadline = dl
			}
		} else if cn.readDeadline != 0 {
			_ = c.SetDeadline(time.Time{})
			cn.readDeadline = 0
		}
		cn.buf, err = ReadFrame(r, cn.buf, s.opt.MaxFrameBytes)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.BadFrames.Add(1)
				s.log.Debug().Err(err).Msg("closing connection")
			}
			return
		}
		if err := cn.dec.Decode(cn.buf, &cn.msg); err != nil {
			s.BadFrames.Add(1)
			s.log.Debug().Err(err).Msg("undecodable frame: closing connection")
			return
		}
		err = cn.dispatch()
		if err == nil && !cn.nextFrameBuffered() {
			err = cn.flush()
		}
		if err != nil {
			if errors.Is(err, errBadRequest) {
				s.BadFrames.Add(1)
			}
			if !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
				s.log.Debug().Err(err).Msg("closing connection")
			}
			return
		}
		if cap(cn.buf) > retainFrameBytes {
			cn.buf = nil
		}
		if cap(cn.sc.Value) > retainFrameBytes {
			cn.sc.Value = nil
		}
		cn.enc.Shrink(retainFrameBytes)
	}
}

var errBadRequest = errors.New("request lacks a required field")

// connLease is one lease a connection holds and when it lapses.
type connLease struct {
	token    uint64
	deadline int64 // unix ns
}

// expireLeases cancels the connection's leases past their deadline.
func (cn *conn) expireLeases(now int64) {
	n := 0
	for _, l := range cn.leases {
		if now < l.deadline {
			cn.leases[n] = l
			n++
			continue
		}
		cn.s.store.Cancel(l.token, cn.id)
		cn.s.LeasesExpired.Add(1)
	}
	cn.leases = cn.leases[:n]
}

// dropLease forgets a committed or cancelled lease.
func (cn *conn) dropLease(token uint64) {
	for i, l := range cn.leases {
		if l.token == token {
			cn.leases = append(cn.leases[:i], cn.leases[i+1:]...)
			return
		}
	}
}

func validKey(k []byte) bool { return len(k) > 0 && len(k) <= maxKeyBytes }

func validKeys(ks [][]byte) bool {
	for _, k := range ks {
		if !validKey(k) {
			return false
		}
	}
	return true
}

// Answers of at most coalesceBytes are held back while the next request
// is already buffered (a client pipelining its requests), and written
// together, up to coalesceMax bytes, when it is not: one write per burst
// instead of one per answer.
const (
	coalesceBytes = 4 << 10
	coalesceMax   = 64 << 10
)

// send writes the encoded answer, or holds it back (see coalesceBytes).
// An answer over the frame limit is replaced by a reply_too_large error,
// so no frame the client would refuse (or whose length would wrap) goes
// out.
func (cn *conn) send() error {
	if cn.enc.Len()-4 > cn.s.opt.MaxFrameBytes {
		return cn.replyTooLarge()
	}
	f := cn.enc.Frame()
	if len(f) <= coalesceBytes && len(cn.out)+len(f) <= coalesceMax {
		cn.out = append(cn.out, f...)
		if cn.nextFrameBuffered() {
			return nil
		}
		return cn.flush()
	}
	if err := cn.flush(); err != nil {
		return err
	}
	_, err := cn.c.Write(f)
	return err
}

// flush writes the held-back answers.
func (cn *conn) flush() error {
	if len(cn.out) == 0 {
		return nil
	}
	_, err := cn.c.Write(cn.out)
	cn.out = cn.out[:0]
	return err
}

// nextFrameBuffered says whether a whole next request is already read, so
// handling it cannot block and an answer may wait for it.
func (cn *conn) nextFrameBuffered() bool {
	n := cn.r.Buffered()
	if n < 4 {
		return false
	}
	hdr, _ := cn.r.Peek(4)
	return uint64(n) >= 4+uint64(binary.BigEndian.Uint32(hdr))
}

// replyTooLarge answers a request whose reply would pass the frame limit.
func (cn *conn) replyTooLarge() error {
	cn.s.RepliesTooLarge.Add(1)
	cn.enc.Shrink(retainFrameBytes)
	return cn.errorFrame("reply_too_large", "reply would exceed the frame limit of "+strconv.Itoa(cn.s.opt.MaxFrameBytes)+" bytes; ask for fewer keys")
}

func (cn *conn) errorFrame(code, msg string) error {
	cn.enc.Begin(OpError, 2)
	cn.enc.Str("code", code)
	cn.enc.Str("message", msg)
	return cn.send()
}

func (cn *conn) dispatch() error {
	m := &cn.msg
	st := cn.s.store
	first := !cn.hello
	cn.hello = true
	if m.Op.IsRequest() {
		cn.s.RequestsByOp[m.Op].Add(1)
	}
	switch m.Op {
	case OpHello:
		return cn.helloAck(first && m.PrefersSharedArena)
	case OpGet:
		if !validKey(m.Key) {
			return errBadRequest
		}
		return cn.get()
	case OpBatchGet:
		if !validKeys(m.Keys) {
			return errBadRequest
		}
		return cn.batchGet()
	case OpSet:
		if !validKey(m.Key) || !m.HasValue {
			return errBadRequest
		}
		a := &cn.setArg
		*a = SetArgs{Model: m.Model, CompatKey: m.CompatKey, Key: m.Key, Value: m.Value, TTL: m.TTL, HasTTL: m.HasTTL}
		if m.HasRetention {
			a.Retention = m.Retention
		}
		ok, reason := st.Set(a)
		cn.enc.Begin(OpSetAck, 2)
		cn.enc.Bool("accepted", ok)
		cn.reason("reason", reason)
		return cn.send()
	case OpBatchSet:
		return cn.batchSet()
	case OpSetReserve:
		var tok uint64
		slot, off, maxSize, reason := int32(-1), 0, 0, ReasonTooManyLeases
		if len(cn.leases) > 0 {
			cn.expireLeases(time.Now().UnixNano())
		}
		if len(cn.leases) < cn.s.opt.MaxLeasesPerConn {
			tok, slot, off, maxSize, reason = st.Reserve(int(min(m.Size, 1<<40)), cn.id)
			if tok != 0 {
				cn.leases = append(cn.leases, connLease{tok, time.Now().Add(cn.s.opt.LeaseTimeout).UnixNano()})
			}
		} else {
			cn.s.LeasesRefused.Add(1)
		}
		cn.enc.Begin(OpSetReserveResponse, 5)
		cn.enc.Int("lease_token", int64(tok))
		cn.enc.Int("slot_id", int64(slot))
		cn.enc.Int("payload_offset", int64(off))
		cn.enc.Int("payload_max_size", int64(maxSize))
		cn.enc.Str("reason", reason)
		return cn.send()
	case OpSetCommit:
		if len(cn.leases) > 0 {
			cn.expireLeases(time.Now().UnixNano())
		}
		cn.dropLease(uint64(m.LeaseToken))
		ok, reason := st.Commit(&CommitArgs{Token: uint64(m.LeaseToken), Conn: cn.id, Model: m.Model, CompatKey: m.CompatKey,
			Key: m.Key, Length: int(min(max(m.Length, -1), 1<<40)), Retention: m.Retention, TTLSeconds: m.TTL64()})
		cn.enc.Begin(OpSetCommitResponse, 2)
		cn.enc.Bool("accepted", ok)
		cn.enc.Str("reason", reason)
		return cn.send()
	case OpSetCancel:
		cn.dropLease(uint64(m.LeaseToken))
		st.Cancel(uint64(m.LeaseToken), cn.id)
		cn.enc.Begin(OpSetCancelResponse, 0)
		return cn.send()
	case OpPrefetchHint:
		if !validKeys(m.Keys) {
			return errBadRequest
		}
		deadline := time.Duration(min(max(m.DeadlineMs, 1), maxPrefetchDeadlineMs)) * time.Millisecond
		if len(m.Source) > 0 && cn.s.opt.PeerPrefetch != nil {
			cn.s.opt.PeerPrefetch(string(m.Source), m.Model, m.CompatKey, m.Keys, deadline)
			return nil
		}
		st.Prefetch(m.Model, m.CompatKey, m.Keys, deadline)
		return nil // no reply
	case OpExists:
		if !validKeys(m.Keys) {
			return errBadRequest
		}
		cn.enc.Begin(OpExistsResponse, 1)
		cn.enc.Array("present", len(m.Keys))
		for _, k := range m.Keys {
			cn.enc.ElemBool(st.Exists(m.Model, m.CompatKey, k, &cn.sc))
		}
		return cn.send()
	case OpClear:
		n := st.Clear(m.Model, m.CompatKey)
		cn.enc.Begin(OpClearAck, 1)
		cn.enc.Int("cleared_entries", int64(n))
		return cn.send()
	case OpStats:
		c := st.Counters()
		cn.enc.Begin(OpStatsResponse, int(iff(m.StatsClasses, 14, 9)))
		cn.enc.Int("entries", c.Entries)
		cn.enc.Int("host_bytes", c.HostBytes)
		cn.enc.Int("spillover_bytes", 0)
		cn.enc.Int("long_bytes", c.LongBytes)
		cn.enc.Int("gets_total", c.Gets)
		cn.enc.Int("sets_total", c.Sets)
		cn.enc.Int("hits_total", c.Hits)
		cn.enc.Int("misses_total", c.Misses)
		cn.enc.Int("evictions_total", c.Evictions)
		if m.StatsClasses {
			for _, f := range [...]struct {
				name string
				v    func(ClassStat) int64
			}{
				{"class_slot_bytes", func(c ClassStat) int64 { return c.SlotSize }},
				{"class_pages", func(c ClassStat) int64 { return c.Pages }},
				{"class_slots", func(c ClassStat) int64 { return c.Slots }},
				{"class_used_slots", func(c ClassStat) int64 { return c.UsedSlots }},
				{"class_value_bytes", func(c ClassStat) int64 { return c.ValueBytes }},
			} {
				cn.enc.Array(f.name, len(c.Classes))
				for _, cs := range c.Classes {
					cn.enc.ElemInt(f.v(cs))
				}
			}
		}
		return cn.send()
	}
	return cn.errorFrame("bad_op", "unsupported message type: "+truncate(m.Op.String(), 64))
}

// TTL64 is ttl_seconds as whole seconds (set_commit sends an int).
func (m *Message) TTL64() int64 {
	if !m.HasTTL || m.TTL <= 0 {
		return 0
	}
	return int64(min(m.TTL, maxTTLSeconds))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (cn *conn) reason(k, r string) {
	if r == "" {
		cn.enc.Nil(k)
		return
	}
	cn.enc.Str(k, r)
}

func (cn *conn) helloAck(withArena bool) error {
	a := cn.s.store.Arena()
	withArena = withArena && a != nil
	cn.enc.Begin(OpHelloAck, 3)
	cn.enc.Str("server_id", cn.s.serverID)
	cn.enc.Int("protocol_version", ProtocolVersion)
	if withArena {
		cn.enc.Array("shared_arena", 3)
		cn.enc.ElemInt(a.Size())
		cn.enc.ElemInt(int64(cn.s.store.SlotSize()))
		cn.enc.ElemInt(int64(os.Getpid()))
	} else {
		cn.enc.Nil("shared_arena")
	}
	if err := cn.send(); err != nil || !withArena {
		return err
	}
	if err := cn.flush(); err != nil { // the marker must follow hello_ack
		return err
	}
	if _, _, err := cn.c.WriteMsgUnix([]byte{fdMarker}, unix.UnixRights(a.FD()), nil); err != nil {
		return fmt.Errorf("send arena fd: %w", err)
	}
	cn.arena = true
	return nil
}

func (cn *conn) get() error {
	m := &cn.msg
	st := cn.s.store
	h := st.Get(m.Model, m.CompatKey, m.Key, &cn.sc)
	switch {
	case !h.Found:
	case h.Arena && cn.arena:
		cn.enc.Begin(OpGetSharedResponse, 5)
		cn.enc.Int("slot_offset", int64(h.Offset))
		cn.enc.Int("length", int64(h.Length))
		cn.enc.Int("version", int64(h.Version))
		cn.enc.Str("retention", h.Retention.String())
		cn.enc.Int("slot_size", int64(h.SlotSize))
		return cn.send()
	case h.Arena:
		cn.enc.Begin(OpGetResponse, 2)
		cn.enc.BinHeader("value", h.Length)
		cn.enc.Raw(st.arena.mem[h.Offset : h.Offset+h.Length])
		if st.StillValid(h) {
			cn.enc.Str("retention", h.Retention.String())
			return cn.send()
		}
		// rewritten while copying: answer a miss below
	default:
		cn.enc.Begin(OpGetResponse, 2)
		cn.enc.Bin("value", h.Inline)
		cn.enc.Str("retention", h.Retention.String())
		return cn.send()
	}
	cn.enc.Begin(OpGetResponse, 2)
	cn.enc.Nil("value")
	cn.enc.Nil("retention")
	return cn.send()
}

func (cn *conn) batchGet() error {
	m := &cn.msg
	st := cn.s.store
	n := len(m.Keys)
	if cn.arena {
		// Parallel arrays: collect the hits first.
		cn.hits = cn.hits[:0]
		for _, k := range m.Keys {
			h := st.Get(m.Model, m.CompatKey, k, &cn.sc)
			cn.hits = append(cn.hits, h)
		}
		hits := cn.hits
		cn.enc.Begin(OpBatchGetSharedResponse, 5)
		cn.enc.Array("offsets", n)
		for _, h := range hits {
			cn.enc.ElemInt(iff(h.Arena, int64(h.Offset), -1))
		}
		cn.enc.Array("lengths", n)
		for _, h := range hits {
			cn.enc.ElemInt(iff(h.Arena, int64(h.Length), 0))
		}
		cn.enc.Array("versions", n)
		for _, h := range hits {
			cn.enc.ElemInt(iff(h.Arena, int64(h.Version), 0))
		}
		cn.enc.Array("retentions", n)
		for _, h := range hits {
			if h.Arena {
				cn.enc.ElemStr(retentionBytes[h.Retention])
			} else {
				cn.enc.ElemNil()
			}
		}
		cn.enc.Int("slot_size", int64(st.SlotSize()))
		return cn.send()
	}
	cn.hits = cn.hits[:0]
	cn.enc.Begin(OpBatchGetResponse, 2)
	cn.enc.Array("values", n)
	for _, k := range m.Keys {
		h := st.Get(m.Model, m.CompatKey, k, &cn.sc)
		switch {
		case h.Found && h.Arena:
			mark := cn.enc.Len()
			cn.enc.ElemBin(st.arena.mem[h.Offset : h.Offset+h.Length])
			if !st.StillValid(h) {
				cn.enc.Truncate(mark)
				cn.enc.ElemNil()
				h.Found = false
			}
		case h.Found:
			cn.enc.ElemBin(h.Inline)
		default:
			cn.enc.ElemNil()
		}
		if cn.enc.Len()-4 > cn.s.opt.MaxFrameBytes {
			return cn.replyTooLarge() // stop before building more
		}
		cn.hits = append(cn.hits, Hit{Found: h.Found, Retention: h.Retention})
	}
	cn.enc.Array("retentions", n)
	for _, h := range cn.hits {
		if h.Found {
			cn.enc.ElemStr(retentionBytes[h.Retention])
		} else {
			cn.enc.ElemNil()
		}
	}
	return cn.send()
}

var retentionBytes = [numRetentions][]byte{[]byte("none"), []byte("ephemeral"), []byte("short"), []byte("long")}

func iff(c bool, a, b int64) int64 {
	if c {
		return a
	}
	return b
}

func (cn *conn) batchSet() error {
	m := &cn.msg
	n := len(m.Keys)
	if !validKeys(m.Keys) {
		return errBadRequest
	}
	if len(m.Values) != n || len(m.Retentions) != n || m.NumMetadatas != n || (m.HasTTLs && len(m.TTLs) != n) {
		ttls := "None"
		if m.HasTTLs {
			ttls = fmt.Sprint(len(m.TTLs))
		}
		return cn.errorFrame("batch_set_arity_mismatch", fmt.Sprintf("BatchSet arrays disagree: keys=%d values=%d retentions=%d metadatas=%d ttls_seconds=%s",
			n, len(m.Values), len(m.Retentions), m.NumMetadatas, ttls))
	}
	cn.oks, cn.reasons = append(cn.oks[:0], make([]bool, n)...), append(cn.reasons[:0], make([]string, n)...)
	oks, reasons := cn.oks, cn.reasons
	for i := range n {
		a := &cn.setArg
		*a = SetArgs{Model: m.Model, CompatKey: m.CompatKey, Key: m.Keys[i], Value: m.Values[i], Retention: m.Retentions[i]}
		if a.Retention == nil {
			a.Retention = retentionBytes[RetentionShort]
		}
		if m.HasTTLs {
			a.TTL, a.HasTTL = m.TTLs[i], m.TTLSet[i]
		}
		if a.Value == nil {
			oks[i], reasons[i] = false, "missing_value"
			continue
		}
		oks[i], reasons[i] = cn.s.store.Set(a)
	}
	cn.enc.Begin(OpBatchSetAck, 2)
	cn.enc.Array("accepted", n)
	for _, ok := range oks {
		cn.enc.ElemBool(ok)
	}
	cn.enc.Array("reasons", n)
	for _, r := range reasons {
		if r == "" {
			cn.enc.ElemNil()
		} else {
			cn.enc.ElemStr([]byte(r))
		}
	}
	return cn.send()
}
