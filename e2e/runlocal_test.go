package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

// TestReadmeRunCommand runs the README's local fleet (`make run` is `make
// build` + scripts/run-local.sh), streams the README's curl request through
// it, then sends Ctrl-C (SIGINT to the foreground process group) and checks
// that every process the script started is gone. The "nats" variant is
// `make run-nats`: nats-server too, KV events over NATS.
func TestReadmeRunCommand(t *testing.T) {
	t.Run("http", func(t *testing.T) { runReadmeFleet(t, false) })
	t.Run("nats", func(t *testing.T) { runReadmeFleet(t, true) })
}

func runReadmeFleet(t *testing.T, nats bool) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is needed by scripts/run-local.sh: install it (apt-get install curl)")
	}
	port, etcdPort := testkit.FreePort(t), testkit.FreePort(t)
	script := exec.Command("bash", filepath.Join("..", "scripts", "run-local.sh"))
	script.Env = append(cleanEnv(),
		"INFERA_BIN="+binary,
		"INFERA_RUN_PORT="+strconv.Itoa(port),
		"INFERA_RUN_ETCD_PORT="+strconv.Itoa(etcdPort),
		"INFERA_RUN_STATE="+t.TempDir(),
	)
	procs := 5 // serve, 2 workers, 2 sims
	if nats {
		script.Env = append(script.Env, "INFERA_RUN_NATS=1", "INFERA_RUN_NATS_PORT="+strconv.Itoa(testkit.FreePort(t)))
		procs++ // nats-server
	}
	script.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var logs strings.Builder
	script.Stdout, script.Stderr = &logs, &logs
	if err := script.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- script.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-script.Process.Pid, syscall.SIGKILL)
	})

	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHealthyWorkers(t, base, 2, 60*time.Second, exited, &logs)

	// The README's curl, sent with net/http: a streamed chat completion.
	body := `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"Hello!"}]}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") == "" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("streamed completion: status %d content-type %q body %s", resp.StatusCode, resp.Header.Get("Content-Type"), data)
	}
	if err := checkStream(string(data)); err != nil {
		t.Fatalf("%v\n%s", err, data)
	}

	if nats {
		// kv-aware with both workers' KV events caught up over NATS.
		deadline := time.Now().Add(30 * time.Second)
		for caughtUp(base) < 2 {
			if time.Now().After(deadline) {
				t.Fatal("the workers' KV events did not catch up over NATS")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	started := descendants(script.Process.Pid)
	if len(started) < procs {
		t.Fatalf("expected %d processes (serve, two workers, two sims, nats-server with NATS) under the script, found pids %v", procs, started)
	}
	// Ctrl-C in a terminal signals the whole foreground process group.
	if err := syscall.Kill(-script.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("run-local.sh did not stop after Ctrl-C; output:\n%s", logs.String())
	}
	// The workers stop before the server holding the embedded etcd: both
	// deregister while it still runs (else their lease revoke fails).
	out := logs.String()
	_, stopping, _ := strings.Cut(out, "stopping the local fleet")
	beforeServer, _, _ := strings.Cut(stopping, "infera serve stopped")
	if n := strings.Count(beforeServer, "worker deregistered"); n != 2 || strings.Contains(out, "revoke worker lease failed") {
		t.Errorf("%d workers deregistered before the server stopped, want 2; output:\n%s", n, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		alive := alivePIDs(started)
		if len(alive) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left running after Ctrl-C: %v; output:\n%s", alive, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitHealthyWorkers(t *testing.T, base string, want int, timeout time.Duration, exited <-chan error, logs *strings.Builder) {
	t.Helper()
	f := &fleet{t: t, base: base}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			t.Fatalf("run-local.sh exited early (%v); output:\n%s", err, logs.String())
		default:
		}
		if w, err := f.workers(); err == nil && len(w) >= want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the local fleet did not come up with %d workers; output:\n%s", want, logs.String())
}

// descendants lists every live process below pid, read from /proc.
func descendants(root int) []int {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := readPPID(pid); ok {
			parent[pid] = ppid
		}
	}
	var out []int
	for pid := range parent {
		for p := parent[pid]; p > 1; p = parent[p] {
			if p == root {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

func readPPID(pid int) (int, bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	line, _ := bufio.NewReader(f).ReadString('\n')
	// The command name is in parentheses and may hold spaces: parse after ')'.
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(line[i+1:])
	if len(fields) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	return ppid, err == nil
}

// alivePIDs returns the pids that still exist and are not zombies.
func alivePIDs(pids []int) []int {
	var out []int
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(data)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z") {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// caughtUp counts the KV-event streams /metrics reports connected (over
// NATS: caught up).
func caughtUp(base string) int {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	n := 0
	for line := range strings.SplitSeq(string(text), "\n") {
		if strings.HasPrefix(line, "infera_router_kv_events_connected{") && strings.HasSuffix(line, " 1") {
			n++
		}
	}
	return n
}
