//go:build mooncake && cgo

package transport

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "mooncake_c.h"

// mc_lib holds the library's entry points, resolved with dlsym.
typedef struct {
	void *h;
	__typeof__(createTransferEngine) *create;
	__typeof__(destroyTransferEngine) *destroy;
	__typeof__(installTransport) *install;
	__typeof__(registerLocalMemory) *reg;
	__typeof__(unregisterLocalMemory) *unreg;
	__typeof__(openSegment) *open_seg;
	__typeof__(closeSegment) *close_seg;
	__typeof__(allocateBatchID) *alloc_batch;
	__typeof__(submitTransfer) *submit;
	__typeof__(getTransferStatus) *status;
	__typeof__(freeBatchID) *free_batch;
} mc_lib;

static mc_lib *mc_load(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		snprintf(err, errlen, "%s", dlerror());
		return NULL;
	}
	mc_lib *l = calloc(1, sizeof *l);
	l->h = h;
#define MC_SYM(field, name)                                         \
	if ((l->field = dlsym(h, name)) == NULL) {                  \
		snprintf(err, errlen, "%s: no symbol %s", path, name); \
		free(l);                                            \
		dlclose(h);                                         \
		return NULL;                                        \
	}
	MC_SYM(create, "createTransferEngine")
	MC_SYM(destroy, "destroyTransferEngine")
	MC_SYM(install, "installTransport")
	MC_SYM(reg, "registerLocalMemory")
	MC_SYM(unreg, "unregisterLocalMemory")
	MC_SYM(open_seg, "openSegment")
	MC_SYM(close_seg, "closeSegment")
	MC_SYM(alloc_batch, "allocateBatchID")
	MC_SYM(submit, "submitTransfer")
	MC_SYM(status, "getTransferStatus")
	MC_SYM(free_batch, "freeBatchID")
#undef MC_SYM
	return l;
}

static mc_engine_t mc_create(mc_lib *l, const char *meta, const char *name, const char *ip, uint64_t port, int auto_discover) {
	return l->create(meta, name, ip, port, auto_discover);
}
static void mc_destroy(mc_lib *l, mc_engine_t e) { l->destroy(e); }
static int mc_install(mc_lib *l, mc_engine_t e, const char *proto) { return l->install(e, proto, NULL) == NULL ? -1 : 0; }
static int mc_register(mc_lib *l, mc_engine_t e, void *addr, size_t n, const char *loc) { return l->reg(e, addr, n, loc, 1); }
static int mc_unregister(mc_lib *l, mc_engine_t e, void *addr) { return l->unreg(e, addr); }
static mc_segment_t mc_open(mc_lib *l, mc_engine_t e, const char *name) { return l->open_seg(e, name); }
static int mc_close(mc_lib *l, mc_engine_t e, mc_segment_t s) { return l->close_seg(e, s); }
static mc_batch_t mc_alloc_batch(mc_lib *l, mc_engine_t e, size_t n) { return l->alloc_batch(e, n); }
static int mc_submit(mc_lib *l, mc_engine_t e, mc_batch_t b, mc_request_t *r, size_t n) { return l->submit(e, b, r, n); }
static int mc_status(mc_lib *l, mc_engine_t e, mc_batch_t b, size_t task, mc_status_t *st) { return l->status(e, b, task, st); }
static int mc_free_batch(mc_lib *l, mc_engine_t e, mc_batch_t b) { return l->free_batch(e, b); }
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"unsafe"
)

// MooncakeConfig configures a Mooncake Transfer Engine.
type MooncakeConfig struct {
	// Library is the shared library to load (default
	// "libtransfer_engine.so", found through the dynamic loader's path).
	Library string
	// Metadata is the metadata_conn_string: "P2PHANDSHAKE" (default), an
	// etcd:// or http:// metadata server.
	Metadata string
	// LocalName is this engine's segment name, the Desc.Peer of its
	// regions (required; Mooncake uses host:port).
	LocalName string
	// Host and RPCPort are where peers reach this engine's RPC service.
	Host    string
	RPCPort uint64
	// AutoDiscover lets the engine pick transports and NICs itself.
	AutoDiscover bool
	// Protocol, when set ("rdma", "tcp"), installs that transport.
	Protocol string
	// Location tags registered memory for NIC affinity (default "cpu:0").
	Location string
}

