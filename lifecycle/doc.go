// Package lifecycle owns the start and stop of long-running pieces: Serve
// runs one fasthttp server on a listener until a context ends and shuts it
// down within a grace period (used by the router and the simulator), and
// Stack stops started components in the reverse order of their start (used
// by `infera serve`, also to unwind a partial start).
//
// Concurrency: Serve blocks its caller and owns the server and listener
// until it returns; it may be called from any goroutine, once per server.
// A Stack is used by one goroutine (the one starting and stopping).
package lifecycle
