// Package mcstore is kvd's client of Mooncake Store (kvcache-ai/Mooncake's
// distributed KV object store), the network tier Python Infera fleets run
// as kvd's L4 (`--long-backend mooncake`).
//
// With the build tag `mooncake` (and cgo), Open loads Mooncake Store's C
// API (store_c.h: mooncake_store_create/setup/put/get_into/is_exist/
// remove/register_buffer and their batch forms) from a shared library with
// dlopen, like the transport shims, so the binary builds and starts
// without Mooncake installed: a missing library is ErrUnavailable at Open,
// a clear error for the operator, never a crash. Without the tag Open
// always answers ErrUnavailable ("built without mooncake").
//
// testdata/mooncake_store_stub.c implements the same C API over a
// directory (its master_server_addr "stub:DIR"): one file per object,
// written to a temporary name and renamed, so two processes — two kvds
// standing for two hosts — share objects through it as they would through
// a Mooncake cluster. Tests build it with the system C compiler.
//
// Concurrency: a Store is safe for concurrent use (Mooncake's client is);
// Close waits for nothing and must not race with calls in flight.
package mcstore
