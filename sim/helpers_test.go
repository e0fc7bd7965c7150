package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/servetest"
)

// testSim is an in-process sim on a free port with its own HTTP client.
type testSim struct {
	srv    *Server
	url    string
	client *http.Client
	stop   func() error // stops the server once; returns Serve's error
}

// startSim starts a zero-latency sim (unless edit changes the time scale)
// and stops it when the test ends.
func startSim(t testing.TB, edit func(*config.Sim), opts ...Option) *testSim {
	t.Helper()
	cfg := config.DefaultSim()
	cfg.Port = 0
	cfg.TimeScale = 0
	if edit != nil {
		edit(&cfg)
	}
	srv, err := New(cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	tr := &http.Transport{}
	// Close the client's idle connections before the server stops (one it
	// dialed but never used counts as busy for fasthttp's Shutdown until it
	// is 5s old, as long as the shutdown grace) and after.
	t.Cleanup(tr.CloseIdleConnections)
	served := servetest.Start(t, "sim", ln, srv.Serve)
	t.Cleanup(tr.CloseIdleConnections)
	ts := &testSim{srv: srv, url: "http://" + ln.Addr().String(), client: &http.Client{Transport: tr}, stop: served.Stop}
	select {
	case <-srv.Ready():
	case <-served.Done():
		t.Fatalf("Serve: %v", served.Err())
	}
	if srv.Addr() != ln.Addr().String() {
		t.Fatalf("Addr() = %q once ready, want %q", srv.Addr(), ln.Addr().String())
	}
	return ts
}

// post sends a JSON body and returns the status and body.
func (ts *testSim) post(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	resp, err := ts.client.Post(ts.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return resp.StatusCode, b
}

func (ts *testSim) get(t *testing.T, path string) (int, []byte) {
	t.Helper()
	resp, err := ts.client.Get(ts.url + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return resp.StatusCode, b
}

// postJSON posts and decodes a 200 answer into a generic map.
func (ts *testSim) postJSON(t *testing.T, path, body string) map[string]any {
	t.Helper()
	code, b := ts.post(t, path, body)
	if code != http.StatusOK {
		t.Fatalf("POST %s: status %d: %s", path, code, b)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("POST %s: %v: %s", path, err, b)
	}
	return m
}

// stream opens a streamed request and returns the live response.
func (ts *testSim) stream(t *testing.T, ctx context.Context, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("POST %s: status %d: %s", path, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != contentSSE {
		t.Fatalf("content type %q", ct)
	}
	return resp
}

// sseReader reads "data: ..." events.
type sseReader struct{ r *bufio.Reader }

// next returns the next event's data, or an error (io.EOF at a clean end).
func (s *sseReader) next() (string, error) {
	var data string
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line != "" {
				return "", io.ErrUnexpectedEOF
			}
			return "", err
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			return data, nil
		}
		if !strings.HasPrefix(line, "data: ") {
			return "", errors.New("unexpected SSE line " + line)
		}
		data = strings.TrimPrefix(line, "data: ")
	}
}

// readAll reads events until the body ends; it returns the events and the
// error that ended the body (nil after a clean end).
func readAllEvents(body io.Reader) ([]string, error) {
	r := &sseReader{r: bufio.NewReader(body)}
	var events []string
	for {
		ev, err := r.next()
		if errors.Is(err, io.EOF) {
			return events, nil
		}
		if err != nil {
			return events, err
		}
		events = append(events, ev)
	}
}

// metrics scrapes /metrics with the Prometheus text parser.
func (ts *testSim) metrics(t *testing.T) map[string]*dto {
	t.Helper()
	code, b := ts.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: status %d", code)
	}
	var parser expfmt.TextParser
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, b)
	}
	out := make(map[string]*dto, len(fams))
	for name, f := range fams {
		if len(f.Metric) != 1 {
			t.Fatalf("%s: %d series", name, len(f.Metric))
		}
		m := f.Metric[0]
		d := &dto{labels: map[string]string{}}
		for _, l := range m.Label {
			d.labels[l.GetName()] = l.GetValue()
		}
		switch {
		case m.Gauge != nil:
			d.value = m.Gauge.GetValue()
		case m.Counter != nil:
			d.value = m.Counter.GetValue()
		case m.Untyped != nil:
			d.value = m.Untyped.GetValue()
		}
		out[name] = d
	}
	return out
}

type dto struct {
	labels map[string]string
	value  float64
}

// gauge returns one metric's value.
func (ts *testSim) gauge(t *testing.T, name string) float64 {
	t.Helper()
	m, ok := ts.metrics(t)[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
	return m.value
}

// chatBody builds a chat request body.
func chatBody(t *testing.T, extra map[string]any, user string) string {
	t.Helper()
	m := map[string]any{
		"model":    "sim-model",
		"messages": []map[string]any{{"role": "user", "content": user}},
	}
	for k, v := range extra {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func complBody(t *testing.T, extra map[string]any, prompt any) string {
	t.Helper()
	m := map[string]any{"model": "sim-model", "prompt": prompt}
	for k, v := range extra {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func newBufReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
