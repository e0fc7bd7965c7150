// Package transport moves KV-cache bytes between hosts: a small Engine
// interface for registering memory regions and reading or writing them
// on a peer, with three implementations.
//
//   - TCP (tcp.go, frame.go): pure Go, in every build. Regions are served
//     by name over a framed, validated protocol; the simulator's prefill
//     side registers a request's KV under a key and the decode side reads
//     it. Zero allocations per transfer once connections are warm.
//   - Mooncake Transfer Engine (mooncake.go, build tag `mooncake`, cgo):
//     its C API (transfer_engine_c.h), declared in mooncake_c.h.
//   - MoRI-IO (mori.go, build tag `mori`, cgo): MoRI's C++ IOEngine
//     through a thin extern "C" wrapper whose declarations are mori_c.h;
//     its C++ source is moriwrap/infera_mori.cc, built on a node with
//     MoRI installed (CI has none and runs the stub instead).
//
// The cgo shims only register memory, submit transfers, poll completion and
// map library status codes onto this package's sentinel errors. They load
// their library at run time with dlopen (MooncakeConfig.Library,
// MoriConfig.Library), so a tagged build needs only a C compiler, and a node
// without the library gets ErrUnavailable from NewMooncake/NewMori instead
// of a binary that does not start; the stub
// libraries in testdata/ implement the same C functions in host memory so
// `CGO_ENABLED=1 go test -tags mooncake,mori ./transport/` exercises them
// without RDMA hardware. The default build stays CGO_ENABLED=0.
//
// What a peer needs to address a region is its Desc (peer, name, address,
// length, id, device), published out of band, e.g. in the PD hand-off's
// kv_transfer_params. A Batch is a set of Ops (read: remote → local, write:
// local → remote, each at an offset with a length); Submit starts it,
// Poll/Wait complete it, Release returns it. Every error wraps one of the
// Err* sentinels.
//
// # Concurrency
//
// Engines are safe for concurrent use: any number of goroutines may
// Register, Deregister and Submit at once. A Batch belongs to the goroutine
// that submitted it. Deregister waits for transfers touching the region and
// fails later ones with ErrNotRegistered (local) or ErrNotFound (remote).
// The engine does not order transfers against the region owner's own
// accesses: the owner must not write a region while a peer may be reading
// it, nor read it before the batch writing it is done. The TCP engine runs
// a batch on the submitting goroutine (Submit returns it complete) and
// uses one pooled connection per peer per concurrent batch; its deadline
// is the context's or TCPConfig.IOTimeout, whichever is earlier.
package transport
