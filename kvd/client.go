package kvd

import (
	"context"
	"errors"
	"fmt"
	"net"
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
}

// Client is a connection to kvd. Methods are safe for concurrent use and
// run one request at a time. Byte results are copied into caller buffers.
type Client struct {
	mu       sync.Mutex
	c        *net.UnixConn
	enc      *Encoder
	dec      *Decoder
	msg      Message
	buf      []byte
	max      int
	mem      []byte // the mapped arena, when negotiated
	ServerID string
	ArenaPID int64
}

// Dial connects to the daemon at path.
func Dial(ctx context.Context, path string, opt ClientOptions) (*Client, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial kvd %s: %w", path, err)
	}
	cl := &Client{c: nc.(*net.UnixConn), enc: NewEncoder(), dec: NewDecoder(), max: opt.MaxFrameBytes}
	if cl.max <= 0 {
		cl.max = DefaultMaxFrameBytes
	}
	if opt.NoHello {
		return cl, nil
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = cl.c.SetDeadline(dl)
	}
	if err := cl.hello(opt); err != nil {
		cl.c.Close()
		return nil, err
	}
	_ = cl.c.SetDeadline(time.Time{})
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

// HasArena says whether the arena is mapped.
func (cl *Client) HasArena() bool { return cl.mem != nil }

// Close closes the connection and unmaps the arena.
func (cl *Client) Close() error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	err := cl.c.Close()
	if cl.mem != nil {
		_ = unix.Munmap(cl.mem)
		cl.mem = nil
	}
	return err
}

// roundTrip sends the encoded frame and decodes the answer into cl.msg.
// Reads are unbuffered so the arena marker after hello_ack stays unread.
func (cl *Client) roundTrip(want ...Op) error {
	if _, err := cl.c.Write(cl.enc.Frame()); err != nil {
		return fmt.Errorf("kvd write: %w", err)
	}
	return cl.read(want...)
}

func (cl *Client) read(want ...Op) error {
	var err error
	cl.buf, err = ReadFrame(cl.c, cl.buf, cl.max)
	if err != nil {
		return fmt.Errorf("kvd read: %w", err)
	}
	if err := cl.dec.Decode(cl.buf, &cl.msg); err != nil {
		return err
	}
	if cl.msg.Op == OpError {
		return fmt.Errorf("%w: %s: %s", ErrServer, cl.msg.Code, cl.msg.ErrMessage)
	}
	for _, w := range want {
		if cl.msg.Op == w {
			return nil
		}
	}
	return fmt.Errorf("%w: %s", ErrProtocol, cl.msg.Op)
}

func (cl *Client) ns(ns Namespace) {
	cl.enc.Str("model", ns.Model)
	cl.enc.Str("compat_key", ns.CompatKey)
}

// Get appends key's value to dst[:0]. Over the arena the bytes are copied
// straight from the shared slot, checked with its seqlock; a slot rewritten
// meanwhile reads as a miss.
func (cl *Client) Get(ns Namespace, key, dst []byte) (val []byte, ret Retention, ok bool, err error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
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
	cl.mu.Lock()
	defer cl.mu.Unlock()
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
	cl.mu.Lock()
	defer cl.mu.Unlock()
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
	return cl.msg.Accepted, string(cl.msg.Reason), nil
}

func retOr(r string) string {
	if r == "" {
		return "short"
	}
	return r
}

// SetZeroCopy writes value through a lease: reserve, copy into the
// arena, commit. It falls back to nothing: a refused lease is reported.
func (cl *Client) SetZeroCopy(ns Namespace, key, value []byte, o SetOptions) (bool, string, error) {
	l, err := cl.Reserve(len(value))
	if err != nil || l.Token == 0 {
		return false, l.Reason, err
	}
	copy(cl.mem[l.PayloadOffset:], value)
	return cl.Commit(l.Token, ns, key, len(value), o)
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
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.mem == nil {
		return Lease{}, ErrNoArena
	}
	cl.enc.Begin(OpSetReserve, 1)
	cl.enc.Int("size", int64(size))
	if err := cl.roundTrip(OpSetReserveResponse); err != nil {
		return Lease{}, err
	}
	m := &cl.msg
	l := Lease{Token: uint64(m.LeaseToken), SlotID: m.SlotID, PayloadOffset: int(m.PayloadOffset), PayloadMaxSize: int(m.PayloadMaxSize), Reason: string(m.Reason)}
	if l.Token != 0 && (l.PayloadOffset < HeaderBytes || l.PayloadOffset+l.PayloadMaxSize > len(cl.mem)) {
		return l, fmt.Errorf("%w: lease outside the arena", ErrProtocol)
	}
	return l, nil
}

