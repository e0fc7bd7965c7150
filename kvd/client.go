package kvd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Namespace is the (model, compat_key) pair every key lives under.
type Namespace struct {
	Model, CompatKey string
}

// ClientOptions configure Dial.
type ClientOptions struct {
	ClientID string
	// SharedArena asks for the arena fd and maps it (zero-copy reads).
	SharedArena bool
	// NoHello skips the handshake ("no-hello" mode; no arena).
	NoHello       bool
	MaxFrameBytes int
	// Timeout, when positive, bounds every request (its write and the
	// reads of its answers) unless the request's context ends sooner.
	Timeout time.Duration
}

// pipeDepth bounds the requests a batched zero-copy set sends before it
// reads their answers, so that neither side can block on a full socket
// buffer while the other is still writing: 512 set_reserve answers are
// about 60 KB and 512 set_commit requests about 50 KB (with short model
// and compat_key names), well within the default Unix-socket buffer (208
// KiB) and the daemon's 64 KiB read buffer and answer coalescing. Each
// chunk costs two round trips, so fewer chunks means fewer wake-ups.
const pipeDepth = 512

// Client is a connection to kvd. Methods are safe for concurrent use and
// run one request at a time. Byte results are copied into caller buffers.
//
// Every method has a ...Ctx variant taking a context: its deadline (or
// ClientOptions.Timeout, whichever is sooner) bounds the request, and its
// cancellation interrupts it. A request that fails on the socket (a
// deadline, a cancellation, an I/O or framing error) leaves the stream at
// an unknown point, so the client closes the connection and every later
// call returns ErrClientClosed; dial again.
type Client struct {
	mu      sync.Mutex
	c       *net.UnixConn
	r       *bufio.Reader // after the handshake (the fd marker is read raw)
	enc     *Encoder
	dec     *Decoder
	msg     Message
	buf     []byte
	max     int
	mem     []byte // the mapped arena, when negotiated
	timeout time.Duration
	dl      bool          // a deadline is set on c
	broken  error         // why the connection was given up
	fired   chan struct{} // closed when the request's cancellation ran
	pipe    []byte
	leases  []Lease // BatchSetZeroCopy scratch
	// ServerID is hello_ack's server_id; ArenaPID the daemon's pid.
	ServerID string
	ArenaPID int64
}

// Dial connects to the daemon at path. ctx bounds the connect and the
// handshake only.
func Dial(ctx context.Context, path string, opt ClientOptions) (*Client, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial kvd %s: %w", path, err)
	}
	cl := &Client{c: nc.(*net.UnixConn), enc: NewEncoder(), dec: NewDecoder(), max: opt.MaxFrameBytes, timeout: opt.Timeout}
	if cl.max <= 0 {
		cl.max = DefaultMaxFrameBytes
	}
	cl.max = min(cl.max, MaxFrameLimit)
	if !opt.NoHello {
		if dl, ok := ctx.Deadline(); ok {
			_ = cl.c.SetDeadline(dl)
		}
		if err := cl.hello(opt); err != nil {
			cl.c.Close()
			return nil, err
		}
		_ = cl.c.SetDeadline(time.Time{})
	}
	cl.r = bufio.NewReaderSize(cl.c, 64<<10)
	return cl, nil
}

func (cl *Client) hello(opt ClientOptions) error {
	cl.enc.Begin(OpHello, 3)
	cl.enc.Str("client_id", opt.ClientID)
	cl.enc.Int("protocol_version", ProtocolVersion)
	cl.enc.Bool("prefers_shared_arena", opt.SharedArena)
	if err := cl.roundTrip(OpHelloAck); err != nil {
		return err
	}
	cl.ServerID = string(cl.msg.ServerID)
	if !cl.msg.HasArena {
		return nil
	}
	size, pid := cl.msg.SharedArena[0], cl.msg.SharedArena[2]
	oob := make([]byte, unix.CmsgSpace(4))
	var b [1]byte
	n, oobn, _, _, err := cl.c.ReadMsgUnix(b[:], oob)
	if err != nil {
		return fmt.Errorf("receive arena fd: %w", err)
	}
	if n != 1 || b[0] != fdMarker {
		return fmt.Errorf("%w: arena marker %q", ErrProtocol, b[:n])
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return fmt.Errorf("%w: arena fd control message", ErrProtocol)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return fmt.Errorf("%w: arena fd rights", ErrProtocol)
	}
	defer unix.Close(fds[0])
	mem, err := unix.Mmap(fds[0], 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("map arena: %w", err)
	}
	cl.mem, cl.ArenaPID = mem, pid
	return nil
}

