/*
 * Host-memory stand-in for Mooncake Transfer Engine, implementing the C
 * functions of ../mooncake_c.h for the `mooncake` shim's tests. Engines
 * live in this process and find each other by local_server_name; a segment
 * is an engine; a transfer is a memcpy between registered buffers, done on
 * the second status poll (the first reports PENDING, so callers must poll).
 *
 * Across processes: an engine created with the metadata string "dir:DIR"
 * publishes its pid and registered buffers in DIR/<name> (rewritten on every
 * register and unregister, removed on destroy); openSegment of a name that
 * is not in this process reads that file, and transfers with such a segment
 * copy with process_vm_readv/process_vm_writev, checked against the
 * buffers the file lists at submit time. A peer that died fails its tasks
 * (MC_STATUS_FAILED), as the real engine's would.
 *
 * Failures are injected through INFERA_STUB_FAIL, read at each call:
 *   register  registerLocalMemory returns MC_ERR_DEVICE_NOT_FOUND
 *   submit    submitTransfer returns MC_ERR_TOO_MANY_REQUESTS
 *   transfer  every task ends MC_STATUS_FAILED (nothing copied)
 *   timeout   every task ends MC_STATUS_TIMEOUT
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

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
	char dir[512]; /* "dir:" metadata: where engines publish themselves */
	pid_t pid;     /* a segment in another process: its pid (0: this one) */
};

/* publish writes DIR/<name>: the pid, then "addr len" per buffer; call under mu. */
static void publish(struct engine *e) {
	if (e->dir[0] == '\0') return;
	char path[1024], tmp[1100];
	snprintf(path, sizeof path, "%s/%s", e->dir, e->name);
	snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
	FILE *f = fopen(tmp, "w");
	if (f == NULL) return;
	fprintf(f, "%d\n", (int)getpid());
	for (int i = 0; i < e->nbufs; i++) fprintf(f, "%lx %zu\n", (unsigned long)(uintptr_t)e->bufs[i].addr, e->bufs[i].len);
	fclose(f);
	rename(tmp, path);
}

/* load fills proxy r (a segment of another process) from DIR/<name>. */
static int load(struct engine *r, const char *dir, const char *name) {
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "r");
	if (f == NULL) return -1;
	int pid;
	if (fscanf(f, "%d", &pid) != 1) {
		fclose(f);
		return -1;
	}
	r->pid = pid;
	r->nbufs = 0;
	unsigned long a;
	size_t n;
	while (r->nbufs < MAX_BUFFERS && fscanf(f, "%lx %zu", &a, &n) == 2) {
		r->bufs[r->nbufs].addr = (char *)(uintptr_t)a;
		r->bufs[r->nbufs].len = n;
		r->nbufs++;
	}
	fclose(f);
	return 0;
}

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
			if (metadata != NULL && strncmp(metadata, "dir:", 4) == 0) snprintf(e->dir, sizeof e->dir, "%s", metadata + 4);
			publish(e);
			engines[i] = e;
			pthread_mutex_unlock(&mu);
			return e;
		}
	}
	pthread_mutex_unlock(&mu);
	return NULL;
}

void destroyTransferEngine(mc_engine_t engine) {
	struct engine *e = engine;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_ENGINES; i++) {
		if (engines[i] == engine) engines[i] = NULL;
	}
	if (e->dir[0] != '\0') {
		char path[1024];
		snprintf(path, sizeof path, "%s/%s", e->dir, e->name);
		unlink(path);
	}
	for (int s = 0; s < MAX_SEGMENTS; s++) {
		if (e->segments[s] != NULL && e->segments[s]->pid != 0) free(e->segments[s]);
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
	publish(e);
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
	publish(e);
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
	if (id < 0 && e->dir[0] != '\0') { /* another process's engine */
		struct engine *r = calloc(1, sizeof *r);
		snprintf(r->name, sizeof r->name, "%s", name);
		if (load(r, e->dir, name) != 0 || r->pid == getpid()) {
			free(r);
		} else {
			for (int s = 0; s < MAX_SEGMENTS; s++) {
				if (e->segments[s] == NULL) {
					e->segments[s] = r;
					id = s + 1;
					break;
				}
			}
			if (id < 0) free(r);
		}
	}
	pthread_mutex_unlock(&mu);
	return id;
}

int closeSegment(mc_engine_t engine, mc_segment_t id) {
	struct engine *e = engine;
	if (id < 1 || id > MAX_SEGMENTS) return MC_ERR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if (e->segments[id - 1] != NULL && e->segments[id - 1]->pid != 0) free(e->segments[id - 1]);
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
		if (e->segments[s]->pid != 0) load(e->segments[s], e->dir, e->segments[s]->name); /* its buffers now */
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
			struct engine *seg = b->e->segments[t->req.target_id - 1];
			if (seg != NULL && seg->pid != 0) {
				struct iovec l = {t->req.source, t->req.length}, r = {remote, t->req.length};
				ssize_t n = t->req.opcode == MC_OPCODE_READ ? process_vm_readv(seg->pid, &l, 1, &r, 1, 0)
				                                            : process_vm_writev(seg->pid, &l, 1, &r, 1, 0);
				t->status = n == (ssize_t)t->req.length ? MC_STATUS_COMPLETED : MC_STATUS_FAILED;
			} else if (seg == NULL) {
				t->status = MC_STATUS_FAILED;
			} else {
				if (t->req.opcode == MC_OPCODE_READ) {
					memcpy(t->req.source, remote, t->req.length);
				} else {
					memcpy(remote, t->req.source, t->req.length);
				}
				t->status = MC_STATUS_COMPLETED;
			}
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