// Mooncake is an Engine backed by Mooncake Transfer Engine's C API.
type Mooncake struct {
	lib  *C.mc_lib
	eng  C.mc_engine_t
	name string
	loc  *C.char

	mu      sync.Mutex
	closed  bool
	regions map[string]*Region
	segs    map[string]C.mc_segment_t
	batches freeList[mcBatch]
}

var _ Engine = (*Mooncake)(nil)

var (
	mcLibsMu sync.Mutex
	mcLibs   = map[string]*C.mc_lib{}
)

// loadMooncake dlopens path once per process.
func loadMooncake(path string) (*C.mc_lib, error) {
	mcLibsMu.Lock()
	defer mcLibsMu.Unlock()
	if l := mcLibs[path]; l != nil {
		return l, nil
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	l := C.mc_load(cpath, &msg[0], C.size_t(len(msg)))
	if l == nil {
		return nil, fmt.Errorf("load mooncake: %s: %w", C.GoString(&msg[0]), ErrUnavailable)
	}
	mcLibs[path] = l
	return l, nil
}

// NewMooncake loads the library and creates a transfer engine.
func NewMooncake(cfg MooncakeConfig) (*Mooncake, error) {
	if cfg.LocalName == "" {
		return nil, fmt.Errorf("mooncake: local name: %w", ErrInvalid)
	}
	if cfg.Library == "" {
		cfg.Library = "libtransfer_engine.so"
	}
	if cfg.Metadata == "" {
		cfg.Metadata = "P2PHANDSHAKE"
	}
	if cfg.Location == "" {
		cfg.Location = "cpu:0"
	}
	lib, err := loadMooncake(cfg.Library)
	if err != nil {
		return nil, err
	}
	meta, name, host := C.CString(cfg.Metadata), C.CString(cfg.LocalName), C.CString(cfg.Host)
	defer C.free(unsafe.Pointer(meta))
	defer C.free(unsafe.Pointer(name))
	defer C.free(unsafe.Pointer(host))
	auto := C.int(0)
	if cfg.AutoDiscover {
		auto = 1
	}
	eng := C.mc_create(lib, meta, name, host, C.uint64_t(cfg.RPCPort), auto)
	if eng == nil {
		return nil, fmt.Errorf("mooncake: create engine %q: %w", cfg.LocalName, ErrUnavailable)
	}
	if cfg.Protocol != "" {
		proto := C.CString(cfg.Protocol)
		rc := C.mc_install(lib, eng, proto)
		C.free(unsafe.Pointer(proto))
		if rc != 0 {
			C.mc_destroy(lib, eng)
			return nil, fmt.Errorf("mooncake: install transport %q: %w", cfg.Protocol, ErrUnavailable)
		}
	}
	m := &Mooncake{lib: lib, eng: eng, name: cfg.LocalName, loc: C.CString(cfg.Location),
		regions: map[string]*Region{}, segs: map[string]C.mc_segment_t{}}
	return m, nil
}

// mcErr maps a Mooncake return code to a sentinel.
func mcErr(rc C.int) error {
	switch rc {
	case C.MC_ERR_INVALID_ARGUMENT:
		return ErrInvalid
	case C.MC_ERR_ADDRESS_NOT_REGISTERED:
		return ErrNotRegistered
	case C.MC_ERR_ADDRESS_OVERLAPPED:
		return ErrExists
	case C.MC_ERR_DEVICE_NOT_FOUND:
		return ErrUnavailable
	}
	switch {
	case rc <= -100 && rc > -300: // DNS, socket, handshake, metadata, endpoint
		return ErrUnavailable
	default: // too many requests, batch busy, NUMA, memory, unknown
		return ErrTransfer
	}
}

// Register registers buf (not Go heap memory: see Engine) as remotely
// accessible.
func (m *Mooncake) Register(name string, buf []byte) (*Region, error) {
	if err := checkName(name); err != nil || len(buf) == 0 {
		return nil, fmt.Errorf("mooncake register %q: %w", name, ErrInvalid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("mooncake register %q: %w", name, ErrClosed)
	}
	if _, ok := m.regions[name]; ok {
		return nil, fmt.Errorf("mooncake register %q: %w", name, ErrExists)
	}
	p := unsafe.Pointer(&buf[0])
	if rc := C.mc_register(m.lib, m.eng, p, C.size_t(len(buf)), m.loc); rc != 0 {
		return nil, fmt.Errorf("mooncake register %q: code %d: %w", name, int(rc), mcErr(rc))
	}
	r := &Region{name: name, buf: buf, owner: m,
		desc: Desc{Peer: m.name, Name: name, Addr: uint64(uintptr(p)), Len: uint64(len(buf)), Device: -1}}
	m.regions[name] = r
	return r, nil
}

// Deregister unregisters r once no transfer uses it.
func (m *Mooncake) Deregister(r *Region) error {
	if r == nil || r.owner != any(m) {
		return fmt.Errorf("mooncake deregister: %w", ErrNotRegistered)
	}
	m.mu.Lock()
	if m.regions[r.name] == r {
		delete(m.regions, r.name)
	}
	m.mu.Unlock()
	if !r.kill() {
		return fmt.Errorf("mooncake deregister %q: %w", r.name, ErrNotRegistered)
	}
	return m.unregister(r)
}

func (m *Mooncake) unregister(r *Region) error {
	if rc := C.mc_unregister(m.lib, m.eng, unsafe.Pointer(&r.buf[0])); rc != 0 {
		return fmt.Errorf("mooncake deregister %q: code %d: %w", r.name, int(rc), mcErr(rc))
	}
	return nil
}

// Close unregisters every region, closes the segments and destroys the
// engine. Batches must be released first.
func (m *Mooncake) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	regions, segs := m.regions, m.segs
	m.regions, m.segs = nil, nil
	m.mu.Unlock()
	var first error
	for _, r := range regions {
		if r.kill() {
			if err := m.unregister(r); err != nil && first == nil {
				first = err
			}
		}
	}
	for _, s := range segs {
		C.mc_close(m.lib, m.eng, s)
	}
	C.mc_destroy(m.lib, m.eng)
	C.free(unsafe.Pointer(m.loc))
	for _, b := range m.batches.drain() {
		b.free()
	}
	return first
}

// segment opens (once) the segment named peer.
func (m *Mooncake) segment(peer string) (C.mc_segment_t, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrClosed
	}
	if s, ok := m.segs[peer]; ok {
		return s, nil
	}
	cpeer := C.CString(peer)
	s := C.mc_open(m.lib, m.eng, cpeer)
	C.free(unsafe.Pointer(cpeer))
	if s < 0 {
		return 0, fmt.Errorf("mooncake open segment %q: %w", peer, ErrNotFound)
	}
	m.segs[peer] = s
	return s, nil
}

