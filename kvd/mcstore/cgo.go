//go:build mooncake && cgo

package mcstore

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "mooncake_store_c.h"

// mcs_lib holds the library's entry points, resolved with dlsym.
typedef struct {
	void *h;
	__typeof__(mooncake_store_create) *create;
	__typeof__(mooncake_store_destroy) *destroy;
	__typeof__(mooncake_store_setup) *setup;
	__typeof__(mooncake_store_health_check) *health;
	__typeof__(mooncake_store_put) *put;
	__typeof__(mooncake_store_get_into) *get_into;
	__typeof__(mooncake_store_get_size) *get_size;
	__typeof__(mooncake_store_is_exist) *is_exist;
	__typeof__(mooncake_store_remove) *remove;
	__typeof__(mooncake_store_register_buffer) *reg;
	__typeof__(mooncake_store_unregister_buffer) *unreg;
} mcs_lib;

static mcs_lib *mcs_load(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		snprintf(err, errlen, "%s", dlerror());
		return NULL;
	}
	mcs_lib *l = calloc(1, sizeof *l);
	l->h = h;
#define MCS_SYM(field, name)                                        \
	if ((l->field = dlsym(h, name)) == NULL) {                  \
		snprintf(err, errlen, "%s: no symbol %s", path, name); \
		free(l);                                            \
		dlclose(h);                                         \
		return NULL;                                        \
	}
	MCS_SYM(create, "mooncake_store_create")
	MCS_SYM(destroy, "mooncake_store_destroy")
	MCS_SYM(setup, "mooncake_store_setup")
	MCS_SYM(health, "mooncake_store_health_check")
	MCS_SYM(put, "mooncake_store_put")
	MCS_SYM(get_into, "mooncake_store_get_into")
	MCS_SYM(get_size, "mooncake_store_get_size")
	MCS_SYM(is_exist, "mooncake_store_is_exist")
	MCS_SYM(remove, "mooncake_store_remove")
	MCS_SYM(reg, "mooncake_store_register_buffer")
	MCS_SYM(unreg, "mooncake_store_unregister_buffer")
#undef MCS_SYM
	return l;
}

static mcs_store_t mcs_create(mcs_lib *l) { return l->create(); }
static void mcs_destroy(mcs_lib *l, mcs_store_t s) { l->destroy(s); }
static int mcs_setup(mcs_lib *l, mcs_store_t s, const char *host, const char *meta, uint64_t seg, uint64_t buf,
                     const char *proto, const char *dev, const char *master) {
	return l->setup(s, host, meta, seg, buf, proto, dev, master);
}
static int mcs_health(mcs_lib *l, mcs_store_t s) { return l->health(s); }
static int mcs_put(mcs_lib *l, mcs_store_t s, const char *key, const void *v, size_t n, size_t replicas) {
	mcs_replicate_config_t c = {replicas, 0, 0, NULL, 0};
	return l->put(s, key, v, n, &c);
}
static int64_t mcs_get_into(mcs_lib *l, mcs_store_t s, const char *key, void *buf, size_t n) { return l->get_into(s, key, buf, n); }
static int64_t mcs_get_size(mcs_lib *l, mcs_store_t s, const char *key) { return l->get_size(s, key); }
static int mcs_is_exist(mcs_lib *l, mcs_store_t s, const char *key) { return l->is_exist(s, key); }
static int mcs_remove(mcs_lib *l, mcs_store_t s, const char *key) { return l->remove(s, key, 0); }
static int mcs_reg(mcs_lib *l, mcs_store_t s, void *p, size_t n) { return l->reg(s, p, n); }
static int mcs_unreg(mcs_lib *l, mcs_store_t s, void *p) { return l->unreg(s, p); }
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// Mooncake Store's error codes the client tells apart (types.h ErrorCode).
const (
	codeBufferOverflow = -10
	codeObjectNotFound = -704
)

// codeErr turns a negative return code into an error.
func codeErr(op string, code int64) error {
	switch code {
	case codeObjectNotFound:
		return ErrNotFound
	case codeBufferOverflow:
		return ErrTooLarge
	}
	return &StoreError{Op: op, Code: code}
}

// Store is a Mooncake Store client.
type Store struct {
	lib      *C.mcs_lib
	s        C.mcs_store_t
	replicas C.size_t
	once     sync.Once
}

var (
	libsMu sync.Mutex
	libs   = map[string]*C.mcs_lib{}
)

