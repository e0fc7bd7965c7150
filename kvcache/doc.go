// Package kvcache owns the router's view of what every engine holds in its
// KV cache:
//
//   - block hashing (hash.go): AppendBlockHashes chains xxh64 over full
//     blocks of token ids exactly as DESIGN §5 specifies; the router's
//     kv-aware pick and `infera tokenize` use it. Engines hash blocks their
//     own way (the simulator, sim/cache.go, has its own chain with another
//     seed, as vLLM has), so the index never compares engine hashes with
//     router hashes: it rehashes the token ids a BlockStored event carries
//     and keeps an engine-hash → router-hash map for removals and parents.
//   - the prefix index (index.go): per worker and DP rank, the set of router
//     block hashes its engine caches, the engine-hash → router-hash map that
//     resolves removals and parents, bounded by MaxBlocks (the worker with
//     the most blocks loses its least recently used one). Match answers one
//     worker; MatchMany answers many in one pass over the prompt's hashes.
//     Workers are packed into groups of 64 slots and each group maps a
//     router hash to a 64-bit membership mask, so a lookup costs one table
//     probe and one AND per hash per group the query touches (one group for
//     fleets of up to 64 workers and ranks).
//   - placements (placements.go): the router's own record of the block
//     hashes it sent to a worker, with a TTL and a capacity bound, matched
//     in approximate mode (no event stream, a stream not confirmed, no
//     tokenizer, multimodal prompts), and, stamped with a cache's intake
//     instead of wall time, what of a prefix an LRU of that capacity still
//     holds (Held: the kv-aware policy's eviction-aware prediction). A
//     worker's capacity is the cache size its engine reports (its record's
//     kv_capacity_blocks, Worker.ReportCapacity) or what its removal events
//     reveal (the most blocks held when its engine had to evict), whichever
//     is more (Worker.Capacity). AppendByteHashes and
//     AppendChainHashes (hash.go) key prompts that have no tokens.
//   - the KV-event decoder (event.go): vLLM (map and msgspec array form),
//     SGLang (array) and ATOM (map) batches, msgpack, zero-allocation with a
//     reused Batch.
//   - parent learning (learn.go): the last prompts routed to each worker,
//     searched when a stored block's parent is unknown.
//   - the divergence detector (divergence.go): per worker, the cached
//     prompt tokens the router predicted against those the engine reports,
//     and the prompt's token count as each counted it, over a window of
//     requests; a worker whose engine reports far fewer hits, or counts
//     most prompts differently (a tokenizer or chat-template mismatch), is
//     divergent, with one rate-limited warning due.
//   - the subscriber (subscriber.go, zmtp.go): one ZMQ SUB stream per worker
//     (pure Go ZMTP via go-zeromq/zmq4), sequence-gap detection, recovery
//     through the engine's replay socket, resync when that is impossible,
//     reconnect with backoff.
//
// # Concurrency
//
// Index readers (Match, MatchMany, Worker getters) never block each other and
// never allocate; they take no lock: a group's table is split in 256 shards,
// each an open-addressing table of (hash, mask) slots read through atomics,
// and a reader retries a hash whose shard a writer changed meanwhile (the
// shard's version moved), waiting on the shard's lock only after a few such
// retries. Writers (Apply, Touch, Clear, Register, Unregister) serialise on
// one index mutex and hold a shard's lock, its version odd, for the instant
// they change one hash's slot (or swap in a grown table); in practice there
// is one writer per worker, the subscriber stream that owns it. A Subscriber
// owns one goroutine per Source and stops and waits for it on Remove/Close.
// A Decoder and a Batch belong to one goroutine.
//
// # Modes
//
// A worker is ModePrecise when every event since its engine's cache was last
// known empty has been applied, or its view has been rebuilt since. It is
// ModeApproximate before its stream is confirmed (first batch in sequence,
// or a completed replay), after a resync, after joining a running engine
// (the first batch the stream ever sees is not seq 0 and replay cannot reach
// back: not a gap, the stream starts there), and after a malformed batch.
// After a resync or join it becomes precise again on AllBlocksCleared, after
// SubscriberConfig.RebuildBlocks stored blocks (> 0), or RebuildAfter
// (default 5 s) later; the log says so ("kv events worker rebuilt") and
// Stats.Rebuilds counts it. Meanwhile the router routes the worker on its
// own placements. Blocks whose parent predates the index are learned from
// the prompts routed to the worker (learn.go, NotePrompt); the rest of what
// the engine stored before is what the rebuilt view misses.
//
// parent_block_hash nil, 0 or empty bytes means a root block. Every reason
// a stored block is not indexed (DropReasons) is logged once per stream.
//
// # Wire formats (DESIGN §7)
//
// Live stream: ZMQ PUB, multipart [topic, seq (8-byte big-endian), payload].
// The subscriber subscribes to every topic and expects an engine's sequence
// to start at 0 with an empty cache. A first batch on a new connection whose
// seq is below what was applied before means the engine restarted: the
// worker is cleared.
//
// Replay (vLLM ZmqEventPublisher replay socket, a ROUTER): the subscriber
// connects a DEALER and sends [b"", start_seq (8-byte BE)]; the server
// replies one message [b"", seq (8-byte BE), payload] (a topic frame before
// seq is tolerated) per buffered batch
// with seq >= start_seq, in order, then the terminator [b"", 0xFFFFFFFFFFFFFFFF,
// b""] (vLLM sends -1 as a signed 8-byte integer; either the all-ones seq or
// an empty payload ends the replay). A subscriber replays on every connect
// (to confirm its position even while the engine is idle) and on every gap.
// If the first replayed seq is beyond the requested one, the engine's buffer
// no longer covers the gap and the worker is resynced. A publisher must put
// a batch in its replay buffer no later than it publishes it (vLLM appends
// right after sending, on the thread that also serves replays), or a gap
// whose last batch is not yet replayable forces a needless resync.
//
// Payload: msgpack batch [ts, [event…], dp_rank?] or a map with "ts",
// "events", "data_parallel_rank" (or "dp_rank"). Events are tagged arrays
// ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
// lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind],
// ["BlockRemoved", block_hashes, medium, group_idx], ["AllBlocksCleared"],
// or maps with those field names and "type". Hashes are ints (signed kept as
// two's complement) or bytes (low 8 bytes, big-endian). Only blocks that the
// router's token hashes can reproduce are indexed: attention kinds or no kind,
// no LoRA, no extra keys (multimodal, cache salt), GPU medium or none, and the
// worker's block size.
package kvcache
