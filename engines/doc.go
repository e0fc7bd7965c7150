// Package engines owns engine processes: the adapters that turn a worker's
// command line into an engine launch, the process supervisor (process group,
// log capture, readiness, graceful stop, one reaper), and the worker lifecycle
// (launch, register, drain, deregister).
//
// Concurrency: a Process is reaped by exactly one goroutine it owns; its
// methods are safe for concurrent use. Run runs one worker in the calling
// goroutine and stops everything it started before it returns.
package engines
