package e2e

import (
	"bufio"
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
	"go.uber.org/goleak"
)

// binary is the infera binary built once for the whole package by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "infera-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "infera")
	// As `make build` builds it (-trimpath, cgo off, default.pgo by -pgo=auto):
	// the binary tested is the one that ships, and TestStaticBuild's build of
	// the same flags shares its compiled packages.
	build := exec.Command("go", "build", "-trimpath", "-o", binary, "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building infera:", err)
		os.Exit(1)
	}
	code := m.Run()
	if n := reapStrays(dir); n > 0 {
		// Engines die with their workers (parent-death signal, shown by
		// TestWorkerSIGKILLTakesEngine, which does not rely on this), so
		// anything found here is a test that did not clean up; the package
		// still reaps it so that nothing outlives the run.
		fmt.Fprintf(os.Stderr, "e2e: killed %d processes the tests left behind\n", n)
	}
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: goroutine leak:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one infera process whose JSON log lines are kept for assertions.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	done chan struct{}

	mu    sync.Mutex
	lines []map[string]any
	raw   []string
	cond  *sync.Cond
	exit  error
}

// start launches `infera args...` in its own process group, so that a test
// signal reaches only that process, and stops it at the end of the test.
func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startEnv(t, name, cleanEnv(), args...)
}

// startEnv is start with an explicit environment.
func startEnv(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	return startBinary(t, binary, name, env, args...)
}

// startBinary is startEnv for another build of infera (the GPU build).
func startBinary(t *testing.T, bin, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.cmd = exec.Command(bin, args...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd.Env = env
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

// cleanEnv drops INFERA_* variables of the developer's shell so that only the
// flags a test passes configure the processes.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "INFERA_") {
			env = append(env, kv)
		}
	}
	return env
}

func (p *proc) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var fields map[string]any
		_ = json.Unmarshal([]byte(line), &fields)
		p.mu.Lock()
		p.raw = append(p.raw, line)
		if fields != nil {
			p.lines = append(p.lines, fields)
		}
		p.cond.Broadcast()
		p.mu.Unlock()
	}
	err := p.cmd.Wait()
	p.mu.Lock()
	p.exit = err
	p.mu.Unlock()
	close(p.done)
	p.mu.Lock()
	p.cond.Broadcast()
	p.mu.Unlock()
}

// waitLog returns the first log line whose "message" is msg, failing the test
// if it does not appear before the deadline or the process exits first.
func (p *proc) waitLog(msg string, timeout time.Duration) map[string]any {
	p.t.Helper()
	l, exited := p.waitLogOrExit(msg, timeout)
	if exited {
		p.t.Fatalf("%s exited (%v) before logging %q; log:\n%s", p.name, p.exit, msg, p.logText())
	}
	return l
}

// startRegistered starts a worker (args are infera's) and waits for it to
// register. A port the worker picked for its engine can be taken by another
// process before the engine binds it (engines/netaddr.go's freePortBlock):
// the engine fails, the worker exits and its supervisor starts it again —
// as this does, up to three starts, so that tests sharing a busy machine do
// not fail on another test's port.
func startRegistered(t *testing.T, name string, args ...string) (*proc, map[string]any) {
	t.Helper()
	for starts := 1; ; starts++ {
		p := start(t, name, args...)
		line, exited := p.waitLogOrExit("worker registered", 60*time.Second)
		if !exited {
			return p, line
		}
		log := p.logText()
		if starts < 3 && strings.Contains(log, "address already in use") {
			t.Logf("%s: a port picked for its engine was taken before the engine bound it; starting it again", name)
			continue
		}
		t.Fatalf("%s exited (%v) before logging %q; log:\n%s", name, p.exit, "worker registered", log)
	}
}

// waitLogOrExit is waitLog that reports an exit before msg (exited true)
// instead of failing the test.
func (p *proc) waitLogOrExit(msg string, timeout time.Duration) (line map[string]any, exited bool) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer timer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		for _, l := range p.lines {
			if l["message"] == msg {
				return l, false
			}
		}
		select {
		case <-p.done:
			return nil, true
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s did not log %q within %v; log:\n%s", p.name, msg, timeout, strings.Join(p.raw, "\n"))
		}
		p.cond.Wait()
	}
}

// logText returns the whole log so far, for failure messages.
func (p *proc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.raw, "\n")
}

