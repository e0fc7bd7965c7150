// Package router owns the front door: the fasthttp OpenAI endpoint, the fleet
// view it routes on, the routing policies, the streaming relay, and metrics.
// The sections below go from a request's arrival to its answer.
//
// # Front door
//
// The listener (frontdoor.go) counts client connections
// (Config.MaxConnections, MaxConnectionsPerIP) and answers the ones over a
// limit with an OpenAI error and Retry-After itself; headers have
// ClientHeaderTimeout, bodies ClientReadTimeout; bodies above 64 KiB reach
// Handle unread and are read into pooled buffers reserved from the shared
// BodyBudgetBytes (503 before reading when full), released when the
// response has been written (fasthttp ConnState) or the connection closes.
// Oversized max_tokens are refused before any engine
// (Config.MaxTokensCeiling); a bare-LF request line is refused at once
// (barelf.go). Client API keys and the admin token are checked in constant
// time (auth.go). GET /ready is 200 only with a routable worker.
//
// ServeLoop (frontloop.go, `--front-door loop`) is ServeAll with the
// connections held by epoll event loops (internal/epoll) instead of a
// goroutine each: a loop reads with raw non-blocking reads until a request's
// header block is in, then a pooled serving goroutine runs fasthttp's
// ServeConn on what arrived (the same parser, limits and handlers, so the
// answers are the goroutine front door's: FuzzFrontDoorsAgree); when
// fasthttp would wait for the next request the connection goes back to its
// loop. A loop's leader (one of the serving goroutines) waits on its set;
// a wait that brings requests in makes the leader keep one to serve itself
// and promote a waiting goroutine to lead (leader/follower). The loop's
// work (a mutex, proc) is run by the leader after each wait or by a
// serving goroutine that has just answered (its turn: it adopts its
// connection and, while others are in flight, polls for the next ready
// request and serves it itself). Header and keep-alive deadlines live in a per-loop timer wheel
// ticking on a timerfd (each ends at the first tick at or after it); a
// loop stops reading a socket at a short read, unless the client has shut
// its side down (EPOLLRDHUP: its end of stream is read with its last
// bytes); a read or write that has to wait (a trickling body,
// the client watch, a full socket) falls back to a netpoller duplicate of
// the socket with the runtime deadline fasthttp asked for.
//
// On the goroutine front door the server's header, idle and write timeouts
// are frontConn's own, started by fasthttp's connection states (a
// request's first byte, its answer's end) and taken from the clock only
// when a read or write begins under them; the body's deadline fasthttp
// still asks for (HeaderReceived) is recorded by frontConn. Each is set on
// the socket when a read or write begins (frontdeadline.go), with
// epoll.Deadline's slack, so a busy keep-alive connection keeps its idle
// wait's deadline across requests; the client watch sets its own at once
// on the connection beneath.
//
// # Routes and dialects
//
// POST /v1/messages and /v1/messages/count_tokens speak Anthropic Messages
// (anthropic.go, the anthropic package); the route's API translation lives
// in dialect.go. GET /v1/models/{id} (models.go), POST /tokenize and
// /detokenize (tokenize.go, the router's tokenizer) are answered here; POST
// /v1/embeddings and /v1/responses are proxied as they are to the
// least-loaded worker (routes.go, routePolicy), without cache hints. The
// request-id headers are requestid.go's; the metrics Infera's Python server
// exported, inferametrics.go's. With Config.KVDSocket, POST
// /v1/cache/prewarm (prewarm.go) forwards a prefetch_hint for the block
// hashes it is given to kvd.
//
// # Picking a worker
//
// Policies: round-robin, least-load and kv-aware (kvaware.go, kvpick.go,
// kvprompt.go, kvestimate.go, kvcoalesce.go, kvactive.go, kvmetrics.go;
// DESIGN §5). kv-aware tokenizes each prompt as
// the engine does, hashes its KV blocks, matches them against the prefix
// index its KV-event subscriber keeps (or, for a worker it cannot follow
// precisely, against its own recorded placements) and picks the lowest
// w×(blocks−hits) + active_blocks + recent (cold requests: among the
// workers within their recent share of picks, KVAwareConfig.MaxShare). Its
// approximate view follows the request's retention class (a prompt marked
// long, e.g. by cache_control, is remembered for keepTTL; one marked none
// not at all). With --kv-cost ttft (serve's default; KVAwareConfig's zero
// Cost is blocks) it picks by an estimated time to first token instead
// (kvestimate.go), and follows each cache's LRU on its intake:
// a listed prefix the target has had to evict since is priced as cold, and
// a long cold prompt goes where it evicts the least recently used prompts;
// a target whose requests in flight leave no room in its cache adds the
// wait until enough of them end.
// There a request without a home (cold, or warm on a prefix several
// targets hold alike, such as a shared system prompt) goes by a deficit of
// picks, intake, blocks in flight and recent new conversations (only a
// request no target holds counts as one); only a target above
// MaxShareWarm sits out. A warm request whose prefix a target is still
// prefilling for an earlier one follows that prefill, and the pick holds it
// until that prefill's first token (at most KVAwareConfig.CoalesceWait,
// kvcoalesce.go), so that the engine finds the prefix cached whole instead
// of prefilling its tail a second time beside it; one whose prefix is
// in use on its holder by other requests in flight (a shared prompt) leaves
// a holder above the bound whatever the cost.
// It serves GET /v1/admin/cache-view/{worker_id} (admin.go)
// and exports its series with the router's /metrics. Its divergence alarm
// (kvdivergence.go) compares each worker's engine-reported usage with the
// prediction and the router's prompt token count. A warm pick with the
// bytes tokenizer or a token-array prompt allocates nothing; a Hugging Face
// chat template allocates while rendering. Each worker has a circuit
// breaker (breaker.go) and an admission limit with a wake-up queue
// (admission.go).
//
// With KVAwareConfig.PeerHints (peerhint.go), a pick that sends a prompt to
// a worker while a worker on another host's kvd holds more of its leading
// blocks first has the target's kvd pull them from the other kvd (a
// kvd/peer hint, waited on for at most PeerWait, never failing the
// request). Hints name blocks by the simulator's kvd keys (engine block
// hashes, 8 bytes big-endian), so they go only between workers whose real
// engine is the simulator; other pairs are counted as unsupported: vLLM's
// connector keys chunks by sha256 over full block digests,
// which its KV events do not carry (docs/operations.md).
//
// # Request path
//
// Router.serve resolves the request id once and dispatches; a generating
// route is a request (relay.go) that runs a plan of legs (plan.go): [worker]
// for a mixed model, [prefill, decode] for a disaggregated one (pd.go).
// Each leg is an attempt (attempt.go) on one worker, holding its policy
// ticket, admission slot and breaker probe from begin until endAttempt, the
// one place an attempt ends and its outcome is recorded; each exchanges its
// request as an upstream.Exchange on a pooled connection it holds, so that
// it can be aborted at any moment. On the mixed path, unary or stream, the
// request writes itself where the connection holds it for the answer's
// first read, or into the connection's writer (ownrequest.go: the
// worker's request and Host lines rendered once, the client's body as it
// lies), and so do a disaggregated pair's legs sent from the request's
// goroutine (their shaped bodies); continuations, traced requests, NATS
// legs and a concurrent prefill build a fasthttp.Request instead
// (attempt.go). A worker that takes its requests over
// NATS (its record says so, and Config.NATSRequests is set) gets the same
// attempt with a NATS leg held by its exchange (natsleg.go): the frames are
// shaped as an HTTP answer, timeouts and error frames fail over as HTTP
// failures do, aborting or releasing it cancels the worker's request, and
// a worker whose JetStream backlog is full is skipped at pick (all full:
// 429). The streamed answer lives in stream.go. A request ends in
// Router.finish (relay.go): its metrics, its last attempt's end, the relay
// back to its pool. Its series are resolved when the router starts
// (metrics.go); its two duration histograms, ours by route and Infera's
// by outcome, are one set of atomic counts by route and outcome
// (requestDurations), added up into each series when /metrics is scraped.
// docs/architecture.md ("Request path") walks it with file references.
//
// # Failover
//
// failover (plan.go) is the one loop: while nothing of the answer has
// reached the client, a failed plan is replaced by another on untried
// workers, as long as retryable (the one retry predicate) allows, up to
// Config.MaxRetries. Unary answers are buffered, so any failure before the
// answer is complete may be retried; 4xx pass through. A stream's status
// line and headers go out as soon as the first worker's headers arrive —
// with its first events, in one write, when the engine's first bytes came
// with its headers — and SSE comments (": keep-alive") follow every
// HeartbeatInterval of silence. The relay reads on while the upstream
// connection holds bytes, and events read with the stream's end are held
// by the client connection (writehold.go) until its next read (the
// goroutine front door) or, on the loop front door, sent at once with a
// closing chunk the relay writes itself (fasthttp's is dropped): a stream
// the engine sent at once leaves in one write (issue 36). Either way the
// request's bookkeeping (Router.finish) runs after the end went out: on
// the goroutine door the next read runs it between its write and its
// wait (frontConn.putOff). The relay writes
// each batch of events as one chunk straight into the client connection
// (writeChunk), not through fasthttp's 4 KiB response writer: one write
// whatever its size, the headers with the first when they were held. A
// batch that ends where the engine's chunk does not (the rest of the
// chunk's data has not arrived: its size said it is on its way) waits for
// the next write, which sends it with the rest (frontConn.holdOnce): an
// engine that writes one chunk in two pieces reaches the client in one
// write; a heartbeat sends it at the latest.
// Such a stream's own header lines (the request ids, X-Infera-Worker,
// Cache-Control) are not set on fasthttp's header: the connection holds
// the head fasthttp writes and the relay writes them into it
// (relayhead.go); so does a 200 unary answer of the mixed path (its ids
// and X-Infera-Worker: its body is handed to fasthttp as a body stream of
// known length, so that fasthttp flushes its head first); every other
// answer sets them on fasthttp's header;
// until the first event is written a failing worker (end of stream, error,
// first-byte timeout) is replaced by failover and the client sees the next
// worker's events after the comments. After the first event a failure ends
// the stream with one SSE error event. Heartbeats and the stream deadlines
// live in the upstream connection's Read (upstream.Conn.Watch): the relay's
// own goroutine writes the comment, and a failed write closes the worker
// connection — that is how a client leaving a silent stream frees the
// engine's sequence.
//
// # Stream continuation
//
// A stream that breaks after its first event (migrate.go) is continued on
// another worker, up to Config.MigrationLimit times: failover runs a
// continuation leg (tryContinue) built by the continuation package from
// what the client already got; the relay observes and strips the token ids
// it asked the engine for in the pump's transform (trackedEvent). For a
// stream relayed as it is (no dialect, no reshaping) the tracker also
// leads the pump (trackLead): it finds each steady event's end by matching
// it, so the pump does not scan it first, and its copy, never longer than
// the event, is written over the bytes it was read from. A stream with a
// transform whose answer the exchange decodes itself is read in place
// (eventPump.stepInPlace, upstream.Exchange.Next): its events are found
// and transformed in the upstream connection's reader, a tracked stream's
// copies written over the bytes already read there (the chunks' framing
// included), without a copy of every byte into the pump's buffer first;
// only an event cut by a read is copied there, and the pump goes on as
// it did.
//
// # Stalled workers and departed clients
//
// Every upstream read stamps its worker's progress (atomics, no
// allocation); a worker with requests in flight and no progress for
// Config.StallWindow is skipped by every policy and probed (stall.go), and
// requests waiting there for a first byte move elsewhere. A unary request's
// client connection is read while its answer is awaited, from 10-20 ms
// into the wait on (unary.go: a package-wide sweeper, ticking while watches
// are armed, starts them; faster answers cost no watch, no timer): a
// client that leaves aborts the request's exchanges, which closes their
// connections (the engine drops the request).
//
// # Prefill/decode disaggregation
//
// A model with prefill and decode workers (pd.go, pdproto.go, pdmetrics.go)
// is served by pairs, the prefill leg an attempt of its own next to the
// relayed decode attempt, each an exchange of its own so that either can be
// aborted; bodies are shaped per protocol (vllm-nixl, vllm-mori-read and
// atom-mooncake serial; sglang-bootstrap, vllm-mooncake and vllm-mori-write
// concurrent) as shared/protocols/pd.md describes, each leg's in one pass
// over the client's body with its worker's cache hints folded in
// (jsonx.SetFields, pdLegs.shape). A concurrent prefill
// runs on a goroutine of its own, which only sends and reads its leg and
// reports on a channel; its attempt ends on the request's goroutine.
//
// # Concurrency
//
// The fleet view is an immutable value swapped through an atomic pointer by
// the discovery watcher callback; request handlers only load it and never
// lock on the request path. Policies are safe for concurrent use. Every
// goroutine has an owner that Serve waits for: the front door's closers of
// refused and lingering connections, and the stall probes, are waited for
// after the listener has closed and before the worker pools close.
package router
