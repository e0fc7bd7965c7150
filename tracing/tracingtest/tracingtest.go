// Package tracingtest runs a real OTLP/gRPC trace receiver for tests: the
// collector's TraceService on a loopback port, keeping every span it is
// sent, so that tests see what an exporter really put on the wire.
package tracingtest

import (
	"context"
	"encoding/hex"
	"net"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
)

// Span is one received span, flattened.
type Span struct {
	Name                    string
	TraceID, SpanID, Parent string // hex; Parent "" for a root
	Kind                    int32
	Service                 string
	Attrs                   map[string]any // string, int64, bool values
	Events                  []string
	Error                   bool // status code ERROR
}

// Receiver is a running OTLP/gRPC trace receiver.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	// Endpoint is its http://127.0.0.1:PORT.
	Endpoint string

	mu    sync.Mutex
	spans []Span
}

// Start runs a receiver until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Endpoint: "http://" + ln.Addr().String()}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, r)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() { srv.Stop(); <-done })
	return r
}

// Export implements the TraceService.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					Parent: hex.EncodeToString(s.GetParentSpanId()), Kind: int32(s.GetKind()), Service: service, Attrs: map[string]any{},
					Error: s.GetStatus().GetCode() == 2}
				for _, kv := range s.GetAttributes() {
					switch v := kv.GetValue().GetValue().(type) {
					case *commonv1.AnyValue_StringValue:
						sp.Attrs[kv.GetKey()] = v.StringValue
					case *commonv1.AnyValue_IntValue:
						sp.Attrs[kv.GetKey()] = v.IntValue
					case *commonv1.AnyValue_BoolValue:
						sp.Attrs[kv.GetKey()] = v.BoolValue
					}
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, e.GetName())
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// Spans returns what was received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}