// load dlopens path once per process.
func load(path string) (*C.mcs_lib, error) {
	libsMu.Lock()
	defer libsMu.Unlock()
	if l := libs[path]; l != nil {
		return l, nil
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	l := C.mcs_load(cpath, &msg[0], C.size_t(len(msg)))
	if l == nil {
		return nil, fmt.Errorf("load mooncake store: %s: %w", C.GoString(&msg[0]), ErrUnavailable)
	}
	libs[path] = l
	return l, nil
}

// Open loads the library, creates a client and sets it up.
func Open(cfg Config) (*Store, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	lib, err := load(cfg.Library)
	if err != nil {
		return nil, err
	}
	s := C.mcs_create(lib)
	if s == nil {
		return nil, fmt.Errorf("mooncake_store_create failed: %w", ErrUnavailable)
	}
	cs := func(v string) *C.char { return C.CString(v) }
	host, meta, proto, dev, master := cs(cfg.LocalHostname), cs(cfg.MetadataServer), cs(cfg.Protocol), cs(cfg.DeviceName), cs(cfg.MasterAddress)
	defer func() {
		for _, p := range []*C.char{host, meta, proto, dev, master} {
			C.free(unsafe.Pointer(p))
		}
	}()
	if rc := C.mcs_setup(lib, s, host, meta, C.uint64_t(cfg.GlobalSegmentSize), C.uint64_t(cfg.LocalBufferSize), proto, dev, master); rc != 0 {
		C.mcs_destroy(lib, s)
		return nil, fmt.Errorf("mooncake_store_setup (master %s, local %s, %s): %w", cfg.MasterAddress, cfg.LocalHostname, cfg.Protocol,
			errors.Join(ErrUnavailable, codeErr("setup", int64(rc))))
	}
	return &Store{lib: lib, s: s, replicas: C.size_t(cfg.Replicas)}, nil
}

// withKey runs f with key as a C string.
func withKey[T any](key string, f func(*C.char) T) T {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	return f(ck)
}

// Put stores value under key (Mooncake copies it before returning).
func (st *Store) Put(key string, value []byte) error {
	var p unsafe.Pointer
	if len(value) > 0 {
		p = unsafe.Pointer(&value[0])
	}
	rc := withKey(key, func(k *C.char) C.int { return C.mcs_put(st.lib, st.s, k, p, C.size_t(len(value)), st.replicas) })
	if rc != 0 {
		return codeErr("put", int64(rc))
	}
	return nil
}

// Get reads the object under key after dst's bytes (dst grows to fit it)
// and returns dst extended by it.
func (st *Store) Get(key string, dst []byte) ([]byte, error) {
	k := C.CString(key)
	defer C.free(unsafe.Pointer(k))
	size := int64(C.mcs_get_size(st.lib, st.s, k))
	if size < 0 {
		return dst, codeErr("get_size", size)
	}
	n := len(dst)
	if int64(cap(dst)-n) < size {
		grown := make([]byte, n, int64(n)+size)
		copy(grown, dst)
		dst = grown
	}
	buf := dst[n : int64(n)+size]
	var p unsafe.Pointer
	if size > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	got := int64(C.mcs_get_into(st.lib, st.s, k, p, C.size_t(size)))
	switch {
	case got < 0:
		return dst, codeErr("get_into", got)
	case got > size:
		return dst, ErrTooLarge
	}
	return dst[:int64(n)+got], nil
}

// Exists reports whether an object is stored under key.
func (st *Store) Exists(key string) (bool, error) {
	rc := withKey(key, func(k *C.char) C.int { return C.mcs_is_exist(st.lib, st.s, k) })
	if rc < 0 {
		return false, codeErr("is_exist", int64(rc))
	}
	return rc == 1, nil
}

// Remove deletes the object under key (a missing one is not an error).
func (st *Store) Remove(key string) error {
	rc := withKey(key, func(k *C.char) C.int { return C.mcs_remove(st.lib, st.s, k) })
	if rc < 0 && int64(rc) != codeObjectNotFound {
		return codeErr("remove", int64(rc))
	}
	return nil
}

// Healthy asks the client for its health.
func (st *Store) Healthy() error {
	if rc := C.mcs_health(st.lib, st.s); rc != 0 {
		return codeErr("health_check", int64(rc))
	}
	return nil
}

// RegisterBuffer registers memory (kvd's arena) for zero-copy transfers.
func (st *Store) RegisterBuffer(p unsafe.Pointer, n uintptr) error {
	if rc := C.mcs_reg(st.lib, st.s, p, C.size_t(n)); rc != 0 {
		return codeErr("register_buffer", int64(rc))
	}
	return nil
}

// UnregisterBuffer undoes RegisterBuffer.
func (st *Store) UnregisterBuffer(p unsafe.Pointer) error {
	if rc := C.mcs_unreg(st.lib, st.s, p); rc != 0 {
		return codeErr("unregister_buffer", int64(rc))
	}
	return nil
}

// Close destroys the client (once).
func (st *Store) Close() error {
	st.once.Do(func() { C.mcs_destroy(st.lib, st.s) })
	return nil
}