// aLongTimeAgo is a deadline already past: it interrupts a blocked call.
var aLongTimeAgo = time.Unix(1, 0)

// begin takes the lock and arms the request's deadline; end (always
// called) disarms it and gives up the connection after a socket failure.
func (cl *Client) begin(ctx context.Context) (stop func() bool, err error) {
	cl.mu.Lock()
	if cl.broken != nil {
		cl.mu.Unlock()
		return nil, cl.broken
	}
	if err := ctx.Err(); err != nil {
		cl.mu.Unlock()
		return nil, fmt.Errorf("kvd request: %w", err)
	}
	dl, has := ctx.Deadline()
	if cl.timeout > 0 {
		if t := time.Now().Add(cl.timeout); !has || t.Before(dl) {
			dl, has = t, true
		}
	}
	switch {
	case has:
		_ = cl.c.SetDeadline(dl)
		cl.dl = true
	case cl.dl:
		_ = cl.c.SetDeadline(time.Time{})
		cl.dl = false
	}
	if ctx.Done() != nil {
		fired := make(chan struct{})
		cl.fired = fired
		stop = context.AfterFunc(ctx, func() {
			_ = cl.c.SetDeadline(aLongTimeAgo)
			close(fired)
		})
	}
	return stop, nil
}

func (cl *Client) end(ctx context.Context, stop func() bool, err *error) {
	if stop != nil && !stop() {
		<-cl.fired // the cancellation set a past deadline: let it finish
		cl.dl = true
	}
	if *err != nil && errors.Is(*err, errSocket) {
		cerr := ctx.Err()
		if dl, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(dl) && errors.Is(*err, os.ErrDeadlineExceeded) {
			cerr = context.DeadlineExceeded // the socket's timer fired first
		}
		if cerr != nil {
			*err = fmt.Errorf("kvd request: %w: %w", cerr, *err)
		}
		cl.broken = fmt.Errorf("%w: %w", ErrClientClosed, *err)
		_ = cl.c.Close()
	}
	cl.mu.Unlock()
}

// errSocket marks failures that leave the stream at an unknown point.
var errSocket = errors.New("kvd socket")

// HasArena says whether the arena is mapped.
func (cl *Client) HasArena() bool { return cl.mem != nil }

// Close closes the connection and unmaps the arena.
func (cl *Client) Close() error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	err := cl.c.Close()
	if cl.broken != nil {
		err = nil // closed when it broke
	} else {
		cl.broken = ErrClientClosed
	}
	if cl.mem != nil {
		_ = unix.Munmap(cl.mem)
		cl.mem = nil
	}
	return err
}

// writeFrame writes the encoded frame, refusing one over the frame limit.
func (cl *Client) writeFrame() error {
	if n := cl.enc.Len() - 4; n > cl.max {
		return fmt.Errorf("%w: request of %d bytes, limit %d", ErrFrameTooLarge, n, cl.max)
	}
	return cl.write(cl.enc.Frame())
}

// write sends b; a failure is a socket failure.
func (cl *Client) write(b []byte) error {
	if _, err := cl.c.Write(b); err != nil {
		return fmt.Errorf("%w: write: %w", errSocket, err)
	}
	return nil
}

// roundTrip sends the encoded frame and decodes the answer into cl.msg.
func (cl *Client) roundTrip(want ...Op) error {
	if err := cl.writeFrame(); err != nil {
		return err
	}
	return cl.read(want...)
}

