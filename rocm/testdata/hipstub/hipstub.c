/*
 * A stand-in for libamdhip64 with the same C ABI for the functions the
 * rocm package's HIP shim calls. "Device memory" is host memory from
 * malloc, tracked so that bad pointers, double frees, over-allocation and
 * unregistered host memory fail as HIP does. Two devices of 1 GiB each.
 *
 * Injectable failure: HIPSTUB_FAIL="hipName=code" makes every call of
 * hipName return code (read at each call).
 *
 * Built by the tests: cc -shared -fPIC -o libhipstub.so hipstub.c -lpthread
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;
typedef struct { char reserved[64]; } hipIpcMemHandle_t;

enum {
	hipSuccess = 0,
	hipErrorInvalidValue = 1,
	hipErrorOutOfMemory = 2,
	hipErrorInvalidDevicePointer = 17,
	hipErrorInvalidMemcpyDirection = 21,
	hipErrorInvalidDevice = 101,
	hipErrorInvalidHandle = 400,
	hipErrorHostMemoryAlreadyRegistered = 712,
	hipErrorHostMemoryNotRegistered = 713,
};

#define NDEV 2
#define DEV_MEM ((size_t)1 << 30)
#define MAXALLOC 1024
#define MAXREG 256

struct alloc { void *p; size_t n; int dev; uint64_t id; };
struct reg { void *p; size_t n; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct alloc allocs[MAXALLOC];
static struct reg regs[MAXREG];
static size_t used[NDEV];
static uint64_t next_id = 1;
static __thread int cur;

static const char magic[8] = "hipstub";

/* injected returns the code HIPSTUB_FAIL names for fn, or 0. */
static hipError_t injected(const char *fn) {
	const char *f = getenv("HIPSTUB_FAIL");
	size_t n = strlen(fn);
	if (!f || strncmp(f, fn, n) != 0 || f[n] != '=') return hipSuccess;
	return (hipError_t)atoi(f + n + 1);
}
#define INJECT(fn) do { hipError_t e_ = injected(fn); if (e_) return e_; } while (0)

/* trace appends one line to the file HIPSTUB_TRACE names (when set), so a
 * test can count the calls a process made. */
static void trace(const char *line) {
	const char *path = getenv("HIPSTUB_TRACE");
	if (!path) return;
	FILE *f = fopen(path, "a");
	if (!f) return;
	fputs(line, f);
	fputc('\n', f);
	fclose(f);
}

/* find returns the allocation holding [p, p+n), or NULL; call under mu. */
static struct alloc *find(const void *p, size_t n) {
	for (int i = 0; i < MAXALLOC; i++) {
		struct alloc *a = &allocs[i];
		if (a->p && (const char *)p >= (char *)a->p && n <= a->n && (size_t)((const char *)p - (char *)a->p) <= a->n - n) return a;
	}
	return NULL;
}

hipError_t hipGetDeviceCount(int *count) {
	INJECT("hipGetDeviceCount");
	if (!count) return hipErrorInvalidValue;
	*count = NDEV;
	return hipSuccess;
}

hipError_t hipSetDevice(int device) {
	INJECT("hipSetDevice");
	if (device < 0 || device >= NDEV) return hipErrorInvalidDevice;
	cur = device;
	return hipSuccess;
}

hipError_t hipDeviceGetName(char *name, int len, int device) {
	INJECT("hipDeviceGetName");
	if (!name || len <= 0) return hipErrorInvalidValue;
	if (device < 0 || device >= NDEV) return hipErrorInvalidDevice;
	snprintf(name, (size_t)len, "AMD Instinct MI355X (stub %d)", device);
	return hipSuccess;
}

hipError_t hipDeviceTotalMem(size_t *bytes, int device) {
	INJECT("hipDeviceTotalMem");
	if (!bytes) return hipErrorInvalidValue;
	if (device < 0 || device >= NDEV) return hipErrorInvalidDevice;
	*bytes = DEV_MEM;
	return hipSuccess;
}

hipError_t hipDeviceGetPCIBusId(char *bus, int len, int device) {
	INJECT("hipDeviceGetPCIBusId");
	if (!bus || len <= 0) return hipErrorInvalidValue;
	if (device < 0 || device >= NDEV) return hipErrorInvalidDevice;
	snprintf(bus, (size_t)len, "0000:%02X:00.0", 0x03 + 0x20 * device);
	return hipSuccess;
}

