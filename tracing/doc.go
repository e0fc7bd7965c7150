// Package tracing owns Infera's OpenTelemetry traces: the OTLP/gRPC exporter
// and tracer provider (New, Shutdown; off when no endpoint is configured),
// and a small span API the router's request path calls.
//
// Off costs nothing: a nil *Tracer starts no span, and the zero Span is a
// no-op whose methods allocate nothing, so the request path keeps its
// zero-allocation guarantee with tracing off. On, spans are the official
// SDK's (go.opentelemetry.io/otel/sdk), sampled parent-based with a trace-id
// ratio, exported in batches; W3C trace context (traceparent, tracestate)
// is read from a client's request and written on each upstream request.
//
// Concurrency: a Tracer is safe for concurrent use; one Span is used by one
// goroutine at a time (the router's request goroutine), as the SDK's spans
// are safe to end from any goroutine. The batch exporter's goroutine is owned
// by the Tracer and stopped by Shutdown, which flushes what is queued.
package tracing
