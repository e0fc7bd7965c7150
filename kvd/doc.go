// Package kvd is `infera kvd`, the per-host KV-cache daemon below the
// engines' GPU prefix caches (DESIGN §9; wire facts in
// shared/protocols/kvd.md §8.3–8.4), and its Go client.
//
// It owns:
//   - the wire protocol: frames of a 4-byte big-endian length and a msgpack
//     map with "op" and every field (Decoder, Encoder, Message), decoded
//     without reflection or allocation through msgpackx (the reader kvcache's
//     event decoder shares), byte fields aliasing the frame;
//   - the L2 shared arena (Arena): a memfd mapped MAP_SHARED and passed to
//     clients after hello_ack with SCM_RIGHTS and a one-byte "F" marker;
//     cut into pages (StoreOptions.SlotBytes, or arena/16 clamped to
//     64 KiB–4 MiB) that size classes (slab.go: page/k bytes, multiples
//     of 64) take and give back, so values of every size up to a page
//     live side by side; each slot keeps the 16-byte little-endian header
//     the protocol fixes (version u32, even = stable, odd = being written;
//     length u32; 8 reserved bytes), read with a seqlock, and each hit
//     carries its slot's size;
//   - the RAM store (Store): index by (model, compat_key, key), eviction
//     that respects retention (none < ephemeral < short < long, then LRU
//     across size classes, never displacing a higher retention: a class
//     short of slots takes a page whose entries may all go), TTLs, retention-downgrade refusal,
//     leases for zero-copy writes, all-or-nothing sets of several keys
//     (SetMany: room and slots found before any key is published; RESP's
//     MSET), and, over an optional L3 LongStore (the
//     tablespace), asynchronous write-through of long entries, promotion of
//     L3 hits, the bounded prefetch queue, and clears that reach L3 (all of
//     it, or one namespace's keys through LongPrefixDeleter);
//   - the Unix-socket server (Server, Listen): socket created 0600, stale
//     socket replaced, peer uids checked with SO_PEERCRED, "no-hello" mode,
//     leases cancelled with their connection, capped per connection and
//     lapsing after ServerOptions.LeaseTimeout (a connection holding one
//     that is silent or does not read its replies past it is closed), a frame size limit for
//     requests and replies (a reply over it becomes reply_too_large; no
//     frame of 4 GiB or more), a connection cap, an accept loop that
//     backs off through EMFILE (AcceptRetry, shared with kvd/resp), and an
//     undecodable frame closing only its own connection; Prometheus metrics
//     (AdminHandler);
//   - the client (Client), used by tests and `infera kvd stat` (and meant
//     for the router's prewarm): single ops, BatchGetInto (one batch_get,
//     values copied out of the arena with the slot check into reused
//     buffers), BatchSetZeroCopy (set_reserve and set_commit requests
//     pipelined on the connection), and a ...Ctx variant of every method
//     bounded by its context and ClientOptions.Timeout;
//   - the entry points of the listeners and tiers in its subpackages
//     (storeapi.go: Store.Delete across RAM and L3, Store.AppendHit for a
//     copy checked against a concurrent rewrite, SplitComposite;
//     slotwrite.go: SlotWrite for a value a listener reads straight into
//     its slot): the RESP
//     listener is kvd/resp, the Redis/Valkey L4 tier (a LongStore over
//     the tablespace) is kvd/l4, and ServerOptions.Collectors puts their
//     metrics on /metrics.
//
// Concurrency: a Store is safe for concurrent use; one mutex guards its
// index, allocator and counters; large values are copied into a slot the
// writer owns outside it, and values are read out of slots without it
// (seqlock: a reader checks the version before and after). A Server runs one goroutine per connection; each connection
// owns its Decoder, Encoder and buffers, answers its requests in order, and
// holds small answers back while the next request is already buffered, so
// a pipelining client gets one write per burst. A Client serializes its
// requests; one that fails on the socket (deadline, cancellation, I/O)
// closes its connection, and later calls return ErrClientClosed.
// The L3 write-through and prefetch workers are the Store's; Close stops
// them after the pending write-throughs are written.
package kvd
