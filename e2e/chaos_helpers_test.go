package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

// Helpers of the issue-5 e2e tests (chaos, etcd outage, bad input, auth).

// startExe is startEnv for a program other than infera (the etcd server):
// its own process group, stderr lines kept (JSON ones decoded), killed at
// the end of the test.
func startExe(t *testing.T, name, path string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.cmd = exec.Command(path, args...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd.Env = cleanEnv()
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go p.read(stderr)
	t.Cleanup(func() { p.stop(syscall.SIGKILL) })
	return p
}

// etcdServer is a real etcd server process (Debian's etcd-server) on fixed
// loopback ports and data directory, so that it can be killed and restarted
// as the same member.
type etcdServer struct {
	t          *testing.T
	bin        string
	dir        string
	clientPort int
	peerPort   int
	p          *proc
	// name and cluster are the member's name and --initial-cluster in a
	// cluster of several (startEtcdCluster); empty for a single server.
	name, cluster string
}

// newEtcdServer finds the etcd binary and picks ports and a data directory;
// it fails the test with the install hint when etcd is missing.
func newEtcdServer(t *testing.T) *etcdServer {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatalf("the etcd server binary is not installed (%v): run .ci/run, or apt-get install etcd-server", err)
	}
	return &etcdServer{t: t, bin: bin, dir: filepath.Join(t.TempDir(), "etcd"), clientPort: testkit.FreePort(t), peerPort: testkit.FreePort(t)}
}

func (e *etcdServer) endpoint() string { return fmt.Sprintf("http://127.0.0.1:%d", e.clientPort) }

// start launches etcd and waits until it answers /health. On its first
// start a port picked for it may be taken by another process before etcd
// binds it (testkit.FreePort closes the port it found; seen in CI): etcd
// exits, and start tries again on other ports, up to three times. A
// restart keeps its ports, as a restarted member must.
func (e *etcdServer) start(timeout time.Duration) {
	e.t.Helper()
	first := e.p == nil
	for try := 1; ; try++ {
		e.launch()
		if e.awaitHealthy(timeout) {
			return
		}
		if !first || try == 3 || !e.portTaken() {
			e.t.Fatalf("etcd exited before it was healthy; log:\n%s", e.p.logText())
		}
		e.t.Logf("etcd: a port picked for it was taken before it bound it; starting it again on others")
		e.clientPort, e.peerPort = testkit.FreePort(e.t), testkit.FreePort(e.t)
		e.dir = filepath.Join(e.t.TempDir(), "etcd")
	}
}

// portTaken reports whether etcd's log says a port it was to listen on was
// already bound.
func (e *etcdServer) portTaken() bool {
	return strings.Contains(e.p.logText(), "address already in use")
}

func (e *etcdServer) peerURL() string { return fmt.Sprintf("http://127.0.0.1:%d", e.peerPort) }

// launch starts the etcd process without waiting for it: a cluster's
// members are healthy only once a quorum of them runs.
func (e *etcdServer) launch() {
	e.t.Helper()
	name, cluster := e.name, e.cluster
	if name == "" {
		name, cluster = "infera-e2e", "infera-e2e="+e.peerURL()
	}
	e.p = startExe(e.t, "etcd-"+name, e.bin,
		"--name", name,
		"--data-dir", e.dir,
		"--listen-client-urls", e.endpoint(),
		"--advertise-client-urls", e.endpoint(),
		"--listen-peer-urls", e.peerURL(),
		"--initial-advertise-peer-urls", e.peerURL(),
		"--initial-cluster", cluster,
		"--initial-cluster-token", "infera-e2e",
		"--logger", "zap", "--log-outputs", "stderr")
}

// awaitHealthy waits until etcd answers /health (true) or exits (false);
// it fails the test when etcd neither answers nor exits within timeout.
func (e *etcdServer) awaitHealthy(timeout time.Duration) bool {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-e.p.done:
			return false
		default:
		}
		if lastErr = e.healthy(); lastErr == nil {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("etcd not healthy within %v (%v); log:\n%s", timeout, lastErr, e.p.logText())
	return false
}

