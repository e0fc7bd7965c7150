// Package router owns the front door: the fasthttp OpenAI endpoint, the fleet
// view it routes on, the routing policies, the streaming relay, and metrics.
//
// Policies: round-robin, least-load and kv-aware (kvaware.go, kvpick.go,
// kvprompt.go, kvmetrics.go; DESIGN §5). kv-aware tokenizes each prompt as
// the engine does, hashes its KV blocks, matches them against the prefix
// index its KV-event subscriber keeps (or, for a worker it cannot follow
// precisely, against its own recorded placements) and picks the lowest
// w×(blocks−hits) + active_blocks + recent. It serves
// GET /v1/admin/cache-view/{worker_id} (admin.go) and exports its series
// with the router's /metrics. A warm pick with the bytes tokenizer or a
// token-array prompt allocates nothing; a Hugging Face chat template
// allocates while rendering.
//
// Concurrency: the fleet view is an immutable value swapped through an atomic
// pointer by the discovery watcher callback; request handlers only load it and
// never lock on the request path. Policies are safe for concurrent use.
package router
