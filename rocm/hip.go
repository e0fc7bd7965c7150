//go:build rocm

package rocm

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

// Declarations written from HIP's public API (hip_runtime_api.h); the
// library is opened at run time so one binary runs with the real
// libamdhip64 or the test's stub.
typedef int hipError_t; // an enum in C: int-sized
#define INFERA_HIP_IPC_HANDLE_SIZE 64
typedef struct { char reserved[INFERA_HIP_IPC_HANDLE_SIZE]; } hipIpcMemHandle_t;

typedef struct {
	void *lib;
	hipError_t (*getDeviceCount)(int *count);
	hipError_t (*setDevice)(int device);
	hipError_t (*deviceGetName)(char *name, int len, int device);
	hipError_t (*deviceTotalMem)(size_t *bytes, int device);
	hipError_t (*deviceGetPCIBusId)(char *bus, int len, int device);
	hipError_t (*malloc_)(void **ptr, size_t size);
	hipError_t (*free_)(void *ptr);
	hipError_t (*memcpy_)(void *dst, const void *src, size_t size, int kind);
	hipError_t (*hostRegister)(void *ptr, size_t size, unsigned int flags);
	hipError_t (*hostUnregister)(void *ptr);
	hipError_t (*ipcGetMemHandle)(hipIpcMemHandle_t *handle, void *ptr);
	hipError_t (*ipcOpenMemHandle)(void **ptr, hipIpcMemHandle_t handle, unsigned int flags);
	hipError_t (*ipcCloseMemHandle)(void *ptr);
	const char *(*getErrorName)(hipError_t err);
} infera_hip;

// infera_hip_open fills h from the library at path; it returns NULL or the
// first missing symbol / dlerror text.
static const char *infera_hip_open(const char *path, infera_hip *h) {
	memset(h, 0, sizeof *h);
	h->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h->lib) return dlerror();
#define SYM(field, name) if (!(*(void **)(&h->field) = dlsym(h->lib, name))) { dlclose(h->lib); h->lib = NULL; return name; }
	SYM(getDeviceCount, "hipGetDeviceCount")
	SYM(setDevice, "hipSetDevice")
	SYM(deviceGetName, "hipDeviceGetName")
	SYM(deviceTotalMem, "hipDeviceTotalMem")
	SYM(deviceGetPCIBusId, "hipDeviceGetPCIBusId")
	SYM(malloc_, "hipMalloc")
	SYM(free_, "hipFree")
	SYM(memcpy_, "hipMemcpy")
	SYM(hostRegister, "hipHostRegister")
	SYM(hostUnregister, "hipHostUnregister")
	SYM(ipcGetMemHandle, "hipIpcGetMemHandle")
	SYM(ipcOpenMemHandle, "hipIpcOpenMemHandle")
	SYM(ipcCloseMemHandle, "hipIpcCloseMemHandle")
	SYM(getErrorName, "hipGetErrorName")
#undef SYM
	return NULL;
}

static void infera_hip_close(infera_hip *h) { if (h->lib) dlclose(h->lib); h->lib = NULL; }
static hipError_t infera_hip_count(infera_hip *h, int *n) { return h->getDeviceCount(n); }
static hipError_t infera_hip_set(infera_hip *h, int d) { return h->setDevice(d); }
static hipError_t infera_hip_name(infera_hip *h, char *s, int n, int d) { return h->deviceGetName(s, n, d); }
static hipError_t infera_hip_mem(infera_hip *h, size_t *b, int d) { return h->deviceTotalMem(b, d); }
static hipError_t infera_hip_bus(infera_hip *h, char *s, int n, int d) { return h->deviceGetPCIBusId(s, n, d); }
static hipError_t infera_hip_malloc(infera_hip *h, void **p, size_t n) { return h->malloc_(p, n); }
static hipError_t infera_hip_free(infera_hip *h, void *p) { return h->free_(p); }
static hipError_t infera_hip_memcpy(infera_hip *h, void *d, const void *s, size_t n, int k) { return h->memcpy_(d, s, n, k); }
static hipError_t infera_hip_register(infera_hip *h, void *p, size_t n, unsigned f) { return h->hostRegister(p, n, f); }
static hipError_t infera_hip_unregister(infera_hip *h, void *p) { return h->hostUnregister(p); }
static hipError_t infera_hip_ipc_get(infera_hip *h, void *handle, void *p) { return h->ipcGetMemHandle((hipIpcMemHandle_t *)handle, p); }
static hipError_t infera_hip_ipc_open(infera_hip *h, void **p, const void *handle, unsigned f) {
	hipIpcMemHandle_t hd;
	memcpy(&hd, handle, sizeof hd);
	return h->ipcOpenMemHandle(p, hd, f);
}
static hipError_t infera_hip_ipc_close(infera_hip *h, void *p) { return h->ipcCloseMemHandle(p); }
static const char *infera_hip_errname(infera_hip *h, hipError_t e) { return h->getErrorName(e); }
*/
import "C"