// healthClient bounds a /health probe: the port may belong to another
// process's listener that never answers (see start).
var healthClient = &http.Client{Timeout: 2 * time.Second}

func (e *etcdServer) healthy() error {
	resp, err := healthClient.Get(e.endpoint() + "/health")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"true"`)) {
		return fmt.Errorf("etcd /health: %d %s", resp.StatusCode, body)
	}
	return nil
}

// kill SIGKILLs etcd and waits until it is gone.
func (e *etcdServer) kill() {
	e.t.Helper()
	if err := syscall.Kill(e.p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		e.t.Fatalf("kill etcd: %v", err)
	}
	_ = e.p.wait(10 * time.Second)
}

// workerArgs are the arguments of startWorker for a worker registering in
// the etcd at endpoint, for tests that start it without waiting.
func workerArgs(endpoint string, simArgs ...string) []string {
	return append([]string{"worker", "--engine", "sim", "--etcd-endpoints", endpoint,
		"--lease-ttl", "5s", "--keepalive-interval", "1s", "--drain-timeout", "20s", "--stop-grace", "5s",
		"--", "--model", "sim-model"}, simArgs...)
}

// bgBench is an `infera bench` run in the background. Unlike runBench it
// never fails the test from its own goroutine: wait reports everything.
type bgBench struct {
	out    string
	cmd    *exec.Cmd
	done   chan struct{}
	output []byte
	err    error
}

func startBench(t *testing.T, args ...string) *bgBench {
	t.Helper()
	b := &bgBench{out: filepath.Join(t.TempDir(), "report.json"), done: make(chan struct{})}
	b.cmd = exec.CommandContext(t.Context(), binary, append([]string{"bench", "--json", b.out, "--progress=false"}, args...)...)
	b.cmd.Env = cleanEnv()
	var buf bytes.Buffer
	b.cmd.Stdout, b.cmd.Stderr = &buf, &buf
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("start bench: %v", err)
	}
	go func() {
		b.err = b.cmd.Wait()
		b.output = buf.Bytes()
		close(b.done)
	}()
	t.Cleanup(func() {
		select {
		case <-b.done:
		default:
			_ = b.cmd.Process.Kill()
			<-b.done
		}
	})
	return b
}

// wait returns the report, the bench's text output and its exit error; the
// test fails if the run does not end within timeout (a hung request).
func (b *bgBench) wait(t *testing.T, timeout time.Duration) (benchReport, string, error) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(timeout):
		_ = b.cmd.Process.Kill()
		<-b.done
		t.Fatalf("infera bench did not finish within %v (a request hung?):\n%s", timeout, b.output)
	}
	var rep benchReport
	data, err := os.ReadFile(b.out)
	if err != nil {
		t.Fatalf("infera bench wrote no report (%v): %v\n%s", b.err, err, b.output)
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("bad bench report: %v\n%s", err, data)
	}
	return rep, string(b.output), b.err
}

// httpResult is one raw HTTP exchange.
type httpResult struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request with the given headers and reads the whole answer.
func do(ctx context.Context, method, url string, body []byte, headers map[string]string) (httpResult, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return httpResult{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return httpResult{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return httpResult{status: resp.StatusCode, header: resp.Header, body: data}, err
}

// chatBody is a small valid chat request.
func chatBody(stream bool, content string, maxTokens int) []byte {
	return fmt.Appendf(nil, `{"model":"sim-model","stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, stream, maxTokens, content)
}

// apiError is the OpenAI error envelope. Code stays raw: OpenAI sends a
// string or null, vLLM (whose 4xx the router passes through) a number.
type apiError struct {
	Error *struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
	} `json:"error"`
}

