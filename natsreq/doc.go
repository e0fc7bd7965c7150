// Package natsreq carries requests over NATS on the reference's wire
// (--request-transport nats): the parts that do not depend on the
// router's request path.
//
//   - Wire (wire.go): subjects infera.req.<token> and infera.cancel.<token>
//     (natsx.Token of the worker id); the envelope {"path", "stream",
//     "headers", "body", "migratable"} written as the reference's
//     json.dumps writes it (", " and ": " separators, non-ASCII escaped;
//     headers sorted, the body embedded as the router holds it) and
//     validated on the worker (absolute path without dot segments, string
//     headers without line breaks, an object body; fuzzed); reply frames
//     by the rs-type header (data, done with rs-status, error).
//   - Server (worker side): subscribes to its subject, or with
//     MaxPending > 0 takes requests from the INFERA_REQUESTS work-queue
//     stream through its durable consumer (named by its token; explicit
//     ack after the request is fully proxied, ack wait 1 h, max deliver
//     1; the reply inbox in the rs-inbox header); proxies each to its
//     engine and streams the answer back; a non-2xx answer is its data
//     then done with that status; idle (reset per chunk) and total
//     deadlines; an inbox on the cancel subject cancels that request.
//     Stop drains: queued-but-undelivered requests first (poll 0.2 s,
//     the first look one poll in, so routers see the record draining),
//     then in-flight ones until the deadline, then migratable ones get
//     the error frame "infera: worker draining" and the rest "request
//     cancelled"; requests queued after the consumer stopped get the
//     same frames at once (the router retries them elsewhere); the
//     durable consumer is deleted. On core NATS a request for a worker
//     nobody serves fails at once on the server's no-responders status
//     (ErrNoResponders).
//   - Client (router side): Admit (num_pending + num_ack_pending of the
//     worker's consumer, cached 200 ms and read again in the background,
//     one read per worker at a time, so Admit never waits on NATS; never
//     read, unreadable or older than 1 s = admit) and Exchange
//     (fresh inbox, publish, frames back through Next under the idle and
//     total deadlines and the caller's context, or NextBefore, which also
//     returns at the caller's own wake-up and leaves the exchange going,
//     the idle deadline running from the last frame; Close without done
//     publishes the inbox to the cancel subject 3 times, 1 s apart); the
//     timeouts' texts and the 429 bodies (AppendBacklogBody,
//     PDBacklogBody, Retry-After: 1) are the reference's.
//
// Concurrency: Server runs one goroutine per request in flight and Stop
// waits for them; Client is safe for concurrent use and Close stops and
// waits for its cancel resends and backlog reads; an Exchange belongs to
// one goroutine.
package natsreq