// recycle keeps b for reuse or frees its C memory.
func (m *Mooncake) recycle(b *mcBatch) {
	if !m.batches.put(b) {
		b.free()
	}
}

func (b *mcBatch) free() {
	C.free(unsafe.Pointer(b.reqs))
	b.reqs, b.cap = nil, 0
}

// mcBatch is one Mooncake batch; its request array lives in C memory and
// is reused through the pool.
type mcBatch struct {
	m    *Mooncake
	reqs *C.mc_request_t
	cap  int
	id   C.mc_batch_t
	n    int
	next int // first task not known to be finished
	done bool
	err  error
	st   C.mc_status_t
	held regionSet
}

// Submit hands ops to the engine as one batch.
func (m *Mooncake) Submit(ctx context.Context, ops []Op) (Batch, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mooncake submit: %w: %w", ErrTimeout, err)
	}
	for i := range ops {
		if err := checkOp(m, &ops[i]); err != nil {
			return nil, fmt.Errorf("mooncake submit op %d: %w", i, err)
		}
		if ops[i].Remote.Addr == 0 {
			return nil, fmt.Errorf("mooncake submit op %d: remote address: %w", i, ErrInvalid)
		}
	}
	b := m.batches.get()
	if b == nil {
		b = &mcBatch{m: m}
	}
	if b.cap < len(ops) {
		C.free(unsafe.Pointer(b.reqs))
		b.reqs = (*C.mc_request_t)(C.calloc(C.size_t(len(ops)), C.sizeof_mc_request_t))
		b.cap = len(ops)
	}
	if err := b.held.acquire(ops); err != nil {
		m.recycle(b)
		return nil, fmt.Errorf("mooncake submit: %w", err)
	}
	reqs := unsafe.Slice(b.reqs, len(ops))
	for i := range ops {
		op := &ops[i]
		seg, err := m.segment(op.Remote.Peer)
		if err != nil {
			b.held.release()
			m.recycle(b)
			return nil, err
		}
		r := &reqs[i]
		r.opcode = C.MC_OPCODE_READ
		if op.Kind == Write {
			r.opcode = C.MC_OPCODE_WRITE
		}
		r.source = unsafe.Pointer(&op.Local.buf[op.LocalOff])
		r.target_id = seg
		r.file_id = 0
		r.target_offset = C.uint64_t(op.Remote.Addr + op.RemoteOff)
		r.length = C.uint64_t(op.Len)
	}
	id := C.mc_alloc_batch(m.lib, m.eng, C.size_t(len(ops)))
	if id == C.MC_INVALID_BATCH {
		b.held.release()
		m.recycle(b)
		return nil, fmt.Errorf("mooncake allocate batch: %w", ErrUnavailable)
	}
	if rc := C.mc_submit(m.lib, m.eng, id, b.reqs, C.size_t(len(ops))); rc != 0 {
		C.mc_free_batch(m.lib, m.eng, id)
		b.held.release()
		m.recycle(b)
		err := mcErr(rc)
		if err == ErrNotRegistered {
			// Local regions are held live, so the unknown address is the
			// remote one: withdrawn by its owner.
			err = ErrNotFound
		}
		return nil, fmt.Errorf("mooncake submit: code %d: %w", int(rc), err)
	}
	b.id, b.n, b.next, b.done, b.err = id, len(ops), 0, false, nil
	return b, nil
}