func (p *proc) signal(sig syscall.Signal) {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

// wait waits for the process to exit and returns its exit error.
func (p *proc) wait(timeout time.Duration) error {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %v; log:\n%s", p.name, timeout, p.logText())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

func (p *proc) stop(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// fleet is one `infera serve` with its embedded etcd.
type fleet struct {
	t     *testing.T
	serve *proc
	base  string // http://127.0.0.1:PORT
	etcd  string // http://127.0.0.1:PORT
}

func startServe(t *testing.T, extra ...string) *fleet {
	t.Helper()
	// The embedded etcd's port is picked free and then bound by serve:
	// another process may take it in between (seen in CI: "bind: address
	// already in use"), and then serve starts again on another.
	var p *proc
	var line map[string]any
	var etcdPort int
	for try := 1; ; try++ {
		etcdPort = testkit.FreePort(t)
		args := append([]string{"serve", "--listen", "127.0.0.1:0",
			"--embedded-etcd-listen", fmt.Sprintf("127.0.0.1:%d", etcdPort),
			"--embedded-etcd-dir", filepath.Join(t.TempDir(), "etcd"),
			"--log-level", "debug"}, extra...)
		p = start(t, "serve", args...)
		var exited bool
		if line, exited = p.waitLogOrExit("infera serve listening", 60*time.Second); !exited {
			break
		}
		if try == 3 || !strings.Contains(p.logText(), "address already in use") {
			t.Fatalf("serve exited (%v) before logging %q; log:\n%s", p.exit, "infera serve listening", p.logText())
		}
	}
	addr, _ := line["addr"].(string)
	if addr == "" {
		t.Fatalf("serve listening line has no addr: %v", line)
	}
	return &fleet{t: t, serve: p, base: "http://" + addr, etcd: fmt.Sprintf("http://127.0.0.1:%d", etcdPort)}
}

// startWorker launches `infera worker --engine sim` against the fleet's etcd
// and waits for its registration; it returns the process and its worker id.
func (f *fleet) startWorker(name string, simArgs ...string) (*proc, string) {
	f.t.Helper()
	p, id, _ := f.startWorkerURL(name, simArgs...)
	return p, id
}

// startWorkerURL is startWorker that also returns the worker's URL.
func (f *fleet) startWorkerURL(name string, simArgs ...string) (*proc, string, string) {
	f.t.Helper()
	args := append([]string{"worker", "--engine", "sim", "--etcd-endpoints", f.etcd,
		"--lease-ttl", "5s", "--keepalive-interval", "1s", "--drain-timeout", "20s", "--stop-grace", "5s",
		"--", "--model", "sim-model"}, simArgs...)
	p, line := startRegistered(f.t, name, args...)
	id, _ := line["worker_id"].(string)
	if id == "" {
		f.t.Fatalf("worker registered line has no worker_id: %v", line)
	}
	url, _ := line["url"].(string)
	return p, id, url
}

// workers returns the ids currently listed by GET /v1/workers.
func (f *fleet) workers() (map[string]string, error) {
	resp, err := http.Get(f.base + "/v1/workers")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/workers: %d %s", resp.StatusCode, body)
	}
	records, err := decodeWorkers(body)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(records))
	for _, r := range records {
		status := r.Status
		if status == "" {
			status = "active"
		}
		out[r.WorkerID] = status
	}
	return out, nil
}

type workerRecord struct {
	WorkerID string `json:"worker_id"`
	Status   string `json:"status"`
}

// decodeWorkers accepts either a bare array of records or an object holding
// them under "workers" or "data".
func decodeWorkers(body []byte) ([]workerRecord, error) {
	var list []workerRecord
	if err := json.Unmarshal(body, &list); err == nil {
		return list, nil
	}
	var wrapped struct {
		Workers []workerRecord `json:"workers"`
		Data    []workerRecord `json:"data"`
	}
	if err := json.Unmarshal(body, &wrapped); err != nil {
		return nil, fmt.Errorf("decode /v1/workers %q: %w", body, err)
	}
	if wrapped.Workers != nil {
		return wrapped.Workers, nil
	}
	return wrapped.Data, nil
}

// waitWorkers polls until cond holds on the server's worker list.
func (f *fleet) waitWorkers(what string, timeout time.Duration, cond func(map[string]string) bool) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	var last map[string]string
	var lastErr error
	for time.Now().Before(deadline) {
		last, lastErr = f.workers()
		if lastErr == nil && cond(last) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.t.Fatalf("waiting for %s: workers=%v err=%v", what, last, lastErr)
}

// chat sends one chat completion and returns the status, serving worker and body.
func chat(ctx context.Context, base string, stream bool, content string, maxTokens int) (int, string, string, error) {
	body := fmt.Sprintf(`{"model":"sim-model","stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, stream, maxTokens, content)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, resp.Header.Get("X-Infera-Worker"), string(data), err
	}
	return resp.StatusCode, resp.Header.Get("X-Infera-Worker"), string(data), nil
}

// checkStream verifies an SSE body: chat chunks and a final [DONE].
func checkStream(body string) error {
	if !strings.HasSuffix(strings.TrimRight(body, "\n"), "data: [DONE]") {
		return errors.New("stream does not end with data: [DONE]")
	}
	chunks := 0
	for _, ev := range strings.Split(body, "\n\n") {
		ev = strings.TrimSpace(ev)
		if ev == "" || ev == "data: [DONE]" {
			continue
		}
		payload, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			return fmt.Errorf("event without data: %q", ev)
		}
		var chunk struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(payload), &chunk); err != nil {
			return fmt.Errorf("bad chunk %q: %w", payload, err)
		}
		if chunk.Object != "chat.completion.chunk" {
			return fmt.Errorf("chunk object %q", chunk.Object)
		}
		chunks++
	}
	if chunks == 0 {
		return errors.New("stream has no chunks")
	}
	return nil
}

// cacheViewResponse is GET /v1/admin/cache-view/{worker_id}.
type cacheViewResponse struct {
	WorkerID   string `json:"worker_id"`
	DPRank     int    `json:"dp_rank"`
	BlockCount int    `json:"block_count"`
	Mode       string `json:"mode"`
}

func (f *fleet) cacheView(workerID string) (cacheViewResponse, error) {
	var view cacheViewResponse
	resp, err := http.Get(f.base + "/v1/admin/cache-view/" + workerID)
	if err != nil {
		return view, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return view, err
	}
	if resp.StatusCode != http.StatusOK {
		return view, fmt.Errorf("cache-view %s: %d %s", workerID, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, &view); err != nil {
		return view, fmt.Errorf("decode cache-view %q: %w", body, err)
	}
	return view, nil
}

// reapStrays SIGKILLs every process still running from dir (the binary the
// package built and anything started through it) and returns how many.
func reapStrays(dir string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(string(cmdline), dir+string(os.PathSeparator)) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}
