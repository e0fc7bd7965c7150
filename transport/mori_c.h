/*
 * Infera's extern "C" face of MoRI-IO (ROCm/mori, include/mori/io): the
 * functions the `mori` shim resolves with dlopen/dlsym from
 * libinfera_mori.so. They are written by us: a thin wrapper library
 * implements them over mori::io::IOEngine (RegisterMemory, Read/BatchRead,
 * Write/BatchWrite with a TransferStatus per submission, RegisterRemoteEngine),
 * and testdata/mori_stub.c implements them in host memory for the tests.
 *
 * Conventions: every function returns INFERA_MORI_OK or a negative
 * INFERA_MORI_ERR_*; strings are not retained after a call returns; a
 * memory region is named by its engine key and the id RegisterMemory
 * assigned; offsets are relative to a region's base.
 */
#ifndef INFERA_MORI_C_H
#define INFERA_MORI_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct infera_mori_engine infera_mori_engine;

/* A region of some engine, as mori::io::MemoryDesc describes it. */
typedef struct {
	const char *engine_key;
	uint32_t id;
	int32_t device; /* GPU ordinal, -1 for host memory */
	uint64_t addr;
	uint64_t size;
} infera_mori_mem;

#define INFERA_MORI_OK 0
#define INFERA_MORI_IN_PROGRESS 1        /* infera_mori_poll only */
#define INFERA_MORI_ERR_INVALID (-1)     /* bad argument */
#define INFERA_MORI_ERR_NOT_FOUND (-2)   /* unknown engine, region or transfer */
#define INFERA_MORI_ERR_UNAVAILABLE (-3) /* no backend, device or peer */
#define INFERA_MORI_ERR_TRANSFER (-4)    /* the transfer failed */
#define INFERA_MORI_ERR_EXISTS (-5)      /* already registered */
#define INFERA_MORI_ERR_RANGE (-6)       /* offset + size outside a region */

/* Creates an engine with an RDMA backend; peers reach it at host:port. */
int infera_mori_create(const char *key, const char *host, uint16_t port, infera_mori_engine **out);
void infera_mori_destroy(infera_mori_engine *e);
/* Makes the engine `key` at host:port a transfer peer. */
int infera_mori_add_peer(infera_mori_engine *e, const char *key, const char *host, uint16_t port);
int infera_mori_register(infera_mori_engine *e, void *addr, uint64_t size, int32_t device, uint32_t *id);
int infera_mori_deregister(infera_mori_engine *e, uint32_t id);
/* Starts n transfers between local region local_id and remote (reads
 * when is_read, else writes) and names them with *xfer for polling. */
int infera_mori_submit(infera_mori_engine *e, int is_read, uint32_t local_id, const infera_mori_mem *remote,
                       const uint64_t *local_offs, const uint64_t *remote_offs, const uint64_t *sizes, size_t n,
                       uint64_t *xfer);
/* INFERA_MORI_OK when done, INFERA_MORI_IN_PROGRESS, or the failure (its
 * message, NUL-terminated, in msg). */
int infera_mori_poll(infera_mori_engine *e, uint64_t xfer, char *msg, size_t msg_len);
/* Frees a finished transfer's state. */
void infera_mori_release(infera_mori_engine *e, uint64_t xfer);

#ifdef __cplusplus
}
#endif

#endif
