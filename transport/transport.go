package transport

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
)

// Sentinel errors. Every error an Engine returns wraps exactly one of them,
// so callers branch with errors.Is whatever the implementation.
var (
	// ErrClosed: the engine (or its connection to a peer) is closed.
	ErrClosed = errors.New("transport: closed")
	// ErrInvalid: a malformed call (nil region, empty name, zero length).
	ErrInvalid = errors.New("transport: invalid argument")
	// ErrExists: a region name or address range is already registered.
	ErrExists = errors.New("transport: already registered")
	// ErrNotRegistered: a local region is not (or no longer) registered.
	ErrNotRegistered = errors.New("transport: region not registered")
	// ErrNotFound: the peer has no region of that name or address.
	ErrNotFound = errors.New("transport: remote region not found")
	// ErrOutOfRange: offset+length falls outside a region.
	ErrOutOfRange = errors.New("transport: out of range")
	// ErrProtocol: a peer sent a malformed frame.
	ErrProtocol = errors.New("transport: protocol error")
	// ErrUnavailable: the peer or the device cannot be reached.
	ErrUnavailable = errors.New("transport: peer unavailable")
	// ErrTimeout: a transfer did not complete in time.
	ErrTimeout = errors.New("transport: timeout")
	// ErrTransfer: a transfer failed in the backend.
	ErrTransfer = errors.New("transport: transfer failed")
)

// Kind is the direction of one Op.
type Kind uint8

const (
	// Read copies remote bytes into the local region.
	Read Kind = 1
	// Write copies local bytes into the remote region.
	Write Kind = 2
)

// String names the kind for logs.
func (k Kind) String() string {
	switch k {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return "invalid"
}

// Desc names a region on a peer: everything an engine needs to address it,
// exchanged out of band (the prefill side publishes its regions' Descs, the
// decode side reads them). Which fields matter depends on the engine: TCP
// uses Peer and Name; Mooncake uses Peer (segment name) and Addr; MoRI uses
// Peer (engine key), ID, Addr and Device. Len bounds every access.
type Desc struct {
	Peer   string // TCP host:port, Mooncake segment name, MoRI engine key
	Name   string // the region's registered name
	Addr   uint64 // base address on the peer (RDMA engines)
	Len    uint64 // region size in bytes
	ID     uint32 // engine-assigned region id (MoRI)
	Device int32  // GPU ordinal, -1 for host memory
}

// Region is memory registered with one Engine.
type Region struct {
	name  string
	buf   []byte
	desc  Desc
	owner any // the Engine that registered it

	// mu is held shared by every op touching buf and exclusively by
	// Deregister, which sets dead: a region is never withdrawn under a
	// transfer. No goroutine holds it shared twice.
	mu   sync.RWMutex
	dead bool
}

// Name is the name the region was registered under.
func (r *Region) Name() string { return r.name }

// Bytes is the registered memory. The owner may read and write it only when
// no transfer touching it is in flight.
func (r *Region) Bytes() []byte { return r.buf }

// Len is the region size in bytes.
func (r *Region) Len() int { return len(r.buf) }

// Desc is what a peer needs to address this region.
func (r *Region) Desc() Desc { return r.desc }

// Op is one transfer between a local region and a remote one.
type Op struct {
	Kind      Kind
	Local     *Region
	LocalOff  uint64
	Remote    Desc
	RemoteOff uint64
	Len       uint64
}

// Engine registers local memory and moves bytes between it and the
// registered memory of peers.
type Engine interface {
	// Register makes buf addressable by peers under name. cgo engines
	// hand buf to C, which keeps it: it must not be Go heap memory (use
	// AllocHost, or device memory).
	Register(name string, buf []byte) (*Region, error)
	// Deregister withdraws a region; it waits for transfers using it.
	Deregister(r *Region) error
	// Submit starts ops as one batch. The returned Batch must be
	// Released once done. ops is not retained.
	Submit(ctx context.Context, ops []Op) (Batch, error)
	// Close deregisters everything and releases the engine.
	Close() error
}

// Ordered is implemented by an engine that runs the ops of one batch in
// the order given, each op's remote access complete before the next op's
// begins (InOrder true). A caller that needs one read after another (a
// seqlock's second look at a header) may then put both in one batch;
// with any other engine it submits the second once the first completed.
type Ordered interface {
	InOrder() bool
}

// Batch is a submitted set of ops.
type Batch interface {
	// Poll reports whether every op has completed and, once done, the
	// first failure (nil when all succeeded).
	Poll() (done bool, err error)
	// Release frees the batch; it must not be used afterwards.
	Release()
}

// Wait polls b until it completes or ctx ends, backing off from a spin to
// sleeps of at most 1 ms.
func Wait(ctx context.Context, b Batch) error {
	for i := 0; ; i++ {
		done, err := b.Poll()
		if done {
			return err
		}
		if err := ctx.Err(); err != nil {
			return errors.Join(ErrTimeout, err)
		}
		switch {
		case i < 64:
			runtime.Gosched()
		default:
			d := time.Duration(i-63) * 10 * time.Microsecond
			if d > time.Millisecond {
				d = time.Millisecond
			}
			time.Sleep(d)
		}
	}
}

// Transfer submits ops, waits for them and releases the batch.
func Transfer(ctx context.Context, e Engine, ops []Op) error {
	b, err := e.Submit(ctx, ops)
	if err != nil {
		return err
	}
	err = Wait(ctx, b)
	b.Release()
	return err
}

// acquire takes r shared for one op; false when r is deregistered.
func (r *Region) acquire() bool {
	r.mu.RLock()
	if r.dead {
		r.mu.RUnlock()
		return false
	}
	return true
}

func (r *Region) release() { r.mu.RUnlock() }

// kill marks r deregistered once no op holds it; false if it already was.
func (r *Region) kill() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dead {
		return false
	}
	r.dead = true
	return true
}

