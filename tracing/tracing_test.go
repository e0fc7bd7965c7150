package tracing_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/tracing"
	"github.com/infera/infera/tracing/tracingtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Spans started through the API reach a real OTLP/gRPC receiver with their
// parents, attributes and events; the injected traceparent is the leg's,
// and a client's traceparent becomes the root's parent.
func TestExportToReceiver(t *testing.T) {
	rcv := tracingtest.Start(t)
	tr, err := tracing.New(t.Context(), tracing.Config{Endpoint: rcv.Endpoint, SampleRatio: 1, BatchTimeout: 50 * time.Millisecond})
	if err != nil || tr == nil {
		t.Fatalf("New: %v %v", tr, err)
	}
	in := http.Header{}
	in.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	at := time.Now()
	root := tr.StartRoot(header(in), "POST /v1/chat/completions", at)
	leg := tr.Start(root, "leg", at, true)
	leg.String("infera.worker_id", "w1")
	leg.Int("http.response.status_code", 200)
	leg.Bool("infera.ok", true)
	out := http.Header{}
	tr.Inject(leg, header(out))
	leg.End(time.Now())
	root.Event("first_token", time.Now())
	root.Fail("upstream_error", errors.New("boom"))
	root.End(time.Now())
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := "00-0af7651916cd43dd8448eb211c80319c-" + leg.SpanID() + "-01"
	if got := out.Get("traceparent"); got != want || root.TraceID() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("traceparent %q, want %q (root trace %s)", got, want, root.TraceID())
	}
	testkit.Eventually(t, "two spans", func() bool { return len(rcv.Spans()) == 2 })
	spans := map[string]tracingtest.Span{}
	for _, s := range rcv.Spans() {
		spans[s.Name] = s
	}
	r, l := spans["POST /v1/chat/completions"], spans["leg"]
	if r.Parent != "b7ad6b7169203331" || r.Service != "infera" || !r.Error || len(r.Events) == 0 || r.Events[0] != "first_token" {
		t.Fatalf("root %+v", r)
	}
	if l.Parent != r.SpanID || l.TraceID != r.TraceID || l.Attrs["infera.worker_id"] != "w1" || l.Attrs["http.response.status_code"] != int64(200) || l.Attrs["infera.ok"] != true {
		t.Fatalf("leg %+v", l)
	}
}

// Off: no tracer, no span, nothing allocated.
func TestOffAllocatesNothing(t *testing.T) {
	tr, err := tracing.New(t.Context(), tracing.Config{})
	if tr != nil || err != nil {
		t.Fatalf("New without endpoint: %v %v", tr, err)
	}
	h := http.Header{}
	now := time.Now()
	n := testing.AllocsPerRun(100, func() {
		s := tr.StartRoot(header(h), "r", now)
		c := tr.Start(s, "leg", now, true)
		c.String("k", "v")
		c.Int("n", 1)
		c.Bool("b", true)
		c.Event("e", now)
		c.Fail("x", nil)
		tr.Inject(c, header(h))
		c.End(now)
		s.End(now)
		if s.On() || c.Recording() || s.TraceID() != "" {
			t.Fatal("a span while off")
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations with tracing off", n)
	}
	if err := tr.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A ratio of 0 samples nothing new, but the context still propagates; a
// sampled parent is followed.
func TestSampling(t *testing.T) {
	rcv := tracingtest.Start(t)
	tr, err := tracing.New(t.Context(), tracing.Config{Endpoint: rcv.Endpoint, SampleRatio: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tr.Shutdown(context.Background()) }()
	s := tr.StartRoot(nil, "r", time.Now())
	out := http.Header{}
	tr.Inject(s, header(out))
	if !s.On() || s.Recording() || !strings.HasSuffix(out.Get("traceparent"), "-00") {
		t.Fatalf("unsampled root: on %v recording %v traceparent %q", s.On(), s.Recording(), out.Get("traceparent"))
	}
	in := http.Header{}
	in.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	if s := tr.StartRoot(header(in), "r", time.Now()); !s.Recording() {
		t.Fatal("a sampled parent was not followed")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []tracing.Config{
		{Endpoint: "localhost:4317", SampleRatio: 1},
		{Endpoint: "grpc://h:4317", SampleRatio: 1},
		{Endpoint: "http://h", SampleRatio: 1},
		{Endpoint: "http://h:4317", SampleRatio: 1.5},
		{SampleRatio: -0.1},
	} {
		if _, err := tracing.New(t.Context(), c); !errors.Is(err, tracing.ErrConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// header adapts http.Header to tracing.Header.
type header http.Header

func (h header) Peek(k string) []byte { return []byte(http.Header(h).Get(k)) }
func (h header) Set(k, v string)      { http.Header(h).Set(k, v) }
