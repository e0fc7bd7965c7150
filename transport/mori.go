//go:build mori && cgo

package transport

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "mori_c.h"

typedef struct {
	void *h;
	__typeof__(infera_mori_create) *create;
	__typeof__(infera_mori_destroy) *destroy;
	__typeof__(infera_mori_add_peer) *add_peer;
	__typeof__(infera_mori_register) *reg;
	__typeof__(infera_mori_deregister) *dereg;
	__typeof__(infera_mori_submit) *submit;
	__typeof__(infera_mori_poll) *poll;
	__typeof__(infera_mori_release) *release;
} mori_lib;

static mori_lib *mori_load(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		snprintf(err, errlen, "%s", dlerror());
		return NULL;
	}
	mori_lib *l = calloc(1, sizeof *l);
	l->h = h;
#define MORI_SYM(field, name)                                       \
	if ((l->field = dlsym(h, name)) == NULL) {                  \
		snprintf(err, errlen, "%s: no symbol %s", path, name); \
		free(l);                                            \
		dlclose(h);                                         \
		return NULL;                                        \
	}
	MORI_SYM(create, "infera_mori_create")
	MORI_SYM(destroy, "infera_mori_destroy")
	MORI_SYM(add_peer, "infera_mori_add_peer")
	MORI_SYM(reg, "infera_mori_register")
	MORI_SYM(dereg, "infera_mori_deregister")
	MORI_SYM(submit, "infera_mori_submit")
	MORI_SYM(poll, "infera_mori_poll")
	MORI_SYM(release, "infera_mori_release")
#undef MORI_SYM
	return l;
}

static int mori_create(mori_lib *l, const char *key, const char *host, uint16_t port, infera_mori_engine **out) {
	return l->create(key, host, port, out);
}
static void mori_destroy(mori_lib *l, infera_mori_engine *e) { l->destroy(e); }
static int mori_add_peer(mori_lib *l, infera_mori_engine *e, const char *key, const char *host, uint16_t port) {
	return l->add_peer(e, key, host, port);
}
static int mori_register(mori_lib *l, infera_mori_engine *e, void *addr, uint64_t size, uint32_t *id) {
	return l->reg(e, addr, size, -1, id);
}
static int mori_deregister(mori_lib *l, infera_mori_engine *e, uint32_t id) { return l->dereg(e, id); }
static int mori_submit(mori_lib *l, infera_mori_engine *e, int is_read, uint32_t local_id, const infera_mori_mem *remote,
                       const uint64_t *lo, const uint64_t *ro, const uint64_t *sz, size_t n, uint64_t *xfer) {
	return l->submit(e, is_read, local_id, remote, lo, ro, sz, n, xfer);
}
static int mori_poll(mori_lib *l, infera_mori_engine *e, uint64_t xfer, char *msg, size_t n) { return l->poll(e, xfer, msg, n); }
static void mori_release(mori_lib *l, infera_mori_engine *e, uint64_t xfer) { l->release(e, xfer); }
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"unsafe"
)

// MoriConfig configures a MoRI-IO engine.
type MoriConfig struct {
	// Library is the wrapper library (default "libinfera_mori.so").
	Library string
	// Key is this engine's key, the Desc.Peer of its regions (required).
	Key string
	// Host and Port are where peers reach this engine out of band.
	Host string
	Port uint16
}

// Mori is an Engine backed by MoRI-IO through Infera's extern "C" wrapper
// (mori_c.h).
type Mori struct {
	lib *C.mori_lib
	eng *C.infera_mori_engine
	key string

	mu      sync.Mutex
	closed  bool
	regions map[string]*Region
	peers   map[string]*C.char // engine key → C copy, kept for submissions
	batches freeList[moriBatch]
}

var _ Engine = (*Mori)(nil)

var (
	moriLibsMu sync.Mutex
	moriLibs   = map[string]*C.mori_lib{}
)