// checkName validates a region name: 1..MaxNameLen bytes of printable
// ASCII without '|' (so every Desc has a text form).
func checkName(name string) error {
	if !checkText(name, MaxNameLen) {
		return ErrInvalid
	}
	return nil
}

// checkOp validates what every engine requires of an op before it touches
// memory: a known kind, a live local region, a non-zero length, both
// ranges inside their regions (without overflow).
func checkOp(owner any, op *Op) error {
	if op.Kind != Read && op.Kind != Write {
		return ErrInvalid
	}
	if op.Local == nil || op.Len == 0 || op.Len > MaxOpLen || op.Remote.Peer == "" {
		return ErrInvalid
	}
	if op.Local.owner != owner {
		return ErrNotRegistered
	}
	if !inRange(op.LocalOff, op.Len, uint64(len(op.Local.buf))) {
		return ErrOutOfRange
	}
	if op.Remote.Len != 0 && !inRange(op.RemoteOff, op.Len, op.Remote.Len) {
		return ErrOutOfRange
	}
	return nil
}

// inRange reports whether [off, off+n) lies inside [0, size).
func inRange(off, n, size uint64) bool {
	return n <= size && off <= size-n
}

// freeList recycles batches. Unlike sync.Pool it never drops entries on
// its own (the race detector makes sync.Pool drop a quarter of them), so a
// steady state allocates nothing in every build.
type freeList[T any] struct {
	mu    sync.Mutex
	items []*T
}

// maxFree bounds the batches kept per engine.
const maxFree = 256

func (f *freeList[T]) get() *T {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.items); n > 0 {
		x := f.items[n-1]
		f.items[n-1] = nil
		f.items = f.items[:n-1]
		return x
	}
	return nil
}

// put keeps x for reuse; false when the list is full (x is dropped, and
// whatever C memory it owns must be freed by the caller).
func (f *freeList[T]) put(x *T) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.items) >= maxFree {
		return false
	}
	f.items = append(f.items, x)
	return true
}