// read decodes the next frame into cl.msg. Until the handshake is done
// reads are unbuffered, so the arena marker after hello_ack stays unread.
func (cl *Client) read(want ...Op) error {
	var err error
	if cl.r != nil {
		cl.buf, err = ReadFrame(cl.r, cl.buf, cl.max)
	} else {
		cl.buf, err = ReadFrame(cl.c, cl.buf, cl.max)
	}
	if err != nil {
		return fmt.Errorf("%w: read: %w", errSocket, err)
	}
	if err := cl.dec.Decode(cl.buf, &cl.msg); err != nil {
		return fmt.Errorf("%w: %w", errSocket, err)
	}
	if cl.msg.Op == OpError {
		return fmt.Errorf("%w: %s: %s", ErrServer, cl.msg.Code, cl.msg.ErrMessage)
	}
	for _, w := range want {
		if cl.msg.Op == w {
			return nil
		}
	}
	return fmt.Errorf("%w: %w: %s", errSocket, ErrProtocol, cl.msg.Op)
}

func (cl *Client) ns(ns Namespace) {
	cl.enc.Str("model", ns.Model)
	cl.enc.Str("compat_key", ns.CompatKey)
}

// Get appends key's value to dst[:0]. Over the arena the bytes are copied
// straight from the shared slot, checked with its seqlock; a slot rewritten
// meanwhile reads as a miss.
func (cl *Client) Get(ns Namespace, key, dst []byte) (val []byte, ret Retention, ok bool, err error) {
	return cl.GetCtx(context.Background(), ns, key, dst)
}

// GetCtx is Get bounded by ctx.
func (cl *Client) GetCtx(ctx context.Context, ns Namespace, key, dst []byte) (val []byte, ret Retention, ok bool, err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return dst, 0, false, err
	}
	defer cl.end(ctx, stop, &err)
	cl.enc.Begin(OpGet, 3)
	cl.enc.Bin("key", key)
	cl.ns(ns)
	if err := cl.roundTrip(OpGetResponse, OpGetSharedResponse); err != nil {
		return dst, 0, false, err
	}
	m := &cl.msg
	ret, _ = ParseRetention(m.Retention)
	if m.Op == OpGetResponse {
		if !m.HasValue {
			return dst[:0], 0, false, nil
		}
		return append(dst[:0], m.Value...), ret, true, nil
	}
	if cl.mem == nil {
		return dst, 0, false, ErrNoArena
	}
	out, err := ReadSlot(cl.mem, int(m.SlotOffset), int(m.Length), uint32(m.Version), dst)
	if errors.Is(err, ErrTornRead) {
		return out[:0], 0, false, nil
	}
	if err != nil {
		return out, 0, false, err
	}
	return out, ret, true, nil
}

// SharedRef locates a value in the arena (get_shared_response).
type SharedRef struct {
	Offset, Length int
	Version        uint32
}

// GetRef asks for key and returns where the value lies in the arena
// without touching its bytes: the zero-copy path. ok is false on a miss
// or for a value the daemon keeps outside the arena.
func (cl *Client) GetRef(ns Namespace, key []byte) (SharedRef, bool, error) {
	return cl.GetRefCtx(context.Background(), ns, key)
}

// GetRefCtx is GetRef bounded by ctx.
func (cl *Client) GetRefCtx(ctx context.Context, ns Namespace, key []byte) (ref SharedRef, ok bool, err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return SharedRef{}, false, err
	}
	defer cl.end(ctx, stop, &err)
	cl.enc.Begin(OpGet, 3)
	cl.enc.Bin("key", key)
	cl.ns(ns)
	if err := cl.roundTrip(OpGetResponse, OpGetSharedResponse); err != nil {
		return SharedRef{}, false, err
	}
	if cl.msg.Op != OpGetSharedResponse || cl.mem == nil {
		return SharedRef{}, false, nil
	}
	m := &cl.msg
	if m.SlotOffset < HeaderBytes || m.Length < 0 || m.SlotOffset+m.Length > int64(len(cl.mem)) {
		return SharedRef{}, false, fmt.Errorf("%w: slot outside the arena", ErrProtocol)
	}
	return SharedRef{Offset: int(m.SlotOffset), Length: int(m.Length), Version: uint32(m.Version)}, true, nil
}

