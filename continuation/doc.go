// Package continuation owns the wire side of continuing a broken stream on
// another worker: what the router asks the engine for, what it reads from
// every chunk on the way to the client, and the request that continues the
// generation elsewhere. The router's request path decides when a stream
// broke and which worker continues it; this package knows the bytes.
//
//   - Asking (ids.go): AsksIDs says which engines and endpoints accept
//     "return_token_ids" (vLLM: chat and completions; SGLang: completions
//     only, it refuses the field on streaming chat; ATOM and others: never),
//     and AskIDs adds the field to a body that has none (one copy, no
//     parse: the router's scan of the request says whether the client set
//     it).
//   - Reading (tracker.go): a Tracker observes each chunk of a stream: the
//     delivered text, the prompt's and the output's token ids in vLLM's
//     (choices[].token_ids, prompt_token_ids) and SGLang's ("sglext")
//     shapes, the finish, and whatever makes the stream impossible to
//     continue (more than one choice, an unparseable chunk; tool calls or
//     reasoning matter on the text path). It strips the id fields the
//     router asked for before the client sees a chunk. Chunks are read
//     through templates of their layouts (fast.go): only the values that
//     change (text, ids, finish reason) are read, the rest compared (32
//     bytes a step where the CPU has AVX2: equal_amd64.s); the
//     templates outlive the stream (Reset keeps them), so a reused
//     Tracker reads the next stream from the same engine that way from
//     its first chunk to its last. A Tracker given a LayoutPool (the
//     router's relays) holds its templates, with the prompt's ids, only
//     for one stream: Reset gives the set back and the next stream's
//     first chunk takes the one last given back on its processor, still
//     in the cache where a relay's own would not be under many streams. A template keeps the bytes between
//     the values, not the values, so a long prompt's first chunk is read
//     that way too; the stream's id, time and model are compared as
//     fixed bytes once the stream's first chunk moved the templates to
//     them. AppendNext finds an event's end by that match (the layouts
//     hold no line break), for a relay that has not delimited its
//     events; its copy is never longer than the event, so the relay
//     writes it over the bytes it read.
//   - Continuing (continue.go): Build makes the continuation request:
//     exact (prompt ids + output ids on /v1/completions) when the ids cover
//     every delivered chunk and the request has no chat-only fields, else
//     text (the delivered text as the assistant's turn, or appended to a
//     completion prompt); max_tokens / max_completion_tokens reduced by
//     what was produced, at least 1. Continuable refuses what is never
//     continued (n > 1, best_of > 1). ReshapeChat turns a continuation's
//     completion chunk into the chat chunk the client expects.
//
// Concurrency: a Tracker belongs to one stream and one goroutine at a
// time; a LayoutPool is safe for concurrent use (a set it lends belongs
// to one Tracker until that Tracker's Reset); everything else is a pure
// function. Observe allocates nothing once
// the Tracker's buffers have grown (the relay reuses Trackers); Build runs
// once per continuation and may allocate.
package continuation