func loadMori(path string) (*C.mori_lib, error) {
	moriLibsMu.Lock()
	defer moriLibsMu.Unlock()
	if l := moriLibs[path]; l != nil {
		return l, nil
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	l := C.mori_load(cpath, &msg[0], C.size_t(len(msg)))
	if l == nil {
		return nil, fmt.Errorf("load mori: %s: %w", C.GoString(&msg[0]), ErrUnavailable)
	}
	moriLibs[path] = l
	return l, nil
}

// moriErr maps a wrapper return code to a sentinel.
func moriErr(rc C.int) error {
	switch rc {
	case C.INFERA_MORI_ERR_INVALID:
		return ErrInvalid
	case C.INFERA_MORI_ERR_NOT_FOUND:
		return ErrNotFound
	case C.INFERA_MORI_ERR_UNAVAILABLE:
		return ErrUnavailable
	case C.INFERA_MORI_ERR_EXISTS:
		return ErrExists
	case C.INFERA_MORI_ERR_RANGE:
		return ErrOutOfRange
	}
	return ErrTransfer
}

// NewMori loads the wrapper and creates an engine.
func NewMori(cfg MoriConfig) (*Mori, error) {
	if cfg.Key == "" {
		return nil, fmt.Errorf("mori: key: %w", ErrInvalid)
	}
	if cfg.Library == "" {
		cfg.Library = "libinfera_mori.so"
	}
	lib, err := loadMori(cfg.Library)
	if err != nil {
		return nil, err
	}
	key, host := C.CString(cfg.Key), C.CString(cfg.Host)
	defer C.free(unsafe.Pointer(key))
	defer C.free(unsafe.Pointer(host))
	var eng *C.infera_mori_engine
	if rc := C.mori_create(lib, key, host, C.uint16_t(cfg.Port), &eng); rc != 0 {
		return nil, fmt.Errorf("mori: create engine %q: code %d: %w", cfg.Key, int(rc), moriErr(rc))
	}
	m := &Mori{lib: lib, eng: eng, key: cfg.Key, regions: map[string]*Region{}, peers: map[string]*C.char{}}
	return m, nil
}

// AddPeer makes the engine key, reachable at host:port, addressable.
func (m *Mori) AddPeer(key, host string, port uint16) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("mori add peer %q: %w", key, ErrClosed)
	}
	ckey, chost := C.CString(key), C.CString(host)
	defer C.free(unsafe.Pointer(chost))
	if rc := C.mori_add_peer(m.lib, m.eng, ckey, chost, C.uint16_t(port)); rc != 0 {
		C.free(unsafe.Pointer(ckey))
		return fmt.Errorf("mori add peer %q: code %d: %w", key, int(rc), moriErr(rc))
	}
	if old := m.peers[key]; old != nil {
		C.free(unsafe.Pointer(old))
	}
	m.peers[key] = ckey
	return nil
}

// Register registers host memory buf (not Go heap memory: see Engine).
func (m *Mori) Register(name string, buf []byte) (*Region, error) {
	if err := checkName(name); err != nil || len(buf) == 0 {
		return nil, fmt.Errorf("mori register %q: %w", name, ErrInvalid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("mori register %q: %w", name, ErrClosed)
	}
	if _, ok := m.regions[name]; ok {
		return nil, fmt.Errorf("mori register %q: %w", name, ErrExists)
	}
	p := unsafe.Pointer(&buf[0])
	var id C.uint32_t
	if rc := C.mori_register(m.lib, m.eng, p, C.uint64_t(len(buf)), &id); rc != 0 {
		return nil, fmt.Errorf("mori register %q: code %d: %w", name, int(rc), moriErr(rc))
	}
	r := &Region{name: name, buf: buf, owner: m,
		desc: Desc{Peer: m.key, Name: name, Addr: uint64(uintptr(p)), Len: uint64(len(buf)), ID: uint32(id), Device: -1}}
	m.regions[name] = r
	return r, nil
}

// Deregister withdraws r once no transfer uses it.
func (m *Mori) Deregister(r *Region) error {
	if r == nil || r.owner != any(m) {
		return fmt.Errorf("mori deregister: %w", ErrNotRegistered)
	}
	m.mu.Lock()
	if m.regions[r.name] == r {
		delete(m.regions, r.name)
	}
	m.mu.Unlock()
	if !r.kill() {
		return fmt.Errorf("mori deregister %q: %w", r.name, ErrNotRegistered)
	}
	return m.deregister(r)
}

func (m *Mori) deregister(r *Region) error {
	if rc := C.mori_deregister(m.lib, m.eng, C.uint32_t(r.desc.ID)); rc != 0 {
		return fmt.Errorf("mori deregister %q: code %d: %w", r.name, int(rc), moriErr(rc))
	}
	return nil
}

// Close deregisters every region and destroys the engine. Batches must be
// released first.
func (m *Mori) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	regions, peers := m.regions, m.peers
	m.regions, m.peers = nil, nil
	m.mu.Unlock()
	var first error
	for _, r := range regions {
		if r.kill() {
			if err := m.deregister(r); err != nil && first == nil {
				first = err
			}
		}
	}
	C.mori_destroy(m.lib, m.eng)
	for _, b := range m.batches.drain() {
		b.free()
	}
	for _, k := range peers {
		C.free(unsafe.Pointer(k))
	}
	return first
}

// recycle keeps b for reuse or frees its C memory.
func (m *Mori) recycle(b *moriBatch) {
	if !m.batches.put(b) {
		b.free()
	}
}

func (b *moriBatch) free() {
	C.free(unsafe.Pointer(b.offs))
	b.offs, b.cap = nil, 0
}