// View is the arena bytes of ref. They are only trustworthy if Valid(ref)
// still holds after the caller is done with them.
func (cl *Client) View(ref SharedRef) []byte { return cl.mem[ref.Offset : ref.Offset+ref.Length] }

// Valid says whether ref's slot still holds the value it named.
func (cl *Client) Valid(ref SharedRef) bool { return slotVersion(cl.mem, ref.Offset) == ref.Version }

// SetOptions are a set's retention and TTL (zero TTL: none).
type SetOptions struct {
	Retention string
	TTL       time.Duration
}

// Set stores value inline over the socket.
func (cl *Client) Set(ns Namespace, key, value []byte, o SetOptions) (bool, string, error) {
	return cl.SetCtx(context.Background(), ns, key, value, o)
}

// SetCtx is Set bounded by ctx.
func (cl *Client) SetCtx(ctx context.Context, ns Namespace, key, value []byte, o SetOptions) (ok bool, reason string, err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return false, "", err
	}
	defer cl.end(ctx, stop, &err)
	cl.enc.Begin(OpSet, 7)
	cl.enc.Bin("key", key)
	cl.enc.Bin("value", value)
	cl.enc.Str("retention", retOr(o.Retention))
	cl.ns(ns)
	cl.enc.Map("metadata")
	if o.TTL > 0 {
		cl.enc.Float("ttl_seconds", o.TTL.Seconds())
	} else {
		cl.enc.Nil("ttl_seconds")
	}
	if err := cl.roundTrip(OpSetAck); err != nil {
		return false, "", err
	}
	return cl.msg.Accepted, internReason(cl.msg.Reason), nil
}

func retOr(r string) string {
	if r == "" {
		return "short"
	}
	return r
}

var knownReasons = []string{ReasonBadRetention, ReasonDowngrade, ReasonDisplaceHigher, ReasonLargerThanStore,
	ReasonNoArena, ReasonOversize, ReasonBadSize, ReasonArenaFull, ReasonUnknownLease, ReasonWrongOwner,
	ReasonOversizeCommit, ReasonEmptyKey, ReasonLongWriteRejected, "missing_value"}

// internReason is a reason as a string, without allocating for the ones
// this daemon sends.
func internReason(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	for _, r := range knownReasons {
		if string(b) == r {
			return r
		}
	}
	return string(b)
}

// SetZeroCopy writes value through a lease: reserve, copy into the
// arena, commit. It falls back to nothing: a refused lease is reported.
func (cl *Client) SetZeroCopy(ns Namespace, key, value []byte, o SetOptions) (bool, string, error) {
	return cl.SetZeroCopyCtx(context.Background(), ns, key, value, o)
}

// SetZeroCopyCtx is SetZeroCopy with each of its two requests bounded by ctx.
func (cl *Client) SetZeroCopyCtx(ctx context.Context, ns Namespace, key, value []byte, o SetOptions) (bool, string, error) {
	l, err := cl.ReserveCtx(ctx, len(value))
	if err != nil || l.Token == 0 {
		return false, l.Reason, err
	}
	if l.PayloadMaxSize < len(value) {
		_ = cl.CancelCtx(ctx, l.Token)
		return false, "", fmt.Errorf("%w: lease of %d bytes for a %d-byte value", ErrProtocol, l.PayloadMaxSize, len(value))
	}
	copy(cl.mem[l.PayloadOffset:], value)
	return cl.CommitCtx(ctx, l.Token, ns, key, len(value), o)
}

// Lease is a set_reserve_response.
type Lease struct {
	Token          uint64
	SlotID         int64
	PayloadOffset  int
	PayloadMaxSize int
	Reason         string
}

// Reserve leases an arena slot for size bytes (Token 0: refused). It
// needs the arena mapped.
func (cl *Client) Reserve(size int) (Lease, error) {
	return cl.ReserveCtx(context.Background(), size)
}

