// Package anthropic owns the Anthropic Messages wire format as the router
// speaks it: the translation of a /v1/messages request into the OpenAI
// chat request the engines serve (AppendChatRequest), of the engine's
// answer back into an Anthropic message (AppendMessage), of its SSE chunk
// stream into Anthropic's event stream (Stream), and Anthropic's error
// envelope and status codes (AppendError, ErrorType, Status).
//
// All JSON goes through jsonx: nothing is unmarshalled by reflection. The
// request and unary translations may grow their dst; Stream appends to its
// dst and, once its own small buffers (the message id, model and stop
// sequence) have grown, allocates nothing per event.
//
// Concurrency: the functions are pure; a Stream value belongs to one
// stream and must not be shared between goroutines.
package anthropic
