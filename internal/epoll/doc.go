// Package epoll holds what Infera's event loops share (kvd's RESP
// listener, the router's loop front door): an epoll set waited for through
// Go's netpoller, an eventfd to wake it, an optional periodic tick
// (timerfd), and raw non-blocking read/write system calls; and Held,
// which sends the bytes written to a socket Go's netpoller watches from
// inside the next read's wait, so that the read finds its answer there
// (no read that finds nothing after a request), runs the caller's work
// put off until those bytes are out before that wait (Then), and sends
// bytes now or reads with raw system calls (Send, Read with nothing held), and tells
// whether a read waited (Waited: a caller that read the clock just before
// one that did not need not read it again); and Deadline, a socket's
// deadline set with slack, so that a busy connection does not update a
// runtime timer on every read and write (the router's client and worker
// connections), and a periodic tick's (SetTick), which may also come
// early, so that it is set about once every half tick.
//
// Concurrency: a Poller is waited on by one goroutine (its loop); Poll
// (into the caller's buffer), Add, Mod, Del and Wake may be called from
// any goroutine. Read and Write are plain
// system calls on descriptors the caller owns. A Held is used by one
// goroutine at a time (its connection's, which writes and then reads), a
// Deadline by one at a time (its socket's reader, or writer).
package epoll