// ReserveCtx is Reserve bounded by ctx.
func (cl *Client) ReserveCtx(ctx context.Context, size int) (l Lease, err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return Lease{}, err
	}
	defer cl.end(ctx, stop, &err)
	if cl.mem == nil {
		return Lease{}, ErrNoArena
	}
	cl.enc.Begin(OpSetReserve, 1)
	cl.enc.Int("size", int64(size))
	if err := cl.roundTrip(OpSetReserveResponse); err != nil {
		return Lease{}, err
	}
	return cl.lease()
}

// lease reads the set_reserve_response in cl.msg.
func (cl *Client) lease() (Lease, error) {
	m := &cl.msg
	l := Lease{Token: uint64(m.LeaseToken), SlotID: m.SlotID, PayloadOffset: int(m.PayloadOffset), PayloadMaxSize: int(m.PayloadMaxSize), Reason: internReason(m.Reason)}
	if l.Token != 0 && (l.PayloadOffset < HeaderBytes || l.PayloadMaxSize < 0 || l.PayloadOffset+l.PayloadMaxSize > len(cl.mem)) {
		return l, fmt.Errorf("%w: lease outside the arena", ErrProtocol)
	}
	return l, nil
}

// Arena is the mapped arena (nil without one), for writing leased slots.
func (cl *Client) Arena() []byte { return cl.mem }

// Commit names a leased slot's bytes.
func (cl *Client) Commit(token uint64, ns Namespace, key []byte, length int, o SetOptions) (bool, string, error) {
	return cl.CommitCtx(context.Background(), token, ns, key, length, o)
}

// CommitCtx is Commit bounded by ctx.
func (cl *Client) CommitCtx(ctx context.Context, token uint64, ns Namespace, key []byte, length int, o SetOptions) (ok bool, reason string, err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return false, "", err
	}
	defer cl.end(ctx, stop, &err)
	cl.commitFrame(token, ns, key, length, o)
	if err := cl.roundTrip(OpSetCommitResponse); err != nil {
		return false, "", err
	}
	return cl.msg.Accepted, internReason(cl.msg.Reason), nil
}

func (cl *Client) commitFrame(token uint64, ns Namespace, key []byte, length int, o SetOptions) {
	cl.enc.Begin(OpSetCommit, 7)
	cl.enc.Int("lease_token", int64(token))
	cl.enc.Bin("key", key)
	cl.enc.Int("length", int64(length))
	cl.ns(ns)
	cl.enc.Str("retention", retOr(o.Retention))
	cl.enc.Int("ttl_seconds", int64(o.TTL/time.Second))
}

// Cancel drops a lease.
func (cl *Client) Cancel(token uint64) error {
	return cl.CancelCtx(context.Background(), token)
}

// CancelCtx is Cancel bounded by ctx.
func (cl *Client) CancelCtx(ctx context.Context, token uint64) (err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return err
	}
	defer cl.end(ctx, stop, &err)
	cl.enc.Begin(OpSetCancel, 1)
	cl.enc.Int("lease_token", int64(token))
	return cl.roundTrip(OpSetCancelResponse)
}

// Exists appends each key's presence (RAM or L3) to dst[:0].
func (cl *Client) Exists(ns Namespace, keys [][]byte, dst []bool) ([]bool, error) {
	return cl.ExistsCtx(context.Background(), ns, keys, dst)
}

// ExistsCtx is Exists bounded by ctx.
func (cl *Client) ExistsCtx(ctx context.Context, ns Namespace, keys [][]byte, dst []bool) (_ []bool, err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return dst[:0], err
	}
	defer cl.end(ctx, stop, &err)
	cl.keysOp(OpExists, ns, keys, 0)
	if err := cl.roundTrip(OpExistsResponse); err != nil {
		return dst[:0], err
	}
	if len(cl.msg.Present) != len(keys) {
		return dst[:0], fmt.Errorf("%w: %d answers for %d keys", ErrProtocol, len(cl.msg.Present), len(keys))
	}
	return append(dst[:0], cl.msg.Present...), nil
}

func (cl *Client) keysOp(op Op, ns Namespace, keys [][]byte, extra int) {
	cl.enc.Begin(op, 3+extra)
	cl.enc.Array("keys", len(keys))
	for _, k := range keys {
		cl.enc.ElemBin(k)
	}
	cl.ns(ns)
}

