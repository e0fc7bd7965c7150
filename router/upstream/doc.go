// Package upstream owns the router's connections to workers: dialing,
// per-operation deadlines with slack, the set of open connections that
// shutdown cuts, and the hooks a streamed exchange reads through.
//
// It imports nothing from the router. What a connection needs from above
// is handed to it, never looked up: the worker's progress accounting
// (Progress) when it is dialed, the unary exchange using it (Owner) and the
// stream reading it (Watcher) while they hold it.
//
// Concurrency: a Conn is used by one goroutine at a time for reads and one
// for writes, as net.Conn; its deadline caps and its watcher are atomics
// that another goroutine may set. A Set is safe for concurrent use.
package upstream