import (
	"fmt"
	"strings"
	"sync"
	"unsafe"
)

// DefaultHIPLibrary is the HIP runtime OpenHIP loads by default.
const DefaultHIPLibrary = "libamdhip64.so"

// hipMemcpyKind values.
const (
	memcpyHostToDevice = 1
	memcpyDeviceToHost = 2
)

// hipIpcMemLazyEnablePeerAccess, the one flag hipIpcOpenMemHandle takes.
const ipcLazyEnablePeerAccess = 1

// HIP is an opened HIP runtime. Its methods may be called from any
// goroutine (HIP's are thread-safe); Close must come after every other call.
type HIP struct {
	mu sync.Mutex // guards close against use
	h  C.infera_hip
}

// OpenHIP loads the HIP runtime at path (DefaultHIPLibrary when empty).
func OpenHIP(path string) (*HIP, error) {
	if path == "" {
		path = DefaultHIPLibrary
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	h := &HIP{}
	if msg := C.infera_hip_open(cpath, &h.h); msg != nil {
		return nil, fmt.Errorf("%w: open %s: %s", ErrHIPUnavailable, path, C.GoString(msg))
	}
	return h, nil
}

// Close unloads the runtime.
func (h *HIP) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	C.infera_hip_close(&h.h)
	return nil
}

func (h *HIP) check(op string, rc C.hipError_t) error {
	if rc == 0 {
		return nil
	}
	name := ""
	if s := C.infera_hip_errname(&h.h, rc); s != nil {
		name = C.GoString(s)
	}
	return &HIPError{Op: op, Code: int(rc), Name: name}
}