// Arena is the mapped arena (nil without one), for writing leased slots.
func (cl *Client) Arena() []byte { return cl.mem }

// Commit names a leased slot's bytes.
func (cl *Client) Commit(token uint64, ns Namespace, key []byte, length int, o SetOptions) (bool, string, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.enc.Begin(OpSetCommit, 7)
	cl.enc.Int("lease_token", int64(token))
	cl.enc.Bin("key", key)
	cl.enc.Int("length", int64(length))
	cl.ns(ns)
	cl.enc.Str("retention", retOr(o.Retention))
	cl.enc.Int("ttl_seconds", int64(o.TTL/time.Second))
	if err := cl.roundTrip(OpSetCommitResponse); err != nil {
		return false, "", err
	}
	return cl.msg.Accepted, string(cl.msg.Reason), nil
}

// Cancel drops a lease.
func (cl *Client) Cancel(token uint64) error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.enc.Begin(OpSetCancel, 1)
	cl.enc.Int("lease_token", int64(token))
	return cl.roundTrip(OpSetCancelResponse)
}

// Exists appends each key's presence (RAM or L3) to dst[:0].
func (cl *Client) Exists(ns Namespace, keys [][]byte, dst []bool) ([]bool, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
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
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.keysOp(OpPrefetchHint, ns, keys, 1)
	cl.enc.Int("deadline_ms", deadline.Milliseconds())
	_, err := cl.c.Write(cl.enc.Frame())
	return err
}

// BatchGet returns one value per key (nil: miss), copied.
func (cl *Client) BatchGet(ns Namespace, keys [][]byte) ([][]byte, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.keysOp(OpBatchGet, ns, keys, 0)
	if err := cl.roundTrip(OpBatchGetResponse, OpBatchGetSharedResponse); err != nil {
		return nil, err
	}
	m := &cl.msg
	out := make([][]byte, len(keys))
	if m.Op == OpBatchGetResponse {
		if len(m.Values) != len(keys) {
			return nil, fmt.Errorf("%w: %d values for %d keys", ErrProtocol, len(m.Values), len(keys))
		}
		for i, v := range m.Values {
			if v != nil {
				out[i] = append([]byte{}, v...)
			}
		}
		return out, nil
	}
	if len(m.Offsets) != len(keys) || len(m.Lengths) != len(keys) || len(m.Versions) != len(keys) || cl.mem == nil {
		return nil, fmt.Errorf("%w: batch_get_shared_response arity", ErrProtocol)
	}
	for i := range keys {
		if m.Offsets[i] < 0 || m.Lengths[i] == 0 {
			continue
		}
		v, err := ReadSlot(cl.mem, int(m.Offsets[i]), int(m.Lengths[i]), uint32(m.Versions[i]), nil)
		if errors.Is(err, ErrTornRead) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// BatchSet stores values inline; it returns per-item acceptance.
func (cl *Client) BatchSet(ns Namespace, keys, values [][]byte, o SetOptions) ([]bool, []string, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
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
		reasons[i] = string(r)
	}
	return append([]bool(nil), m.AcceptedList...), reasons, nil
}

// Clear drops a namespace (both empty: everything, L3 included).
func (cl *Client) Clear(ns Namespace) (int64, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.enc.Begin(OpClear, 2)
	cl.ns(ns)
	if err := cl.roundTrip(OpClearAck); err != nil {
		return 0, err
	}
	return cl.msg.ClearedEntries, nil
}

// Stats returns stats_response.
func (cl *Client) Stats() (StatsCounters, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.enc.Begin(OpStats, 0)
	if err := cl.roundTrip(OpStatsResponse); err != nil {
		return StatsCounters{}, err
	}
	return cl.msg.Stats, nil
}
