// Package upstream owns the router's connections to workers and the
// exchanges on them.
//
// Connections (Conn, Dial, Set): dialing, per-operation deadlines with
// slack, the set of open connections that shutdown cuts, and the hooks a
// streamed read runs through (heartbeats, stall give-up). A read reads the
// clock once, before it, and again only when it waited (the progress
// stamp); a stall tick's deadline may come early (epoll.Deadline.SetTick).
//
// Pools (Pool): one worker's connections — at most MaxConns open, an
// exchange at the cap waiting for a free one up to MaxConnWait (or its
// deadline), idle ones reused last in first out and closed by the pool's
// sweeper once idle IdleTimeout (stamped with the sweeper's tick count,
// not the clock), a connection cut, aborted or sent with Connection:
// close closed, not kept. The sweeper runs while connections are idle;
// Close (the worker left, shutdown) closes the idle ones and stops it,
// and a connection given back afterwards is closed.
//
// Exchanges (Exchange): one request and its answer on a connection of a
// worker's pool, held by the leg from acquisition to release, so that an
// abort (a client that left, a failed prefill) cuts it at any moment. A
// connection Dial made owns its buffered reader and writer for its whole
// life (made on its first exchange, reset on each); only a connection of
// another dial (a TLS client) takes pooled ones from the Pool. Every
// leg — a mixed worker's unary or streamed answer, a PD prefill, a unary or
// streamed PD decode — is one Exchange; a stream read to its end gives its
// connection back to the pool. An answer's head in its common form
// (HTTP/1.1, a status with a body, plain header lines, one Content-Length
// or chunked) is read by the package's own parser (readHead), which keeps
// the status, Content-Type, framing and Connection: close, the headers the
// router reads, and skips the rest; any other head (interim answers,
// obs-fold, duplicate or conflicting framing, bare LF, one not all in the
// reader's buffer yet) is left untouched to fasthttp, which reads or
// refuses it as it always did. A streamed answer in the chunked transfer
// coding is decoded by the package's own reader (chunkedBody) straight
// from the connection's buffered reader, with fasthttp's framing rules and
// its trailer parser; any other body is fasthttp's. Such a body may also
// be read in place (Exchange.Next): the data of the chunks that have
// arrived, as slices of the reader's buffer, valid until the reader next
// reads from the connection (the relay's pump finds and copies its
// events there); where the framing has not all arrived, Read takes over.
// An answer on another transport (requests
// over NATS) is a Leg the Exchange holds (Hold): Read reads it, Abort
// aborts it, Release ends it, as they do a connection. A request that
// comes with its Host header (the relay's, in origin form) goes out as
// built; one given a full URI is parsed as fasthttp's client would.
//
// It imports nothing from the router. What a connection needs from above
// is handed to it, never looked up: the worker's progress accounting
// (Progress) when it is dialed, the unary exchange using it (Owner) and the
// stream reading it (Watcher) while they hold it.
//
// A request goes out with the first read of its answer (Conn.HoldWrites,
// epoll.Held): the read then finds the answer there instead of trying the
// socket once for nothing. A RequestWriter that appends itself is framed
// where it is held (Conn.holdRequest), its body copied once. Every read is Held's, a raw system call (no
// wake of the runtime's monitor thread after an idle spell).
//
// Concurrency: a Conn is used by one goroutine at a time for reads and one
// for writes, as net.Conn (while it holds writes, by the exchange's
// goroutine alone, which writes the request and then reads); its deadline caps and its watcher are atomics
// that another goroutine may set. A Set and a Pool are safe for
// concurrent use. An
// Exchange runs on one goroutine; only Abort may come from another.
package upstream
