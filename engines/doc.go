// Package engines owns engine processes: the adapters that turn a worker's
// command line into an engine launch and a worker record (sim, vllm,
// sglang, atom: served model, ports, block size, data-parallel layout,
// disaggregation role, the KV-event publisher the worker adds), the process
// supervisor (process group, log capture, readiness, graceful stop, one
// reaper, a parent-death signal so no engine outlives its worker), the
// engine pidfiles a restarted worker reclaims its port with (stale.go), and
// the worker lifecycle (launch, register, drain, deregister).
//
// PrepareLaunch (kvd.go) adds, with --kvd-socket, kvd's socket to every
// engine's environment (INFERA_KVD_SOCKET) and its kvd connector to vLLM's
// --kv-transfer-config and SGLang's HiCache flags, merged with the user's.
//
// Adapters read only the engine flags they need and forward the rest
// verbatim; what they add is listed in `infera worker --help`, and
// testdata/golden holds the launches of representative real invocations
// (go test ./engines -run Golden -update rewrites them).
//
// Concurrency: a Process is started and reaped by exactly one goroutine it
// owns, locked to its OS thread from the fork until the reap (the
// parent-death signal follows the forking thread); its methods are safe
// for concurrent use. Run runs one worker in the calling
// goroutine and stops everything it started before it returns. Adapters are
// stateless.
package engines
