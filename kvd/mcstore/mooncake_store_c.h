/*
 * The subset of Mooncake Store's C API (store_c.h) that kvd's mcstore shim
 * calls, declared from its public header. The shim resolves the symbols with
 * dlopen/dlsym at run time, so building needs neither Mooncake's headers nor
 * its library; testdata/mooncake_store_stub.c implements the same
 * declarations over a shared directory.
 */
#ifndef INFERA_MOONCAKE_STORE_C_H
#define INFERA_MOONCAKE_STORE_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *mcs_store_t; /* mooncake_store_t */

/* struct mooncake_replicate_config, field for field. */
typedef struct {
	size_t replica_num;
	int with_soft_pin;
	int with_hard_pin;
	const char **preferred_segments;
	size_t preferred_segments_count;
} mcs_replicate_config_t;

mcs_store_t mooncake_store_create(void);
void mooncake_store_destroy(mcs_store_t store);
int mooncake_store_setup(mcs_store_t store, const char *local_hostname, const char *metadata_server,
                         uint64_t global_segment_size, uint64_t local_buffer_size, const char *protocol,
                         const char *device_name, const char *master_server_addr);
int mooncake_store_health_check(mcs_store_t store);
int mooncake_store_put(mcs_store_t store, const char *key, const void *value, size_t size,
                       const mcs_replicate_config_t *config);
int64_t mooncake_store_get_into(mcs_store_t store, const char *key, void *buffer, size_t size);
int64_t mooncake_store_get_size(mcs_store_t store, const char *key);
int mooncake_store_is_exist(mcs_store_t store, const char *key);
int mooncake_store_remove(mcs_store_t store, const char *key, int force);
int mooncake_store_register_buffer(mcs_store_t store, void *buffer, size_t size);
int mooncake_store_unregister_buffer(mcs_store_t store, void *buffer);

#ifdef __cplusplus
}
#endif

#endif