// DeviceCount returns the number of GPUs the runtime sees.
func (h *HIP) DeviceCount() (int, error) {
	var n C.int
	if err := h.check("hipGetDeviceCount", C.infera_hip_count(&h.h, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// SetDevice makes device the calling thread's current device. Go moves
// goroutines between threads: call it under runtime.LockOSThread, in the
// same locked goroutine as the allocations it is meant for.
func (h *HIP) SetDevice(device int) error {
	return h.check("hipSetDevice", C.infera_hip_set(&h.h, C.int(device)))
}

// DeviceProps is what HIP tells of one device.
type DeviceProps struct {
	Name        string
	TotalMemory uint64
	PCIBusID    string // "0000:03:00.0"
}

// Device returns the properties of a device.
func (h *HIP) Device(device int) (DeviceProps, error) {
	var buf [256]C.char
	var p DeviceProps
	if err := h.check("hipDeviceGetName", C.infera_hip_name(&h.h, &buf[0], C.int(len(buf)), C.int(device))); err != nil {
		return DeviceProps{}, err
	}
	p.Name = C.GoString(&buf[0])
	var mem C.size_t
	if err := h.check("hipDeviceTotalMem", C.infera_hip_mem(&h.h, &mem, C.int(device))); err != nil {
		return DeviceProps{}, err
	}
	p.TotalMemory = uint64(mem)
	if err := h.check("hipDeviceGetPCIBusId", C.infera_hip_bus(&h.h, &buf[0], C.int(len(buf)), C.int(device))); err != nil {
		return DeviceProps{}, err
	}
	p.PCIBusID = strings.ToLower(C.GoString(&buf[0]))
	return p, nil
}

// DeviceMemory is one allocation in device memory (or, opened from an IPC
// handle, another process's). It is not Go memory: it lives until Free.
type DeviceMemory struct {
	ptr  unsafe.Pointer
	size int
	ipc  bool
}

// Size is the allocation's length in bytes.
func (m DeviceMemory) Size() int { return m.size }

// Malloc allocates size bytes on the current device.
func (h *HIP) Malloc(size int) (DeviceMemory, error) {
	if size <= 0 {
		return DeviceMemory{}, fmt.Errorf("%w: hipMalloc of %d bytes", ErrHIPArgument, size)
	}
	var p unsafe.Pointer
	if err := h.check("hipMalloc", C.infera_hip_malloc(&h.h, &p, C.size_t(size))); err != nil {
		return DeviceMemory{}, err
	}
	return DeviceMemory{ptr: p, size: size}, nil
}

// Free releases memory from Malloc.
func (h *HIP) Free(m DeviceMemory) error {
	if m.ipc {
		return fmt.Errorf("%w: hipFree of IPC-opened memory: close it with CloseIPC", ErrHIPArgument)
	}
	return h.check("hipFree", C.infera_hip_free(&h.h, m.ptr))
}

// CopyToDevice copies src into m at offset off.
func (h *HIP) CopyToDevice(m DeviceMemory, off int, src []byte) error {
	if err := bounds(m, off, len(src)); err != nil || len(src) == 0 {
		return err
	}
	return h.check("hipMemcpy", C.infera_hip_memcpy(&h.h, unsafe.Add(m.ptr, off), unsafe.Pointer(&src[0]), C.size_t(len(src)), memcpyHostToDevice))
}

// CopyFromDevice copies len(dst) bytes of m at offset off into dst.
func (h *HIP) CopyFromDevice(dst []byte, m DeviceMemory, off int) error {
	if err := bounds(m, off, len(dst)); err != nil || len(dst) == 0 {
		return err
	}
	return h.check("hipMemcpy", C.infera_hip_memcpy(&h.h, unsafe.Pointer(&dst[0]), unsafe.Add(m.ptr, off), C.size_t(len(dst)), memcpyDeviceToHost))
}

func bounds(m DeviceMemory, off, n int) error {
	if m.ptr == nil || off < 0 || n < 0 || off > m.size || n > m.size-off {
		return fmt.Errorf("%w: %d bytes at offset %d of a %d-byte allocation", ErrHIPArgument, n, off, m.size)
	}
	return nil
}

// HostRegister pins mem for DMA by the GPUs (kvd's arena). mem must not be
// Go-managed memory (the runtime keeps the pointer): use memory from mmap.
func (h *HIP) HostRegister(mem []byte) error {
	if len(mem) == 0 {
		return fmt.Errorf("%w: hipHostRegister of an empty region", ErrHIPArgument)
	}
	return h.check("hipHostRegister", C.infera_hip_register(&h.h, unsafe.Pointer(unsafe.SliceData(mem)), C.size_t(len(mem)), 0))
}

// HostUnregister unpins memory pinned by HostRegister.
func (h *HIP) HostUnregister(mem []byte) error {
	if len(mem) == 0 {
		return fmt.Errorf("%w: hipHostUnregister of an empty region", ErrHIPArgument)
	}
	return h.check("hipHostUnregister", C.infera_hip_unregister(&h.h, unsafe.Pointer(unsafe.SliceData(mem))))
}

// IPCHandle names device memory across processes (hipIpcMemHandle_t).
type IPCHandle [C.INFERA_HIP_IPC_HANDLE_SIZE]byte

// IPCHandle returns the handle another process opens m with.
func (h *HIP) IPCHandle(m DeviceMemory) (IPCHandle, error) {
	var hd IPCHandle
	if m.ptr == nil {
		return hd, fmt.Errorf("%w: IPC handle of no allocation", ErrHIPArgument)
	}
	err := h.check("hipIpcGetMemHandle", C.infera_hip_ipc_get(&h.h, unsafe.Pointer(&hd[0]), m.ptr))
	return hd, err
}

// OpenIPC maps another process's device memory of size bytes (the size is
// not in the handle: the owner says it).
func (h *HIP) OpenIPC(hd IPCHandle, size int) (DeviceMemory, error) {
	if size <= 0 {
		return DeviceMemory{}, fmt.Errorf("%w: IPC region of %d bytes", ErrHIPArgument, size)
	}
	var p unsafe.Pointer
	if err := h.check("hipIpcOpenMemHandle", C.infera_hip_ipc_open(&h.h, &p, unsafe.Pointer(&hd[0]), ipcLazyEnablePeerAccess)); err != nil {
		return DeviceMemory{}, err
	}
	return DeviceMemory{ptr: p, size: size, ipc: true}, nil
}

// CloseIPC unmaps memory from OpenIPC.
func (h *HIP) CloseIPC(m DeviceMemory) error {
	if !m.ipc {
		return fmt.Errorf("%w: CloseIPC of memory not opened from a handle", ErrHIPArgument)
	}
	return h.check("hipIpcCloseMemHandle", C.infera_hip_ipc_close(&h.h, m.ptr))
}
