/*
 * A stub of Mooncake Store's C API (the declarations of ../mooncake_store_c.h)
 * for tests: objects live in a directory shared by every process that names it
 * (master_server_addr "stub:DIR"), one file per object named by the key's hex,
 * written to a temporary file and renamed, so a reader sees a whole object or
 * none. Two processes set up on one directory share objects as two hosts share
 * a Mooncake cluster. Return codes are Mooncake's (types.h): -704 object not
 * found, -10 buffer overflow, -600 invalid params, -900 RPC failure.
 * mcs_stub_registered() reports registered buffers, for tests.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../mooncake_store_c.h"

#define ERR_BUFFER_OVERFLOW (-10)
#define ERR_INVALID_PARAMS (-600)
#define ERR_OBJECT_NOT_FOUND (-704)
#define ERR_RPC_FAIL (-900)

typedef struct {
	char dir[PATH_MAX];
	int ready;
} stub_store;

static long registered;

long mcs_stub_registered(void) { return __atomic_load_n(&registered, __ATOMIC_SEQ_CST); }

mcs_store_t mooncake_store_create(void) { return calloc(1, sizeof(stub_store)); }

void mooncake_store_destroy(mcs_store_t store) { free(store); }

int mooncake_store_setup(mcs_store_t store, const char *local_hostname, const char *metadata_server,
                         uint64_t global_segment_size, uint64_t local_buffer_size, const char *protocol,
                         const char *device_name, const char *master_server_addr) {
	(void)metadata_server;
	(void)global_segment_size;
	(void)local_buffer_size;
	(void)protocol;
	(void)device_name;
	stub_store *s = store;
	if (s == NULL || local_hostname == NULL || master_server_addr == NULL || strchr(local_hostname, ':') == NULL)
		return ERR_INVALID_PARAMS;
	if (strncmp(master_server_addr, "stub:", 5) != 0)
		return ERR_RPC_FAIL; /* no such master */
	if (snprintf(s->dir, sizeof s->dir, "%s", master_server_addr + 5) >= (int)sizeof s->dir)
		return ERR_INVALID_PARAMS;
	if (mkdir(s->dir, 0700) != 0 && errno != EEXIST)
		return ERR_RPC_FAIL;
	s->ready = 1;
	return 0;
}

int mooncake_store_health_check(mcs_store_t store) {
	stub_store *s = store;
	struct stat st;
	return s != NULL && s->ready && stat(s->dir, &st) == 0 ? 0 : ERR_RPC_FAIL;
}

/* object_path writes DIR/<hex(key)> into out. */
static int object_path(stub_store *s, const char *key, char *out, size_t n) {
	if (s == NULL || !s->ready || key == NULL || key[0] == '\0')
		return ERR_INVALID_PARAMS;
	size_t used = (size_t)snprintf(out, n, "%s/", s->dir);
	for (const unsigned char *k = (const unsigned char *)key; *k; k++) {
		if (used + 3 >= n)
			return ERR_INVALID_PARAMS;
		used += (size_t)snprintf(out + used, n - used, "%02x", *k);
	}
	return 0;
}

int mooncake_store_put(mcs_store_t store, const char *key, const void *value, size_t size,
                       const mcs_replicate_config_t *config) {
	char path[PATH_MAX], tmp[PATH_MAX + 32];
	int rc = object_path(store, key, path, sizeof path);
	if (rc != 0)
		return rc;
	if ((value == NULL && size > 0) || (config != NULL && config->replica_num == 0))
		return ERR_INVALID_PARAMS;
	snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return ERR_RPC_FAIL;
	const char *p = value;
	size_t left = size;
	while (left > 0) {
		ssize_t w = write(fd, p, left);
		if (w <= 0) {
			close(fd);
			unlink(tmp);
			return ERR_RPC_FAIL;
		}
		p += w;
		left -= (size_t)w;
	}
	close(fd);
	return rename(tmp, path) == 0 ? 0 : ERR_RPC_FAIL;
}

int64_t mooncake_store_get_size(mcs_store_t store, const char *key) {
	char path[PATH_MAX];
	int rc = object_path(store, key, path, sizeof path);
	if (rc != 0)
		return rc;
	struct stat st;
	if (stat(path, &st) != 0)
		return ERR_OBJECT_NOT_FOUND;
	return (int64_t)st.st_size;
}

int64_t mooncake_store_get_into(mcs_store_t store, const char *key, void *buffer, size_t size) {
	char path[PATH_MAX];
	int rc = object_path(store, key, path, sizeof path);
	if (rc != 0)
		return rc;
	if (buffer == NULL && size > 0)
		return ERR_INVALID_PARAMS;
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return ERR_OBJECT_NOT_FOUND;
	struct stat st;
	if (fstat(fd, &st) != 0) {
		close(fd);
		return ERR_RPC_FAIL;
	}
	if ((size_t)st.st_size > size) {
		close(fd);
		return ERR_BUFFER_OVERFLOW;
	}
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, (char *)buffer + got, (size_t)st.st_size - got);
		if (r <= 0) {
			close(fd);
			return ERR_RPC_FAIL;
		}
		got += (size_t)r;
	}
	close(fd);
	return (int64_t)got;
}

int mooncake_store_is_exist(mcs_store_t store, const char *key) {
	char path[PATH_MAX];
	int rc = object_path(store, key, path, sizeof path);
	if (rc != 0)
		return rc;
	return access(path, F_OK) == 0 ? 1 : 0;
}

int mooncake_store_remove(mcs_store_t store, const char *key, int force) {
	(void)force;
	char path[PATH_MAX];
	int rc = object_path(store, key, path, sizeof path);
	if (rc != 0)
		return rc;
	if (unlink(path) != 0)
		return errno == ENOENT ? ERR_OBJECT_NOT_FOUND : ERR_RPC_FAIL;
	return 0;
}

int mooncake_store_register_buffer(mcs_store_t store, void *buffer, size_t size) {
	if (store == NULL || buffer == NULL || size == 0)
		return ERR_INVALID_PARAMS;
	__atomic_add_fetch(&registered, 1, __ATOMIC_SEQ_CST);
	return 0;
}

int mooncake_store_unregister_buffer(mcs_store_t store, void *buffer) {
	if (store == NULL || buffer == NULL)
		return ERR_INVALID_PARAMS;
	__atomic_sub_fetch(&registered, 1, __ATOMIC_SEQ_CST);
	return 0;
}