// Poll asks the engine for the status of every task not yet finished.
func (b *mcBatch) Poll() (bool, error) {
	if b.done {
		return true, b.err
	}
	m := b.m
	for b.next < b.n {
		if rc := C.mc_status(m.lib, m.eng, b.id, C.size_t(b.next), &b.st); rc != 0 {
			b.fail(fmt.Errorf("mooncake status of task %d: code %d: %w", b.next, int(rc), mcErr(rc)))
			b.next++
			continue
		}
		switch b.st.status {
		case C.MC_STATUS_COMPLETED:
		case C.MC_STATUS_WAITING, C.MC_STATUS_PENDING:
			return false, nil
		case C.MC_STATUS_TIMEOUT:
			b.fail(fmt.Errorf("mooncake task %d: %w", b.next, ErrTimeout))
		case C.MC_STATUS_INVALID:
			b.fail(fmt.Errorf("mooncake task %d: %w", b.next, ErrInvalid))
		default: // failed, canceled
			b.fail(fmt.Errorf("mooncake task %d: status %d: %w", b.next, int(b.st.status), ErrTransfer))
		}
		b.next++
	}
	b.done = true
	b.held.release()
	return true, b.err
}

func (b *mcBatch) fail(err error) {
	if b.err == nil {
		b.err = err
	}
}

// Release waits for the batch to finish if it has not, then frees it.
func (b *mcBatch) Release() {
	if !b.done {
		_ = Wait(context.Background(), b)
	}
	C.mc_free_batch(b.m.lib, b.m.eng, b.id)
	b.err = nil
	b.m.recycle(b)
}
