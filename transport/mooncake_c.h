/*
 * The subset of Mooncake Transfer Engine's C API (transfer_engine_c.h) that
 * Infera's `mooncake` shim calls, declared from its public header. The shim
 * resolves these symbols with dlopen/dlsym at run time, so building needs
 * neither Mooncake's headers nor its library; testdata/mooncake_stub.c
 * implements the same declarations in host memory.
 */
#ifndef INFERA_MOONCAKE_C_H
#define INFERA_MOONCAKE_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *mc_engine_t;     /* transfer_engine_t */
typedef int32_t mc_segment_t;  /* segment_id_t */
typedef uint64_t mc_batch_t;   /* batch_id_t */

#define MC_INVALID_BATCH UINT64_MAX
#define MC_OPCODE_READ 0
#define MC_OPCODE_WRITE 1

/* One transfer: `length` bytes between local `source` and the segment's
 * address `target_offset`. Layout matches struct transfer_request. */
typedef struct {
	int opcode;
	void *source;
	mc_segment_t target_id;
	uint32_t file_id;
	uint64_t target_offset;
	uint64_t length;
} mc_request_t;

/* Task states of struct transfer_status. */
#define MC_STATUS_WAITING 0
#define MC_STATUS_PENDING 1
#define MC_STATUS_INVALID 2
#define MC_STATUS_CANCELED 3
#define MC_STATUS_COMPLETED 4
#define MC_STATUS_TIMEOUT 5
#define MC_STATUS_FAILED 6

typedef struct {
	int status;
	uint64_t transferred_bytes;
} mc_status_t;

/* Return codes (Mooncake's error.h). */
#define MC_ERR_INVALID_ARGUMENT (-1)
#define MC_ERR_TOO_MANY_REQUESTS (-2)
#define MC_ERR_ADDRESS_NOT_REGISTERED (-3)
#define MC_ERR_BATCH_BUSY (-4)
#define MC_ERR_DEVICE_NOT_FOUND (-6)
#define MC_ERR_ADDRESS_OVERLAPPED (-7)
#define MC_ERR_DNS_FAIL (-101)
#define MC_ERR_MALFORMED_RESPONSE (-105)
#define MC_ERR_METADATA (-200)
#define MC_ERR_CONTEXT (-202)
#define MC_ERR_NUMA (-300)
#define MC_ERR_OUT_OF_MEMORY (-302)

mc_engine_t createTransferEngine(const char *metadata_conn_string, const char *local_server_name,
                                 const char *ip_or_host_name, uint64_t rpc_port, int auto_discover);
void destroyTransferEngine(mc_engine_t engine);
void *installTransport(mc_engine_t engine, const char *proto, void **args);
int registerLocalMemory(mc_engine_t engine, void *addr, size_t length, const char *location,
                        int remote_accessible);
int unregisterLocalMemory(mc_engine_t engine, void *addr);
mc_segment_t openSegment(mc_engine_t engine, const char *segment_name);
int closeSegment(mc_engine_t engine, mc_segment_t segment_id);
mc_batch_t allocateBatchID(mc_engine_t engine, size_t batch_size);
int submitTransfer(mc_engine_t engine, mc_batch_t batch_id, mc_request_t *entries, size_t count);
int getTransferStatus(mc_engine_t engine, mc_batch_t batch_id, size_t task_id, mc_status_t *status);
int freeBatchID(mc_engine_t engine, mc_batch_t batch_id);

#ifdef __cplusplus
}
#endif

#endif
