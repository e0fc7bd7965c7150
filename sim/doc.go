// Package sim is a GPU-free LLM engine: it speaks vLLM's OpenAI-compatible HTTP
// API and metrics with a paged prefix cache and a continuous-batching timing
// model, so that the router and the fleet are tested and measured without GPUs.
//
// Endpoints: POST /v1/chat/completions and /v1/completions (unary and SSE,
// vLLM's response and chunk shapes, usage with
// prompt_tokens_details.cached_tokens, stream_options.include_usage),
// POST /v1/embeddings with deterministic unit vectors (embeddings.go),
// GET /v1/models, GET /health, GET /metrics (vllm:* names), POST /tokenize,
// POST /reset_prefix_cache.
//
// Tokens: the bytes tokenizer (one token per byte, id = byte value) over the
// prompt, or over chat messages rendered with a fixed ChatML-like template
// (see tokenize.go); or, with --tokenizer DIR, a Hugging Face tokenizer and
// the model's chat template, so that a router loading the same directory
// computes the same ids (hftok.go). The answer is deterministic for (--seed,
// prompt): words from a fixed list, one token per SSE event (a byte, or a
// model token), each token a function of every token before it, so that a
// generation continued from prompt + its first j output tokens yields the
// rest of the unbroken answer (generate.go); it ends at max_tokens
// (finish_reason "length"), at a "stop" string (stop.go), or is a tool call
// (tools.go).
//
// Token ids (ids.go): "return_token_ids": true answers with the prompt's and
// the output's token ids in vLLM's shape (choices[].token_ids,
// prompt_token_ids) or, with --flavor sglang, SGLang's ("sglext"; refused on
// streaming chat as SGLang does), so that a router can continue a broken
// stream exactly on another worker.
//
// Choices (choices.go): "n" in [1, MaxChoices=128] (outside: 400) gives n
// choices, each a sequence of its own in the scheduler (a batch slot, its
// blocks, one decode per step) generated with the seed mixed with its index
// (choice 0 is the n=1 answer); stop strings, max_tokens and tool calls
// apply per choice, streamed chunks of the choices interleave, each with its
// index, and usage counts the prompt once and every choice's tokens. The
// engine counters (vllm:request_success_total, prompt and prefix-cache
// tokens) count each choice as a request.
//
// Cache: --kv-blocks blocks of --block-size tokens. A full block is named by a
// chained xxhash of its tokens and its parent's hash; a request reuses the
// longest cached full-block prefix of its prompt (never the whole prompt: the
// last token is always computed, as in vLLM), and blocks filled while decoding
// are cached too, so multi-turn chats hit. Unreferenced blocks stay cached and
// are evicted least recently freed first, a sequence's tail before its head.
// A block is only cached while its parent is (a sequence re-registers its
// own copies of a prefix that was evicted or reset under it), as a KV-event
// consumer can only place a block under a parent it knows. Every store and
// eviction goes through a cacheObserver.
//
// kvd (kvd.go, --kvd-socket): evicted blocks are stored in kvd, and a prompt
// whose prefix the GPU cache lost loads the blocks kvd holds at
// --kvd-load-ms-per-block each instead of prefilling them; they count as
// cached tokens. BlockKeys names a prompt's blocks as kvd keys (the
// router's POST /v1/cache/prewarm takes their hex).
//
// KV events (kvevents.go, zmq.go): with --kv-events-endpoint, each scheduler
// step that changed the cache publishes one batch of BlockStored /
// BlockRemoved / AllBlocksCleared events on a ZMQ PUB socket as
// [topic, 8-byte big-endian seq, msgpack payload], encoded like vLLM (tagged
// maps or msgspec tagged arrays, uint64 hashes) or SGLang (tagged arrays, one
// block per event, int64 hashes); the engine hashes are the simulator's own,
// not the router's. --kv-events-replay-endpoint serves the last
// --kv-events-buffer batches on a ROUTER socket in vLLM's replay protocol.
//
// Facades (facade.go): --flavor vllm|sglang|atom takes the engine's own
// command line (`--flavor vllm serve MODEL …`), with the engine's defaults,
// its --kv-events-config, and SGLang's metric names and endpoints for
// --flavor sglang.
//
// Timing: a scheduler step gives one decode token to every running sequence
// past prefill, then spends the rest of --max-num-batched-tokens on prefill
// chunks of uncached prompt tokens; at most --max-num-seqs run, the rest wait.
// A step lasts
//
//	(--step-overhead-ms + prefill tokens / --prefill-tokens-per-s
//	 + decoding sequences × --decode-ms-per-token) × --time-scale
//
// and its tokens appear when it ends, so TTFT falls on a cache hit and rises
// with load. --time-scale 0 is the zero-latency mode: nothing sleeps and a
// sequence is prefilled and decoded to the end as soon as it is admitted
// (running/waiting then stay near 0); it is the baseline for router-overhead
// benchmarks.
//
// Faults: --error-rate answers 500, --hang-before-first-token holds a request
// (counted as running) until its client goes away, --die-after-tokens exits
// the process with code 1 after that many tokens were sent (WithExit replaces
// the exit in tests), --slow-start keeps /health and the API at 503 for a
// while. A client that disconnects mid-stream is noticed at the next write and
// its sequence freed; a unary request whose client leaves still completes.
//
// Concurrency: one scheduler goroutine owns the batch and the cache; HTTP
// handlers talk to it through channels and read per-request progress from
// atomics. The KV-event sockets run a reader and a writer goroutine per
// subscriber and one per replay client over a shared, locked event ring; the
// scheduler only appends to the ring and never waits on a subscriber. Serve
// owns every goroutine it starts and stops them when its context ends.
//
// PD roles (pd.go): --pd-role prefill|decode with --pd-protocol vllm-nixl,
// vllm-mooncake, vllm-mori-read, vllm-mori-write, sglang-bootstrap or
// atom-mooncake (or the facades'
// --kv-transfer-config
// and --disaggregation-mode): a prefill serves each request's KV over
// transport TCP, a decode fetches and checksums it before decoding, and
// fails with 500 when it cannot; --record-requests logs every body received.
// --model-ttft-log writes each request's modelled TTFT at its first token
// (counted from its arrival, also mid-step), the part of it spent waiting to
// enter the batch, and the TTFT it would have had alone on an idle engine
// (modelttft.go).
// An sglang-bootstrap role with --pd-dp-size N (SGLang --dp-size) keeps KV
// per data-parallel rank and refuses bootstrap rooms not aligned to it.
package sim
