/*
 * Host-memory stand-in for libinfera_mori.so, implementing ../mori_c.h for
 * the `mori` shim's tests. Engines live in this process, keyed by name; a
 * peer must be added before it is addressed; a transfer is a memcpy, done
 * on the second poll (the first reports IN_PROGRESS).
 *
 * Failures are injected through INFERA_STUB_FAIL, read at each call:
 *   register  infera_mori_register returns INFERA_MORI_ERR_UNAVAILABLE
 *   submit    infera_mori_submit returns INFERA_MORI_ERR_UNAVAILABLE
 *   transfer  the transfer fails when polled (nothing copied)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mori_c.h"

#define MAX_ENGINES 64
#define MAX_MEMS 256
#define MAX_PEERS 64

struct mem {
	uint32_t id;
	char *addr;
	uint64_t size;
};

struct infera_mori_engine {
	char key[256];
	struct mem mems[MAX_MEMS];
	int nmems;
	uint32_t next_id;
	struct infera_mori_engine *peers[MAX_PEERS];
};

struct xfer {
	int is_read, polls, failed;
	size_t n;
	char *local, *remote;
	uint64_t *loffs, *roffs, *sizes;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static infera_mori_engine *engines[MAX_ENGINES];

static int failing(const char *what) {
	const char *f = getenv("INFERA_STUB_FAIL");
	return f != NULL && strcmp(f, what) == 0;
}

static infera_mori_engine *lookup(const char *key) {
	for (int i = 0; i < MAX_ENGINES; i++) {
		if (engines[i] != NULL && strcmp(engines[i]->key, key) == 0) return engines[i];
	}
	return NULL;
}

static struct mem *mem_of(infera_mori_engine *e, uint32_t id) {
	for (int i = 0; i < e->nmems; i++) {
		if (e->mems[i].id == id) return &e->mems[i];
	}
	return NULL;
}

int infera_mori_create(const char *key, const char *host, uint16_t port, infera_mori_engine **out) {
	(void)host, (void)port;
	if (key == NULL || *key == 0 || strlen(key) >= sizeof(((infera_mori_engine *)0)->key) || out == NULL)
		return INFERA_MORI_ERR_INVALID;
	pthread_mutex_lock(&mu);
	if (lookup(key) != NULL) {
		pthread_mutex_unlock(&mu);
		return INFERA_MORI_ERR_EXISTS;
	}
	for (int i = 0; i < MAX_ENGINES; i++) {
		if (engines[i] == NULL) {
			infera_mori_engine *e = calloc(1, sizeof *e);
			strcpy(e->key, key);
			e->next_id = 1;
			engines[i] = e;
			*out = e;
			pthread_mutex_unlock(&mu);
			return INFERA_MORI_OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return INFERA_MORI_ERR_UNAVAILABLE;
}

void infera_mori_destroy(infera_mori_engine *e) {
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_ENGINES; i++) {
		if (engines[i] == e) engines[i] = NULL;
		if (engines[i] == NULL) continue;
		for (int p = 0; p < MAX_PEERS; p++) {
			if (engines[i]->peers[p] == e) engines[i]->peers[p] = NULL;
		}
	}
	pthread_mutex_unlock(&mu);
	free(e);
}

int infera_mori_add_peer(infera_mori_engine *e, const char *key, const char *host, uint16_t port) {
	(void)host, (void)port;
	int rc = INFERA_MORI_ERR_NOT_FOUND;
	pthread_mutex_lock(&mu);
	infera_mori_engine *p = lookup(key);
	for (int i = 0; p != NULL && i < MAX_PEERS; i++) {
		if (e->peers[i] == NULL || e->peers[i] == p) {
			e->peers[i] = p;
			rc = INFERA_MORI_OK;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

int infera_mori_register(infera_mori_engine *e, void *addr, uint64_t size, int32_t device, uint32_t *id) {
	if (failing("register")) return INFERA_MORI_ERR_UNAVAILABLE;
	if (addr == NULL || size == 0 || device != -1 || id == NULL) return INFERA_MORI_ERR_INVALID;
	pthread_mutex_lock(&mu);
	if (e->nmems == MAX_MEMS) {
		pthread_mutex_unlock(&mu);
		return INFERA_MORI_ERR_UNAVAILABLE;
	}
	struct mem *m = &e->mems[e->nmems++];
	m->id = e->next_id++;
	m->addr = addr;
	m->size = size;
	*id = m->id;
	pthread_mutex_unlock(&mu);
	return INFERA_MORI_OK;
}

int infera_mori_deregister(infera_mori_engine *e, uint32_t id) {
	int rc = INFERA_MORI_ERR_NOT_FOUND;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < e->nmems; i++) {
		if (e->mems[i].id == id) {
			e->mems[i] = e->mems[--e->nmems];
			rc = INFERA_MORI_OK;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

static int in_range(uint64_t off, uint64_t n, uint64_t size) { return n <= size && off <= size - n; }

int infera_mori_submit(infera_mori_engine *e, int is_read, uint32_t local_id, const infera_mori_mem *remote,
                       const uint64_t *loffs, const uint64_t *roffs, const uint64_t *sizes, size_t n,
                       uint64_t *out) {
	if (failing("submit")) return INFERA_MORI_ERR_UNAVAILABLE;
	if (remote == NULL || remote->engine_key == NULL || n == 0 || out == NULL) return INFERA_MORI_ERR_INVALID;
	pthread_mutex_lock(&mu);
	int rc = INFERA_MORI_OK;
	infera_mori_engine *peer = NULL;
	for (int i = 0; i < MAX_PEERS; i++) {
		if (e->peers[i] != NULL && strcmp(e->peers[i]->key, remote->engine_key) == 0) peer = e->peers[i];
	}
	struct mem *l = mem_of(e, local_id);
	struct mem *r = peer == NULL ? NULL : mem_of(peer, remote->id);
	if (peer == NULL || l == NULL || r == NULL || (uint64_t)(uintptr_t)r->addr != remote->addr) {
		rc = INFERA_MORI_ERR_NOT_FOUND;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		if (sizes[i] == 0) {
			rc = INFERA_MORI_ERR_INVALID;
			goto out;
		}
		if (!in_range(loffs[i], sizes[i], l->size) || !in_range(roffs[i], sizes[i], r->size)) {
			rc = INFERA_MORI_ERR_RANGE;
			goto out;
		}
	}
	struct xfer *x = calloc(1, sizeof *x);
	x->is_read = is_read;
	x->failed = failing("transfer");
	x->n = n;
	x->local = l->addr;
	x->remote = r->addr;
	x->loffs = malloc(n * sizeof *loffs);
	x->roffs = malloc(n * sizeof *roffs);
	x->sizes = malloc(n * sizeof *sizes);
	memcpy(x->loffs, loffs, n * sizeof *loffs);
	memcpy(x->roffs, roffs, n * sizeof *roffs);
	memcpy(x->sizes, sizes, n * sizeof *sizes);
	*out = (uint64_t)(uintptr_t)x;
out:
	pthread_mutex_unlock(&mu);
	return rc;
}

int infera_mori_poll(infera_mori_engine *e, uint64_t id, char *msg, size_t msg_len) {
	(void)e;
	struct xfer *x = (struct xfer *)(uintptr_t)id;
	if (x == NULL) return INFERA_MORI_ERR_NOT_FOUND;
	pthread_mutex_lock(&mu);
	int rc = INFERA_MORI_OK;
	if (x->polls++ == 0) {
		rc = INFERA_MORI_IN_PROGRESS;
	} else if (x->failed) {
		snprintf(msg, msg_len, "stub: injected transfer failure");
		rc = INFERA_MORI_ERR_TRANSFER;
	} else if (x->polls == 2) {
		for (size_t i = 0; i < x->n; i++) {
			char *l = x->local + x->loffs[i], *r = x->remote + x->roffs[i];
			if (x->is_read) {
				memcpy(l, r, x->sizes[i]);
			} else {
				memcpy(r, l, x->sizes[i]);
			}
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

void infera_mori_release(infera_mori_engine *e, uint64_t id) {
	(void)e;
	struct xfer *x = (struct xfer *)(uintptr_t)id;
	if (x == NULL) return;
	free(x->loffs);
	free(x->roffs);
	free(x->sizes);
	free(x);
}