// moriBatch is one Submit: a wrapper transfer per run of consecutive ops
// sharing kind, local region and remote region.
type moriBatch struct {
	m      *Mori
	xfers  []C.uint64_t
	next   int
	done   bool
	err    error
	held   regionSet
	offs   *C.uint64_t // 3×cap: local offsets, remote offsets, sizes
	cap    int
	remote C.infera_mori_mem
	msg    [256]C.char
}

func sameRun(a, b *Op) bool {
	return a.Kind == b.Kind && a.Local == b.Local && a.Remote.Peer == b.Remote.Peer && a.Remote.ID == b.Remote.ID
}

// Submit starts ops; consecutive ops between the same pair of regions go
// as one wrapper batch.
func (m *Mori) Submit(ctx context.Context, ops []Op) (Batch, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mori submit: %w: %w", ErrTimeout, err)
	}
	for i := range ops {
		if err := checkOp(m, &ops[i]); err != nil {
			return nil, fmt.Errorf("mori submit op %d: %w", i, err)
		}
	}
	b := m.batches.get()
	if b == nil {
		b = &moriBatch{m: m}
	}
	b.xfers, b.next, b.done, b.err = b.xfers[:0], 0, false, nil
	if b.cap < len(ops) {
		C.free(unsafe.Pointer(b.offs))
		b.offs = (*C.uint64_t)(C.calloc(C.size_t(3*len(ops)), C.sizeof_uint64_t))
		b.cap = len(ops)
	}
	if err := b.held.acquire(ops); err != nil {
		m.recycle(b)
		return nil, fmt.Errorf("mori submit: %w", err)
	}
	all := unsafe.Slice(b.offs, 3*b.cap)
	lo, ro, sz := all[:b.cap], all[b.cap:2*b.cap], all[2*b.cap:]
	for i := 0; i < len(ops); {
		j := i + 1
		for j < len(ops) && sameRun(&ops[i], &ops[j]) {
			j++
		}
		for k := i; k < j; k++ {
			lo[k-i], ro[k-i], sz[k-i] = C.uint64_t(ops[k].LocalOff), C.uint64_t(ops[k].RemoteOff), C.uint64_t(ops[k].Len)
		}
		if err := b.start(&ops[i], lo, ro, sz, j-i); err != nil {
			b.abort()
			return nil, err
		}
		i = j
	}
	return b, nil
}

// start submits one run of n ops shaped like op.
func (b *moriBatch) start(op *Op, lo, ro, sz []C.uint64_t, n int) error {
	m := b.m
	m.mu.Lock()
	key := m.peers[op.Remote.Peer]
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return fmt.Errorf("mori submit: %w", ErrClosed)
	}
	if key == nil {
		return fmt.Errorf("mori submit: peer %q not added: %w", op.Remote.Peer, ErrNotFound)
	}
	b.remote = C.infera_mori_mem{engine_key: key, id: C.uint32_t(op.Remote.ID), device: C.int32_t(op.Remote.Device),
		addr: C.uint64_t(op.Remote.Addr), size: C.uint64_t(op.Remote.Len)}
	isRead := C.int(0)
	if op.Kind == Read {
		isRead = 1
	}
	b.xfers = append(b.xfers, 0)
	x := &b.xfers[len(b.xfers)-1]
	rc := C.mori_submit(m.lib, m.eng, isRead, C.uint32_t(op.Local.desc.ID), &b.remote, &lo[0], &ro[0], &sz[0], C.size_t(n), x)
	if rc != 0 {
		b.xfers = b.xfers[:len(b.xfers)-1]
		return fmt.Errorf("mori submit %s of %s/%s: code %d: %w", op.Kind, op.Remote.Peer, op.Remote.Name, int(rc), moriErr(rc))
	}
	return nil
}

// abort drops a batch whose submission failed part way: it waits for the
// runs already started, then releases everything.
func (b *moriBatch) abort() {
	_ = Wait(context.Background(), b)
	b.Release()
}

// Poll polls every run not yet finished.
func (b *moriBatch) Poll() (bool, error) {
	if b.done {
		return true, b.err
	}
	m := b.m
	for b.next < len(b.xfers) {
		rc := C.mori_poll(m.lib, m.eng, b.xfers[b.next], &b.msg[0], C.size_t(len(b.msg)))
		if rc == C.INFERA_MORI_IN_PROGRESS {
			return false, nil
		}
		if rc != 0 && b.err == nil {
			b.err = fmt.Errorf("mori transfer: %s: %w", C.GoString(&b.msg[0]), moriErr(rc))
		}
		b.next++
	}
	b.done = true
	b.held.release()
	return true, b.err
}

// Release waits for the batch if needed, then frees it.
func (b *moriBatch) Release() {
	if !b.done {
		_ = Wait(context.Background(), b)
	}
	for _, x := range b.xfers {
		C.mori_release(b.m.lib, b.m.eng, x)
	}
	b.xfers, b.err = b.xfers[:0], nil
	b.m.recycle(b)
}
