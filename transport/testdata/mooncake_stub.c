/*
 * Host-memory stand-in for Mooncake Transfer Engine, implementing the C
 * functions of ../mooncake_c.h for the `mooncake` shim's tests. Engines
 * live in this process and find each other by local_server_name; a segment
 * is an engine; a transfer is a memcpy between registered buffers, done on
 * the second status poll (the first reports PENDING, so callers must poll).
 *
 * Failures are injected through INFERA_STUB_FAIL, read at each call:
 *   register  registerLocalMemory returns MC_ERR_DEVICE_NOT_FOUND
 *   submit    submitTransfer returns MC_ERR_TOO_MANY_REQUESTS
 *   transfer  every task ends MC_STATUS_FAILED (nothing copied)
 *   timeout   every task ends MC_STATUS_TIMEOUT
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../mooncake_c.h"

#define MAX_ENGINES 64
#define MAX_BUFFERS 256
#define MAX_SEGMENTS 64

struct buffer {
	char *addr;
	size_t len;
};

struct engine {
	char name[256];
	struct buffer bufs[MAX_BUFFERS];
	int nbufs;
	struct engine *segments[MAX_SEGMENTS]; /* segment id - 1 */
	int live;
};

struct task {
	mc_request_t req;
	int polls;
	int status;
};

struct batch {
	struct engine *e;
	size_t cap, n;
	struct task *tasks;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct engine *engines[MAX_ENGINES];

static int failing(const char *what) {
	const char *f = getenv("INFERA_STUB_FAIL");
	return f != NULL && strcmp(f, what) == 0;
}

mc_engine_t createTransferEngine(const char *metadata, const char *name, const char *ip, uint64_t port,
                                 int auto_discover) {
	(void)metadata, (void)ip, (void)port, (void)auto_discover;
	if (name == NULL || strlen(name) >= sizeof(((struct engine *)0)->name)) return NULL;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_ENGINES; i++) {
		if (engines[i] != NULL && strcmp(engines[i]->name, name) == 0) {
			pthread_mutex_unlock(&mu);
			return NULL; /* the name is taken */
		}
	}
	for (int i = 0; i < MAX_ENGINES; i++) {
		if (engines[i] == NULL) {
			struct engine *e = calloc(1, sizeof *e);
			strcpy(e->name, name);
			e->live = 1;
			engines[i] = e;
			pthread_mutex_unlock(&mu);
			return e;
		}
	}
	pthread_mutex_unlock(&mu);
	return NULL;
}

void destroyTransferEngine(mc_engine_t engine) {
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_ENGINES; i++) {
		if (engines[i] == engine) engines[i] = NULL;
	}
	pthread_mutex_unlock(&mu);
	free(engine);
}

void *installTransport(mc_engine_t engine, const char *proto, void **args) {
	(void)args;
	if (engine == NULL || proto == NULL) return NULL;
	return engine; /* any non-NULL handle */
}

int registerLocalMemory(mc_engine_t engine, void *addr, size_t length, const char *location, int remote) {
	struct engine *e = engine;
	(void)location, (void)remote;
	if (failing("register")) return MC_ERR_DEVICE_NOT_FOUND;
	if (e == NULL || addr == NULL || length == 0) return MC_ERR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < e->nbufs; i++) {
		char *b = e->bufs[i].addr;
		if ((char *)addr < b + e->bufs[i].len && b < (char *)addr + length) {
			pthread_mutex_unlock(&mu);
			return MC_ERR_ADDRESS_OVERLAPPED;
		}
	}
	if (e->nbufs == MAX_BUFFERS) {
		pthread_mutex_unlock(&mu);
		return MC_ERR_OUT_OF_MEMORY;
	}
	e->bufs[e->nbufs].addr = addr;
	e->bufs[e->nbufs].len = length;
	e->nbufs++;
	pthread_mutex_unlock(&mu);
	return 0;
}