// PrefetchHint asks the daemon to warm keys from L3 for deadline. No reply.
func (cl *Client) PrefetchHint(ns Namespace, keys [][]byte, deadline time.Duration) error {
	return cl.PrefetchHintCtx(context.Background(), ns, keys, deadline)
}

// PrefetchHintCtx is PrefetchHint with its write bounded by ctx.
func (cl *Client) PrefetchHintCtx(ctx context.Context, ns Namespace, keys [][]byte, deadline time.Duration) (err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return err
	}
	defer cl.end(ctx, stop, &err)
	cl.keysOp(OpPrefetchHint, ns, keys, 1)
	cl.enc.Int("deadline_ms", deadline.Milliseconds())
	return cl.writeFrame()
}

// PrefetchFromCtx asks the daemon to pull keys from the kvd whose peer
// control listener is source (kvd/peer) and keep them for deadline. No
// reply. Beyond the reference protocol: a daemon without peer pulls warms
// them from its L3 instead.
func (cl *Client) PrefetchFromCtx(ctx context.Context, ns Namespace, source string, keys [][]byte, deadline time.Duration) (err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return err
	}
	defer cl.end(ctx, stop, &err)
	cl.keysOp(OpPrefetchHint, ns, keys, 2)
	cl.enc.Int("deadline_ms", deadline.Milliseconds())
	cl.enc.Str("source", source)
	return cl.write(cl.enc.Frame())
}

// BatchGet returns one value per key (nil: miss), copied into new
// buffers. BatchGetInto reuses the caller's.
func (cl *Client) BatchGet(ns Namespace, keys [][]byte) ([][]byte, error) {
	return cl.BatchGetCtx(context.Background(), ns, keys)
}

// BatchGetCtx is BatchGet bounded by ctx.
func (cl *Client) BatchGetCtx(ctx context.Context, ns Namespace, keys [][]byte) ([][]byte, error) {
	var r BatchResult
	if err := cl.BatchGetIntoCtx(ctx, ns, keys, &r); err != nil {
		return nil, err
	}
	for i, f := range r.Found {
		if !f {
			r.Values[i] = nil
		}
	}
	return r.Values, nil
}

// BatchResult receives a batch get: per key, whether it was found, its
// retention, and its value copied into Values[i] (whose buffer is reused
// from call to call: keep one BatchResult per caller).
type BatchResult struct {
	Values     [][]byte
	Found      []bool
	Retentions []Retention
}

func (r *BatchResult) reset(n int) {
	if cap(r.Values) < n {
		r.Values = append(r.Values[:cap(r.Values)], make([][]byte, n-cap(r.Values))...)
	}
	r.Values = r.Values[:n]
	r.Found = append(r.Found[:0], make([]bool, n)...)
	r.Retentions = append(r.Retentions[:0], make([]Retention, n)...)
}

// BatchGetInto gets keys in one batch_get round trip. Over the arena
// (batch_get_shared_response) every value is copied straight out of its
// slot with the slot-header check, so a slot rewritten meanwhile reads as
// a miss; without it the values come in the frame. Once r's buffers have
// grown it does not allocate.
func (cl *Client) BatchGetInto(ns Namespace, keys [][]byte, r *BatchResult) error {
	return cl.BatchGetIntoCtx(context.Background(), ns, keys, r)
}