// checkEnvelope says what is wrong with an error answer: its status, its
// JSON envelope, and (when wantCode is set) its code.
func checkEnvelope(res httpResult, wantStatus int, wantCode string) error {
	if res.status != wantStatus {
		return fmt.Errorf("status %d, want %d; body %s", res.status, wantStatus, clipBody(res.body))
	}
	var e apiError
	if err := json.Unmarshal(res.body, &e); err != nil || e.Error == nil {
		return fmt.Errorf("body is not an OpenAI error envelope (%v): %s", err, clipBody(res.body))
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		return fmt.Errorf("envelope lacks message or type: %s", clipBody(res.body))
	}
	if wantCode != "" && string(e.Error.Code) != strconv.Quote(wantCode) {
		return fmt.Errorf("error code %s, want %q; body %s", e.Error.Code, wantCode, clipBody(res.body))
	}
	if ct := res.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return fmt.Errorf("content type %q, want application/json", ct)
	}
	return nil
}

func clipBody(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

// engineLoad reads vllm:num_requests_running + waiting from a sim engine's
// /metrics (the worker id is the engine's host:port).
func engineLoad(workerID string) (float64, error) {
	res, err := do(context.Background(), http.MethodGet, "http://"+workerID+"/metrics", nil, nil)
	if err != nil {
		return 0, err
	}
	total := 0.0
	sc := bufio.NewScanner(bytes.NewReader(res.body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "vllm:num_requests_running") && !strings.HasPrefix(line, "vllm:num_requests_waiting") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics line %q: %w", line, err)
		}
		total += v
	}
	return total, nil
}

// streamOutcome is how one streamed request ended.
type streamOutcome struct {
	status     int
	worker     string // X-Infera-Worker
	requestID  string // X-Request-Id: the request_id of serve's log lines
	done       bool   // saw data: [DONE]
	errorEvent string // the message of an in-stream error event
	chunks     int
	text       string // the content the chunks carried, in order
	end        time.Time
	err        error // transport error (reset, timeout)
}

// probeStream streams a chat completion through base and records how it
// ends; started is closed once the first content event arrived.
func probeStream(ctx context.Context, base, content string, maxTokens int, started chan<- struct{}) streamOutcome {
	var out streamOutcome
	signal := func() {
		if started != nil {
			close(started)
			started = nil
		}
	}
	defer signal()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(chatBody(true, content, maxTokens)))
	if err != nil {
		out.err = err
		return out
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		out.err, out.end = err, time.Now()
		return out
	}
	defer resp.Body.Close()
	out.status = resp.StatusCode
	out.worker = resp.Header.Get("X-Infera-Worker")
	out.requestID = resp.Header.Get("X-Request-Id")
	rd := bufio.NewReader(resp.Body)
	var text strings.Builder
	defer func() { out.text = text.String() }()
	for {
		line, err := rd.ReadString('\n')
		if payload, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			switch {
			case payload == "[DONE]":
				out.done = true
			case strings.HasPrefix(payload, `{"error"`):
				var e apiError
				if json.Unmarshal([]byte(payload), &e) == nil && e.Error != nil {
					out.errorEvent = e.Error.Message
				} else {
					out.errorEvent = payload
				}
			default:
				out.chunks++
				var c struct {
					Choices []struct {
						Delta struct{ Content string }
					}
				}
				if json.Unmarshal([]byte(payload), &c) == nil {
					for _, ch := range c.Choices {
						text.WriteString(ch.Delta.Content)
					}
				}
				signal()
			}
		}
		if err != nil {
			out.end = time.Now()
			if !errors.Is(err, io.EOF) {
				out.err = err
			}
			return out
		}
	}
}

// scrape returns the text of url (a /metrics page); a failed GET fails
// the test.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// waitMetric waits up to 10 s for metric name on the /metrics page of
// admin (host:port) to read want; what the test waits for is what.
func waitMetric(t *testing.T, admin, name string, want float64, what string) {
	t.Helper()
	url := "http://" + admin + "/metrics"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got := metricValue(scrape(t, url), name)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s is %v, want %v", what, name, got, want)
		}
	}
}

// metricValue sums the samples of one metric family (all label sets whose
// labels contain every filter) in a Prometheus text exposition.
func metricValue(text, name string, filters ...string) float64 {
	total := 0.0
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name) || len(line) == len(name) || (line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		match := true
		for _, f := range filters {
			if !strings.Contains(line, f) {
				match = false
			}
		}
		if !match {
			continue
		}
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			total += v
		}
	}
	return total
}
