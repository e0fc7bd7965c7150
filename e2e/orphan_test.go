package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

// pidGone reports whether pid no longer runs (or is a zombie, which holds
// no port any more).
func pidGone(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// TestWorkerSIGKILLTakesEngine: a worker killed with SIGKILL (no chance to
// stop its engine) takes its engine with it at once (parent-death signal),
// and the same worker command started again binds the same port and serves.
// The test waits for the engine itself; it does not rely on TestMain's
// reaping of stray processes.
func TestWorkerSIGKILLTakesEngine(t *testing.T) {
	f := startServe(t)
	port := testkit.FreePort(t)
	runtimeDir := filepath.Join(t.TempDir(), "run")
	args := []string{"worker", "--engine", "sim", "--etcd-endpoints", f.etcd, "--runtime-dir", runtimeDir,
		"--lease-ttl", "5s", "--keepalive-interval", "1s", "--stop-grace", "5s",
		"--", "--model", "sim-model", "--port", strconv.Itoa(port)}
	w := start(t, "worker", args...)
	w.waitLog("worker registered", 60*time.Second)
	pid := enginePID(t, w)
	if _, err := os.Stat(filepath.Join(runtimeDir, fmt.Sprintf("engine-%d.pid", port))); err != nil {
		t.Fatalf("no engine pidfile: %v", err)
	}

	if err := syscall.Kill(w.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = w.wait(10 * time.Second)
	killed := time.Now()
	// The acceptance bound: the engine is gone within 2 s of the worker.
	for !pidGone(pid) {
		if time.Since(killed) > 2*time.Second {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			t.Fatalf("engine %d still runs 2 s after its worker was SIGKILLed", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}

	w2 := start(t, "worker-again", args...)
	w2.waitLog("worker registered", 60*time.Second)
	if pid2 := enginePID(t, w2); pid2 == pid {
		t.Fatalf("restarted worker reports the old engine pid %d", pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, _, body, err := chat(ctx, f.base, false, "hello again", 8)
	if err != nil || code != 200 {
		t.Fatalf("chat after restart: %d %v %s", code, err, body)
	}
	w2.stop(syscall.SIGTERM)
	if !pidGone(enginePID(t, w2)) {
		t.Fatal("engine of the stopped worker still runs")
	}
}

// TestWorkerNamesPortHolder: a worker whose engine port is taken by a
// process that is not an engine it left behind fails at once, naming the
// pid that holds the port, instead of an engine's "address already in use".
func TestWorkerNamesPortHolder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	w := start(t, "worker", "worker", "--engine", "sim", "--etcd-endpoints", "http://127.0.0.1:1",
		"--runtime-dir", t.TempDir(), "--", "--model", "sim-model", "--port", strconv.Itoa(port))
	err = w.wait(30 * time.Second)
	if err == nil {
		t.Fatal("worker started although its port is taken")
	}
	want := fmt.Sprintf("held by pid %d", os.Getpid())
	if log := w.logText(); !strings.Contains(log, want) {
		t.Fatalf("worker log does not say %q:\n%s", want, log)
	}
}
