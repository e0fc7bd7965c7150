package e2e

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/infera/infera/internal/natstest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/natsreq"
)

// natsPost sends one request to the router and returns its status, the
// worker that answered and the body.
func natsPost(t *testing.T, base, path, body string) (int, string, string) {
	t.Helper()
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("X-Infera-Worker"), string(b)
}

// natsMonitor counts the envelopes published on the request subjects and
// the inboxes published on the cancel subjects: a plain subscriber beside
// the workers' (core NATS delivers to both; it answers nothing).
type natsMonitor struct {
	requests, cancels atomic.Int64
}

func monitorNATS(t *testing.T, url string) *natsMonitor {
	t.Helper()
	nc, err := natsgo.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	m := &natsMonitor{}
	if _, err := nc.Subscribe(natsreq.SubjectPrefix+".>", func(*natsgo.Msg) { m.requests.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe(natsreq.CancelPrefix+".>", func(*natsgo.Msg) { m.cancels.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return m
}

// simRunning reads the running-requests gauge of the sim behind a worker
// (its worker id is the engine's host:port).
func simRunning(t *testing.T, workerID string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + workerID + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "vllm:num_requests_running") {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err == nil {
				return v
			}
		}
	}
	t.Fatalf("no vllm:num_requests_running in the sim's /metrics")
	return 0
}

// TestRequestsOverNATS (issue 33, acceptance 1 in part): serve and two sim
// workers with --request-transport nats on a real nats-server: unary and
// streamed chat, completions and Anthropic messages are answered by both
// workers, every request travelled as an envelope on a request subject,
// and a client that leaves a stream cancels the engine's request.
func TestRequestsOverNATS(t *testing.T) {
	ns := natstest.Start(t)
	mon := monitorNATS(t, ns.URL())
	natsFlags := []string{"--request-transport", "nats", "--nats-server", ns.URL()}
	f := startServe(t, natsFlags...)
	slow := []string{"--time-scale", "1", "--decode-ms-per-token", "10"}
	p1, id1 := f.startWorkerFlags("nats-worker-1", natsFlags, slow...)
	defer p1.stop(syscall.SIGTERM)
	p2, id2 := f.startWorkerFlags("nats-worker-2", natsFlags, slow...)
	defer p2.stop(syscall.SIGTERM)
	f.waitWorkers("both nats workers active", 30*time.Second, func(w map[string]string) bool {
		return w[id1] == "active" && w[id2] == "active"
	})

	const chat = `{"model":"sim-model","max_tokens":6,"messages":[{"role":"user","content":"hi"}]}`
	seen := map[string]int{}
	sent := int64(0)
	testkit.Eventually(t, "a routed chat", func() bool {
		status, _, _ := natsPost(t, f.base, "/v1/chat/completions", chat)
		if status != http.StatusOK {
			return false
		}
		sent++
		return true
	})
	for i := range 4 {
		status, w, body := natsPost(t, f.base, "/v1/chat/completions", chat)
		if status != http.StatusOK || !strings.Contains(body, `"chat.completion"`) {
			t.Fatalf("chat %d: %d %s", i, status, body)
		}
		seen[w]++
		status, w, body = natsPost(t, f.base, "/v1/completions", `{"model":"sim-model","prompt":"hello","max_tokens":4}`)
		if status != http.StatusOK || !strings.Contains(body, `"text_completion"`) {
			t.Fatalf("completion %d: %d %s", i, status, body)
		}
		seen[w]++
		status, w, body = natsPost(t, f.base, "/v1/messages", `{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
		if status != http.StatusOK || !strings.Contains(body, `"type":"message"`) {
			t.Fatalf("anthropic %d: %d %s", i, status, body)
		}
		seen[w]++
		resp, err := http.Post(f.base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"sim-model","stream":true,"max_tokens":6,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") ||
			!strings.Contains(string(b), "chat.completion.chunk") || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Fatalf("stream %d: %d %q", i, resp.StatusCode, b)
		}
		seen[resp.Header.Get("X-Infera-Worker")]++
		sent += 4
	}
	if seen[id1] == 0 || seen[id2] == 0 || len(seen) != 2 {
		t.Fatalf("requests by worker %v", seen)
	}
	testkit.Eventually(t, "every request on a request subject", func() bool { return mon.requests.Load() >= sent })

	// A client that leaves a stream cancels the engine's request.
	resp, err := http.Post(f.base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"sim-model","stream":true,"max_tokens":5000,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	w := resp.Header.Get("X-Infera-Worker")
	r := bufio.NewReader(resp.Body)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q %v", line, err)
	}
	if simRunning(t, w) != 1 {
		t.Fatalf("the engine of %s runs %v requests, want 1", w, simRunning(t, w))
	}
	resp.Body.Close()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	testkit.Eventually(t, "the engine's request cancelled", func() bool { return simRunning(t, w) == 0 })
	testkit.Eventually(t, "the cancel published", func() bool { return mon.cancels.Load() >= 1 })
}

// TestRequestsOverNATSMixedFleet (issue 33, acceptance 3 in part): one
// worker on HTTP, one on NATS, same model, one router: both get requests.
func TestRequestsOverNATSMixedFleet(t *testing.T) {
	ns := natstest.Start(t)
	mon := monitorNATS(t, ns.URL())
	f := startServe(t, "--request-transport", "nats", "--nats-server", ns.URL())
	ph, idHTTP := f.startWorkerFlags("http-worker", nil)
	defer ph.stop(syscall.SIGTERM)
	pn, idNATS := f.startWorkerFlags("nats-worker", []string{"--request-transport", "nats", "--nats-server", ns.URL()})
	defer pn.stop(syscall.SIGTERM)
	f.waitWorkers("both workers active", 30*time.Second, func(w map[string]string) bool {
		return w[idHTTP] == "active" && w[idNATS] == "active"
	})
	seen := map[string]int{}
	for i := range 8 {
		status, w, body := natsPost(t, f.base, "/v1/chat/completions", `{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
		if status != http.StatusOK {
			t.Fatalf("chat %d: %d %s", i, status, body)
		}
		seen[w]++
	}
	if seen[idHTTP] == 0 || seen[idNATS] == 0 || len(seen) != 2 {
		t.Fatalf("requests by worker %v", seen)
	}
	testkit.Eventually(t, "one envelope per request to the NATS worker", func() bool { return mon.requests.Load() == int64(seen[idNATS]) })
}

// TestPDOverNATSEndToEnd (issue 33, acceptance 1, PD): serve and a PD pair
// of workers with --request-transport nats, for the concurrent protocols
// (sglang-bootstrap, vllm-mooncake): unary and streamed answers, both legs
// as envelopes on the workers' request subjects, the bodies as the
// protocol shapes them, the decode verifying the prefill's KV.
func TestPDOverNATSEndToEnd(t *testing.T) {
	for _, proto := range pdProtos {
		if proto.name != "sglang-bootstrap" && proto.name != "vllm-mooncake" {
			continue
		}
		t.Run(proto.name, func(t *testing.T) {
			ns := natstest.Start(t)
			mon := monitorNATS(t, ns.URL())
			natsFlags := []string{"--request-transport", "nats", "--nats-server", ns.URL()}
			f := startServe(t, natsFlags...)
			p1 := f.startPDWorkerFlags(t, proto, "prefill", proto.engine+"-nats-p1", natsFlags)
			d1 := f.startPDWorkerFlags(t, proto, "decode", proto.engine+"-nats-d1", natsFlags)
			status, ph, dh, body := pdDoProto(t, f, proto, "explain disaggregated prefill and decode", false, 6)
			if status != 200 || ph != p1.id || dh != d1.id || strings.Contains(body, `"error"`) {
				t.Fatalf("unary: %d via %s/%s: %s", status, ph, dh, body)
			}
			checkLegs(t, proto.name, []*pdWorker{p1}, d1, false)
			status, _, _, body = pdDoProto(t, f, proto, "explain disaggregated prefill and decode", true, 6)
			if status != 200 || !strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]") || strings.Contains(body, `"error"`) {
				t.Fatalf("stream: %d %s", status, body)
			}
			checkLegs(t, proto.name, []*pdWorker{p1}, d1, true)
			checkVerified(t, d1)
			testkit.Eventually(t, "both legs of both requests over NATS", func() bool { return mon.requests.Load() == 4 })
		})
	}
}