// BatchGetIntoCtx is BatchGetInto bounded by ctx.
func (cl *Client) BatchGetIntoCtx(ctx context.Context, ns Namespace, keys [][]byte, r *BatchResult) (err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return err
	}
	defer cl.end(ctx, stop, &err)
	r.reset(len(keys))
	cl.keysOp(OpBatchGet, ns, keys, 0)
	if err := cl.roundTrip(OpBatchGetResponse, OpBatchGetSharedResponse); err != nil {
		return err
	}
	m := &cl.msg
	if m.Op == OpBatchGetResponse {
		if len(m.Values) != len(keys) || (len(m.Retentions) != 0 && len(m.Retentions) != len(keys)) {
			return fmt.Errorf("%w: %d values for %d keys", ErrProtocol, len(m.Values), len(keys))
		}
		for i, v := range m.Values {
			if v != nil {
				r.Values[i] = append(r.Values[i][:0], v...)
				r.Found[i] = true
				if len(m.Retentions) != 0 {
					r.Retentions[i], _ = ParseRetention(m.Retentions[i])
				}
			}
		}
		return nil
	}
	if len(m.Offsets) != len(keys) || len(m.Lengths) != len(keys) || len(m.Versions) != len(keys) || cl.mem == nil {
		return fmt.Errorf("%w: batch_get_shared_response arity", ErrProtocol)
	}
	for i := range keys {
		if m.Offsets[i] < 0 || m.Lengths[i] == 0 {
			continue
		}
		v, err := ReadSlot(cl.mem, int(m.Offsets[i]), int(m.Lengths[i]), uint32(m.Versions[i]), r.Values[i])
		r.Values[i] = v
		if errors.Is(err, ErrTornRead) {
			continue
		}
		if err != nil {
			return err
		}
		r.Found[i] = true
		if i < len(m.Retentions) {
			r.Retentions[i], _ = ParseRetention(m.Retentions[i])
		}
	}
	return nil
}

// BatchSet stores values inline; it returns per-item acceptance.
func (cl *Client) BatchSet(ns Namespace, keys, values [][]byte, o SetOptions) ([]bool, []string, error) {
	return cl.BatchSetCtx(context.Background(), ns, keys, values, o)
}

// BatchSetCtx is BatchSet bounded by ctx.
func (cl *Client) BatchSetCtx(ctx context.Context, ns Namespace, keys, values [][]byte, o SetOptions) (_ []bool, _ []string, err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer cl.end(ctx, stop, &err)
	cl.keysOp(OpBatchSet, ns, keys, 4)
	cl.enc.Array("values", len(values))
	for _, v := range values {
		cl.enc.ElemBin(v)
	}
	cl.enc.Array("retentions", len(keys))
	for range keys {
		cl.enc.ElemStr([]byte(retOr(o.Retention)))
	}
	cl.enc.Array("metadatas", len(keys))
	for range keys {
		cl.enc.ElemMap()
	}
	if o.TTL > 0 {
		cl.enc.Array("ttls_seconds", len(keys))
		for range keys {
			cl.enc.ElemFloat(o.TTL.Seconds())
		}
	} else {
		cl.enc.Nil("ttls_seconds")
	}
	if err := cl.roundTrip(OpBatchSetAck); err != nil {
		return nil, nil, err
	}
	m := &cl.msg
	reasons := make([]string, len(m.Reasons))
	for i, r := range m.Reasons {
		reasons[i] = internReason(r)
	}
	return append([]bool(nil), m.AcceptedList...), reasons, nil
}

// BatchSetResult receives a batched zero-copy set: per item, whether it
// was stored and why not (reuse one per caller).
type BatchSetResult struct {
	Accepted []bool
	Reasons  []string
}

// BatchSetZeroCopy stores values through arena leases with the requests
// pipelined on the connection: the set_reserve requests of up to 512
// items go out in one write, their answers are read, each value is copied
// into its leased slot, then their set_commit requests go out in one
// write — two round trips per 512 items instead of two per item. An item
// whose lease is refused is reported with the reservation's reason. Once
// r has grown it allocates nothing in the client.
func (cl *Client) BatchSetZeroCopy(ns Namespace, keys, values [][]byte, o SetOptions, r *BatchSetResult) error {
	return cl.BatchSetZeroCopyCtx(context.Background(), ns, keys, values, o, r)
}

