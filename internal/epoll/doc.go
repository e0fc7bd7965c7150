// Package epoll holds what Infera's event loops share (kvd's RESP
// listener, the router's loop front door): an epoll set waited for through
// Go's netpoller, an eventfd to wake it, an optional periodic tick
// (timerfd), and raw non-blocking read/write system calls.
//
// Concurrency: a Poller is waited on by one goroutine (its loop); Poll
// (into the caller's buffer), Add, Mod, Del and Wake may be called from
// any goroutine. Read and Write are plain
// system calls on descriptors the caller owns.
package epoll
