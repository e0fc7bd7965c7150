package router

import (
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/openai"
)

// dialect is the API a proxied route speaks: how its request goes to a
// worker, how each streamed event comes back, and how its errors look. The
// workers speak OpenAI; a route in another dialect (Anthropic later)
// translates at both ends.
type dialect struct {
	name string
	// request rewrites the client's body for the workers, appending to
	// dst; nil sends it byte for byte. An error answers 400. The router
	// scans (openai.Scan) the rewritten body: routing and cache hints see
	// what the workers get.
	request func(dst, body []byte) ([]byte, error)
	// event rewrites one complete SSE event (its blank line included),
	// appending to dst; nil relays events as they are. It must not
	// allocate on the steady path (the pump's buffer is reused).
	event func(dst, ev []byte) []byte
	// stream: the events go through the relay's own stateful translator
	// (relay.xlate, an anthropic.Stream) instead of event.
	stream bool
	// response rewrites a buffered (unary) worker answer with its status
	// into the client's response; nil relays it as it is.
	response func(ctx *fasthttp.RequestCtx, rel *relay)
	// writeError replaces the response with an error in the dialect's
	// envelope.
	writeError func(ctx *fasthttp.RequestCtx, status int, message, errType, code string)
	// errorEvent appends the SSE event that ends a stream failing after
	// its headers went out.
	errorEvent func(dst []byte, message, errType, code string) []byte
}

// openAIDialect: bodies and events pass through; OpenAI error envelopes.
var openAIDialect = &dialect{
	name:       "openai",
	writeError: writeError,
	errorEvent: func(dst []byte, message, errType, code string) []byte {
		dst = append(dst, "data: "...)
		dst = openai.AppendError(dst, message, errType, code)
		return append(dst, "\n\n"...)
	},
}

// defaultDialects are the dialects of the proxied routes.
func defaultDialects() [numProxyRoutes]*dialect {
	return [numProxyRoutes]*dialect{
		RouteChatCompletions: openAIDialect,
		RouteCompletions:     openAIDialect,
		RouteMessages:        anthropicDialect,
		RouteEmbeddings:      openAIDialect,
		RouteResponses:       openAIDialect,
	}
}