int unregisterLocalMemory(mc_engine_t engine, void *addr) {
	struct engine *e = engine;
	int rc = MC_ERR_ADDRESS_NOT_REGISTERED;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < e->nbufs; i++) {
		if (e->bufs[i].addr == addr) {
			e->bufs[i] = e->bufs[--e->nbufs];
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

mc_segment_t openSegment(mc_engine_t engine, const char *name) {
	struct engine *e = engine;
	mc_segment_t id = -1;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_ENGINES && id < 0; i++) {
		if (engines[i] == NULL || strcmp(engines[i]->name, name) != 0) continue;
		for (int s = 0; s < MAX_SEGMENTS; s++) {
			if (e->segments[s] == NULL || e->segments[s] == engines[i]) {
				e->segments[s] = engines[i];
				id = s + 1;
				break;
			}
		}
	}
	pthread_mutex_unlock(&mu);
	return id;
}

int closeSegment(mc_engine_t engine, mc_segment_t id) {
	struct engine *e = engine;
	if (id < 1 || id > MAX_SEGMENTS) return MC_ERR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	e->segments[id - 1] = NULL;
	pthread_mutex_unlock(&mu);
	return 0;
}

mc_batch_t allocateBatchID(mc_engine_t engine, size_t size) {
	if (engine == NULL || size == 0) return MC_INVALID_BATCH;
	struct batch *b = calloc(1, sizeof *b);
	b->e = engine;
	b->cap = size;
	b->tasks = calloc(size, sizeof *b->tasks);
	return (mc_batch_t)(uintptr_t)b;
}

/* find returns the registered buffer of e holding [addr, addr+n), or NULL. */
static char *find(struct engine *e, char *addr, uint64_t n) {
	for (int i = 0; i < e->nbufs; i++) {
		char *b = e->bufs[i].addr;
		if (addr >= b && n <= e->bufs[i].len && (size_t)(addr - b) <= e->bufs[i].len - n) return addr;
	}
	return NULL;
}

int submitTransfer(mc_engine_t engine, mc_batch_t id, mc_request_t *entries, size_t count) {
	struct engine *e = engine;
	struct batch *b = (struct batch *)(uintptr_t)id;
	if (failing("submit")) return MC_ERR_TOO_MANY_REQUESTS;
	if (b == NULL || b->e != e || b->n + count > b->cap) return MC_ERR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < count; i++) {
		mc_request_t *r = &entries[i];
		int s = r->target_id - 1;
		if (r->opcode != MC_OPCODE_READ && r->opcode != MC_OPCODE_WRITE) goto invalid;
		if (s < 0 || s >= MAX_SEGMENTS || e->segments[s] == NULL) goto invalid;
		if (find(e, r->source, r->length) == NULL ||
		    find(e->segments[s], (char *)(uintptr_t)r->target_offset, r->length) == NULL) {
			pthread_mutex_unlock(&mu);
			return MC_ERR_ADDRESS_NOT_REGISTERED;
		}
	}
	for (size_t i = 0; i < count; i++) {
		struct task *t = &b->tasks[b->n++];
		t->req = entries[i];
		t->status = MC_STATUS_WAITING;
		if (failing("transfer")) t->status = MC_STATUS_FAILED;
		if (failing("timeout")) t->status = MC_STATUS_TIMEOUT;
	}
	pthread_mutex_unlock(&mu);
	return 0;
invalid:
	pthread_mutex_unlock(&mu);
	return MC_ERR_INVALID_ARGUMENT;
}

int getTransferStatus(mc_engine_t engine, mc_batch_t id, size_t task, mc_status_t *st) {
	struct batch *b = (struct batch *)(uintptr_t)id;
	if (b == NULL || b->e != engine || task >= b->n || st == NULL) return MC_ERR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	struct task *t = &b->tasks[task];
	if (t->status == MC_STATUS_WAITING || t->status == MC_STATUS_PENDING) {
		if (t->polls++ == 0) {
			t->status = MC_STATUS_PENDING;
		} else {
			char *remote = (char *)(uintptr_t)t->req.target_offset;
			if (t->req.opcode == MC_OPCODE_READ) {
				memcpy(t->req.source, remote, t->req.length);
			} else {
				memcpy(remote, t->req.source, t->req.length);
			}
			t->status = MC_STATUS_COMPLETED;
		}
	}
	st->status = t->status;
	st->transferred_bytes = t->status == MC_STATUS_COMPLETED ? t->req.length : 0;
	pthread_mutex_unlock(&mu);
	return 0;
}

int freeBatchID(mc_engine_t engine, mc_batch_t id) {
	struct batch *b = (struct batch *)(uintptr_t)id;
	if (b == NULL || b->e != engine) return MC_ERR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < b->n; i++) {
		if (b->tasks[i].status == MC_STATUS_WAITING || b->tasks[i].status == MC_STATUS_PENDING) {
			pthread_mutex_unlock(&mu);
			return MC_ERR_BATCH_BUSY;
		}
	}
	pthread_mutex_unlock(&mu);
	free(b->tasks);
	free(b);
	return 0;
}
