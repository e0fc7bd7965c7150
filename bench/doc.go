// Package bench is Infera's load generator and its report: it drives any
// OpenAI-compatible endpoint (an engine, `infera serve`, another proxy) with a
// deterministic workload and measures what an operator sizes a fleet by —
// time to first token, inter-token latency, time per output token, end-to-end
// latency, token throughput, the engine's prefix-cache hit ratio and, behind
// `infera serve`, which worker served each request.
//
// It owns:
//   - workloads (random, shared-prefix, multi-turn, conversation, Mooncake trace) whose
//     prompts are a pure function of the seed and are built from
//     whitespace-separated words of a fixed vocabulary, so that prompts meant to
//     share a prefix share it token for token under a bytes tokenizer and under
//     a BPE tokenizer (whose pre-tokenizer splits at the same spaces);
//   - the arrival processes: closed loop (N workers, each sends its next
//     request when the previous one ends) and Poisson open loop (or the trace's
//     own timestamps), with an in-flight cap;
//   - the HTTP client: unary and streaming, an SSE reader that stamps every
//     content chunk, a zero-allocation scan of the usage object, and errors
//     sorted by kind (connect, timeout, canceled, connection, http_4xx,
//     http_5xx, stream_error, invalid_response);
//   - the report: percentiles (linear interpolation between closest ranks, as
//     numpy), a text table, the JSON document and an SVG TTFT CDF drawn by hand;
//   - the comparison of runs by percentile: a percentile's distribution-free
//     confidence interval from its order statistics, and the tolerance of a
//     reference fleet's percentile over repeats (the larger of its spread and
//     that interval), which make bench-kv's checks use.
//
// Concurrency: Run owns every goroutine it starts (the closed-loop workers or
// one goroutine per open-loop arrival, bounded by MaxInflight, and the
// progress ticker) and returns only after all of them have ended and the HTTP
// client's idle connections are closed. Workload generators are called from a
// single dispatching goroutine at a time (under a mutex), so they keep plain
// state. Results are merged into one collector under a mutex once per request,
// never per token. A Report is a plain value, safe to read from any goroutine
// once Run has returned it.
package bench
