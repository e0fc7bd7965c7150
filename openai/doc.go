// Package openai owns the OpenAI wire format as the router sees it: the
// single-pass request scanner that extracts only what routing needs, the SSE
// event scanner used by the relay, and the OpenAI error envelope.
//
// Concurrency: all functions are pure or operate on caller-owned values; a
// scanner value must not be shared between goroutines.
package openai