// BatchSetZeroCopyCtx is BatchSetZeroCopy bounded by ctx.
func (cl *Client) BatchSetZeroCopyCtx(ctx context.Context, ns Namespace, keys, values [][]byte, o SetOptions, r *BatchSetResult) (err error) {
	if len(keys) != len(values) {
		return fmt.Errorf("%w: %d keys for %d values", ErrConfig, len(keys), len(values))
	}
	stop, err := cl.begin(ctx)
	if err != nil {
		return err
	}
	defer cl.end(ctx, stop, &err)
	if cl.mem == nil {
		return ErrNoArena
	}
	r.Accepted = append(r.Accepted[:0], make([]bool, len(keys))...)
	r.Reasons = append(r.Reasons[:0], make([]string, len(keys))...)
	for lo := 0; lo < len(keys); lo += pipeDepth {
		hi := min(lo+pipeDepth, len(keys))
		if err := cl.setChunk(ns, keys[lo:hi], values[lo:hi], o, r.Accepted[lo:hi], r.Reasons[lo:hi]); err != nil {
			return err
		}
	}
	return nil
}

// setChunk is one pipelined reserve → copy → commit exchange.
func (cl *Client) setChunk(ns Namespace, keys, values [][]byte, o SetOptions, acc []bool, reasons []string) error {
	cl.pipe = cl.pipe[:0]
	for _, v := range values {
		cl.enc.Begin(OpSetReserve, 1)
		cl.enc.Int("size", int64(len(v)))
		cl.pipe = append(cl.pipe, cl.enc.Frame()...)
	}
	if err := cl.write(cl.pipe); err != nil {
		return err
	}
	cl.leases = cl.leases[:0]
	for range values {
		if err := cl.read(OpSetReserveResponse); err != nil {
			return err
		}
		l, err := cl.lease()
		if err == nil && l.Token != 0 && l.PayloadMaxSize < len(values[len(cl.leases)]) {
			err = fmt.Errorf("%w: lease of %d bytes for a %d-byte value", ErrProtocol, l.PayloadMaxSize, len(values[len(cl.leases)]))
		}
		if err != nil {
			// Answers may still be unread; the leases die with the connection.
			return fmt.Errorf("%w: %w", errSocket, err)
		}
		cl.leases = append(cl.leases, l)
	}
	cl.pipe = cl.pipe[:0]
	for i, l := range cl.leases {
		if l.Token == 0 {
			reasons[i] = l.Reason
			continue
		}
		copy(cl.mem[l.PayloadOffset:l.PayloadOffset+len(values[i])], values[i])
		cl.commitFrame(l.Token, ns, keys[i], len(values[i]), o)
		cl.pipe = append(cl.pipe, cl.enc.Frame()...)
	}
	if len(cl.pipe) == 0 {
		return nil
	}
	if err := cl.write(cl.pipe); err != nil {
		return err
	}
	for i, l := range cl.leases {
		if l.Token == 0 {
			continue
		}
		if err := cl.read(OpSetCommitResponse); err != nil {
			return err
		}
		acc[i], reasons[i] = cl.msg.Accepted, internReason(cl.msg.Reason)
	}
	return nil
}

// Clear drops a namespace (both empty: everything, L3 included).
func (cl *Client) Clear(ns Namespace) (int64, error) {
	return cl.ClearCtx(context.Background(), ns)
}

// ClearCtx is Clear bounded by ctx.
func (cl *Client) ClearCtx(ctx context.Context, ns Namespace) (_ int64, err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer cl.end(ctx, stop, &err)
	cl.enc.Begin(OpClear, 2)
	cl.ns(ns)
	if err := cl.roundTrip(OpClearAck); err != nil {
		return 0, err
	}
	return cl.msg.ClearedEntries, nil
}

// Stats returns stats_response.
func (cl *Client) Stats() (StatsCounters, error) {
	return cl.StatsCtx(context.Background())
}

// StatsCtx is Stats bounded by ctx.
func (cl *Client) StatsCtx(ctx context.Context) (_ StatsCounters, err error) {
	stop, err := cl.begin(ctx)
	if err != nil {
		return StatsCounters{}, err
	}
	defer cl.end(ctx, stop, &err)
	cl.enc.Begin(OpStats, 1)
	cl.enc.Bool("classes", true) // the per-class lists (a kvd extension)
	if err := cl.roundTrip(OpStatsResponse); err != nil {
		return StatsCounters{}, err
	}
	return cl.msg.Stats, nil
}
