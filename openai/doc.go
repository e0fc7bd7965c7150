// Package openai owns the OpenAI wire format as the router sees it: the
// single-pass request scanner that extracts only what routing needs, the
// prompt readers kv-aware routing uses on its spans (first prompt of a
// completion, token-id arrays, image references of a chat; prompt.go), the
// SSE event scanner used by the relay, and the OpenAI error envelope. Scan
// can hand its walk of the body's top-level members to later edits of the
// same body (Request.Walk, a jsonx.Walk: the router's PD legs).
//
// Concurrency: all functions are pure or operate on caller-owned values; a
// scanner value must not be shared between goroutines.
package openai
