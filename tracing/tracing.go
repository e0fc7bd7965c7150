package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ErrConfig: a tracing setting is out of range.
var ErrConfig = errors.New("tracing: invalid config")

// Config configures New.
type Config struct {
	// Endpoint is the OTLP/gRPC receiver, http://HOST:PORT (plaintext) or
	// https://HOST:PORT; "" turns tracing off.
	Endpoint string
	// SampleRatio is the share of new traces recorded (0..1); a request
	// that arrives with a traceparent follows its sampled flag.
	SampleRatio float64
	// ServiceName is the resource's service.name ("infera" when empty).
	ServiceName string
	// ExportTimeout bounds one export (10 s when 0).
	ExportTimeout time.Duration
	// BatchTimeout is the longest a finished span waits before its batch
	// is exported (1 s when 0).
	BatchTimeout time.Duration
}

// Validate checks c.
func (c Config) Validate() error {
	if !(c.SampleRatio >= 0 && c.SampleRatio <= 1) {
		return fmt.Errorf("%w: sample ratio %v not in [0, 1]", ErrConfig, c.SampleRatio)
	}
	if c.ExportTimeout < 0 || c.BatchTimeout < 0 {
		return fmt.Errorf("%w: negative timeout", ErrConfig)
	}
	if c.Endpoint == "" {
		return nil
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Port() == "" {
		return fmt.Errorf("%w: endpoint %q: want http://HOST:PORT or https://HOST:PORT", ErrConfig, c.Endpoint)
	}
	return nil
}

// Tracer starts spans; nil is tracing off.
type Tracer struct {
	tp   *sdktrace.TracerProvider
	tr   trace.Tracer
	prop propagation.TraceContext
}

// New returns a Tracer exporting to cfg.Endpoint, or nil (and no error)
// when no endpoint is configured. The exporter connects lazily: a receiver
// that is down costs dropped spans, never a failed start.
func New(ctx context.Context, cfg Config) (*Tracer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Endpoint == "" {
		return nil, nil
	}
	if cfg.ServiceName == "" {
		cfg.ServiceName = "infera"
	}
	if cfg.ExportTimeout == 0 {
		cfg.ExportTimeout = 10 * time.Second
	}
	if cfg.BatchTimeout == 0 {
		cfg.BatchTimeout = time.Second
	}
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(cfg.Endpoint), otlptracegrpc.WithTimeout(cfg.ExportTimeout))
	if err != nil {
		return nil, fmt.Errorf("tracing: otlp exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(cfg.BatchTimeout)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", cfg.ServiceName))),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
	)
	return &Tracer{tp: tp, tr: tp.Tracer("github.com/infera/infera")}, nil
}

// Shutdown exports what is queued and stops the exporter (nil: nothing).
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// Header is what a request's headers offer the propagation
// (*fasthttp.RequestHeader is one).
type Header interface {
	Peek(key string) []byte
	Set(key, value string)
}

// carrier adapts a Header to the SDK's propagation.
type carrier struct{ h Header }

func (c carrier) Get(k string) string { return string(c.h.Peek(k)) }
func (c carrier) Set(k, v string)     { c.h.Set(k, v) }
func (c carrier) Keys() []string      { return []string{"traceparent", "tracestate"} }

// Span is a started span, or nothing: the zero Span (tracing off) does
// nothing and allocates nothing.
type Span struct {
	s trace.Span
}

// On reports whether s is a span (possibly not sampled: it still carries a
// trace context to propagate).
func (s Span) On() bool { return s.s != nil }

// Recording reports whether s records (sampled).
func (s Span) Recording() bool { return s.s != nil && s.s.IsRecording() }

// StartRoot starts a request's span at at, the child of the trace context
// in h (a client's traceparent) when there is one (nil tracer: none).
func (t *Tracer) StartRoot(h Header, name string, at time.Time) Span {
	if t == nil {
		return Span{}
	}
	ctx := context.Background()
	if h != nil {
		ctx = t.prop.Extract(ctx, carrier{h})
	}
	_, s := t.tr.Start(ctx, name, trace.WithTimestamp(at), trace.WithSpanKind(trace.SpanKindServer))
	return Span{s}
}

// Start starts a child of parent at at (nothing when parent is nothing).
// Client spans are those whose context goes upstream (Inject).
func (t *Tracer) Start(parent Span, name string, at time.Time, client bool) Span {
	if t == nil || parent.s == nil {
		return Span{}
	}
	kind := trace.SpanKindInternal
	if client {
		kind = trace.SpanKindClient
	}
	ctx := trace.ContextWithSpan(context.Background(), parent.s)
	_, s := t.tr.Start(ctx, name, trace.WithTimestamp(at), trace.WithSpanKind(kind))
	return Span{s}
}

// Inject writes s's trace context (traceparent, tracestate) into h.
func (t *Tracer) Inject(s Span, h Header) {
	if t == nil || s.s == nil {
		return
	}
	t.prop.Inject(trace.ContextWithSpan(context.Background(), s.s), carrier{h})
}

// End ends s at at.
func (s Span) End(at time.Time) {
	if s.s != nil {
		s.s.End(trace.WithTimestamp(at))
	}
}

// String sets a string attribute.
func (s Span) String(k, v string) {
	if s.Recording() {
		s.s.SetAttributes(attribute.String(k, v))
	}
}

// Int sets an integer attribute.
func (s Span) Int(k string, v int64) {
	if s.Recording() {
		s.s.SetAttributes(attribute.Int64(k, v))
	}
}

// Bool sets a boolean attribute.
func (s Span) Bool(k string, v bool) {
	if s.Recording() {
		s.s.SetAttributes(attribute.Bool(k, v))
	}
}

// Event adds a named event at at.
func (s Span) Event(name string, at time.Time) {
	if s.Recording() {
		s.s.AddEvent(name, trace.WithTimestamp(at))
	}
}

// Fail marks s failed with err's text (nil: with msg alone).
func (s Span) Fail(msg string, err error) {
	if !s.Recording() {
		return
	}
	if err != nil {
		s.s.RecordError(err)
		if msg == "" {
			msg = err.Error()
		}
	}
	s.s.SetStatus(codes.Error, msg)
}

// TraceID and SpanID are s's ids in hex ("" for nothing).
func (s Span) TraceID() string {
	if s.s == nil {
		return ""
	}
	return s.s.SpanContext().TraceID().String()
}

func (s Span) SpanID() string {
	if s.s == nil {
		return ""
	}
	return s.s.SpanContext().SpanID().String()
}