hipError_t hipMalloc(void **ptr, size_t size) {
	INJECT("hipMalloc");
	if (!ptr) return hipErrorInvalidValue;
	pthread_mutex_lock(&mu);
	hipError_t rc = hipErrorOutOfMemory;
	if (size <= DEV_MEM - used[cur]) {
		for (int i = 0; i < MAXALLOC; i++) {
			if (allocs[i].p) continue;
			void *p = calloc(1, size ? size : 1);
			if (!p) break;
			allocs[i] = (struct alloc){p, size, cur, next_id++};
			used[cur] += size;
			*ptr = p;
			rc = hipSuccess;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

hipError_t hipFree(void *ptr) {
	INJECT("hipFree");
	if (!ptr) return hipSuccess;
	pthread_mutex_lock(&mu);
	hipError_t rc = hipErrorInvalidValue;
	for (int i = 0; i < MAXALLOC; i++) {
		if (allocs[i].p == ptr) {
			used[allocs[i].dev] -= allocs[i].n;
			free(ptr);
			allocs[i] = (struct alloc){0};
			rc = hipSuccess;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

hipError_t hipMemcpy(void *dst, const void *src, size_t size, int kind) {
	INJECT("hipMemcpy");
	if (!dst || !src) return hipErrorInvalidValue;
	const void *dev;
	switch (kind) {
	case 1: dev = dst; break; /* hipMemcpyHostToDevice */
	case 2: dev = src; break; /* hipMemcpyDeviceToHost */
	default: return hipErrorInvalidMemcpyDirection;
	}
	pthread_mutex_lock(&mu);
	int ok = find(dev, size) != NULL;
	pthread_mutex_unlock(&mu);
	if (!ok) return hipErrorInvalidValue;
	memmove(dst, src, size);
	return hipSuccess;
}

hipError_t hipHostRegister(void *ptr, size_t size, unsigned int flags) {
	INJECT("hipHostRegister");
	if (!ptr || !size || flags > 0xf) return hipErrorInvalidValue;
	pthread_mutex_lock(&mu);
	hipError_t rc = hipErrorOutOfMemory;
	for (int i = 0; i < MAXREG; i++) {
		if (regs[i].p && (char *)ptr < (char *)regs[i].p + regs[i].n && (char *)regs[i].p < (char *)ptr + size) {
			rc = hipErrorHostMemoryAlreadyRegistered;
			goto out;
		}
	}
	for (int i = 0; i < MAXREG; i++) {
		if (!regs[i].p) {
			regs[i] = (struct reg){ptr, size};
			/* Touch every page, as pinning faults them in. */
			for (size_t off = 0; off < size; off += 4096) ((volatile char *)ptr)[off] = ((volatile char *)ptr)[off];
			rc = hipSuccess;
			trace("hipHostRegister");
			break;
		}
	}
out:
	pthread_mutex_unlock(&mu);
	return rc;
}

hipError_t hipHostUnregister(void *ptr) {
	INJECT("hipHostUnregister");
	pthread_mutex_lock(&mu);
	hipError_t rc = hipErrorHostMemoryNotRegistered;
	for (int i = 0; i < MAXREG; i++) {
		if (regs[i].p && regs[i].p == ptr) {
			regs[i] = (struct reg){0};
			rc = hipSuccess;
			trace("hipHostUnregister");
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

/* A handle is magic, the allocation id and the offset of ptr in it. */
hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *ptr) {
	INJECT("hipIpcGetMemHandle");
	if (!handle) return hipErrorInvalidValue;
	pthread_mutex_lock(&mu);
	struct alloc *a = find(ptr, 0);
	if (!a) {
		pthread_mutex_unlock(&mu);
		return hipErrorInvalidDevicePointer;
	}
	uint64_t off = (uint64_t)((char *)ptr - (char *)a->p);
	memset(handle, 0, sizeof *handle);
	memcpy(handle->reserved, magic, 8);
	memcpy(handle->reserved + 8, &a->id, 8);
	memcpy(handle->reserved + 16, &off, 8);
	pthread_mutex_unlock(&mu);
	return hipSuccess;
}

hipError_t hipIpcOpenMemHandle(void **ptr, hipIpcMemHandle_t handle, unsigned int flags) {
	INJECT("hipIpcOpenMemHandle");
	if (!ptr || flags > 1 || memcmp(handle.reserved, magic, 8) != 0) return hipErrorInvalidValue;
	uint64_t id, off;
	memcpy(&id, handle.reserved + 8, 8);
	memcpy(&off, handle.reserved + 16, 8);
	pthread_mutex_lock(&mu);
	hipError_t rc = hipErrorInvalidHandle;
	for (int i = 0; i < MAXALLOC; i++) {
		if (allocs[i].p && allocs[i].id == id && off <= allocs[i].n) {
			*ptr = (char *)allocs[i].p + off;
			rc = hipSuccess;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

hipError_t hipIpcCloseMemHandle(void *ptr) {
	INJECT("hipIpcCloseMemHandle");
	pthread_mutex_lock(&mu);
	int ok = find(ptr, 0) != NULL;
	pthread_mutex_unlock(&mu);
	return ok ? hipSuccess : hipErrorInvalidValue;
}

const char *hipGetErrorName(hipError_t e) {
	switch (e) {
	case hipSuccess: return "hipSuccess";
	case hipErrorInvalidValue: return "hipErrorInvalidValue";
	case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
	case hipErrorInvalidDevicePointer: return "hipErrorInvalidDevicePointer";
	case hipErrorInvalidMemcpyDirection: return "hipErrorInvalidMemcpyDirection";
	case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
	case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
	case hipErrorHostMemoryAlreadyRegistered: return "hipErrorHostMemoryAlreadyRegistered";
	case hipErrorHostMemoryNotRegistered: return "hipErrorHostMemoryNotRegistered";
	}
	return "hipErrorUnknown";
}
