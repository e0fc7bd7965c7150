// Package sim is a GPU-free LLM engine: it speaks vLLM's OpenAI-compatible HTTP
// API and metrics with a paged prefix cache and a continuous-batching timing
// model, so that the router and the fleet are tested and measured without GPUs.
//
// Endpoints: POST /v1/chat/completions and /v1/completions (unary and SSE,
// vLLM's response and chunk shapes, usage with
// prompt_tokens_details.cached_tokens, stream_options.include_usage),
// GET /v1/models, GET /health, GET /metrics (vllm:* names), POST /tokenize,
// POST /reset_prefix_cache.
//
// Tokens: the bytes tokenizer (one token per byte, id = byte value) over the
// prompt, or over chat messages rendered with a fixed ChatML-like template
// (see tokenize.go). The answer is deterministic for (--seed, prompt): words
// from a fixed list, one byte per token, one token per SSE event; the finish
// reason is always "length".
//
// Cache: --kv-blocks blocks of --block-size tokens. A full block is named by a
// chained xxhash of its tokens and its parent's hash; a request reuses the
// longest cached full-block prefix of its prompt (never the whole prompt: the
// last token is always computed, as in vLLM), and blocks filled while decoding
// are cached too, so multi-turn chats hit. Unreferenced blocks stay cached and
// are evicted least recently freed first, a sequence's tail before its head.
// Every store and eviction goes through a cacheObserver, the hook for KV
// events.
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
// atomics. Serve owns every goroutine it starts and stops them when its
// context ends.
package sim
