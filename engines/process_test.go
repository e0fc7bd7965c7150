package engines

import (
	"context"
	"errors"
	"fmt"
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

// script writes a /bin/sh script into a temporary directory and returns a
// Command that runs it.
func script(t *testing.T, body string) Command {
	t.Helper()
	path := filepath.Join(t.TempDir(), "engine.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return Command{Name: "test", Path: "/bin/sh", Args: []string{path}}
}

// stopOnCleanup makes sure no test leaves its child behind, whatever fails.
func stopOnCleanup(t *testing.T, p *Process) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Stop(ctx, 0); err != nil {
			t.Errorf("cleanup stop: %v", err)
		}
	})
}

func TestProcessCapturesOutput(t *testing.T) {
	log, buf := newTestLogger(t)
	long := strings.Repeat("x", maxLogLine+100)
	cmd := script(t, fmt.Sprintf("echo hello out\necho hello err >&2\necho %s\nprintf 'crlf line\\r\\n'\nprintf 'no newline'", long))
	p, err := Start(cmd, log)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if err := p.ExitErr(); err != nil {
		t.Fatalf("ExitErr = %v, want nil", err)
	}
	want := map[string]string{"hello out": "stdout", "hello err": "stderr", "crlf line": "stdout", "no newline": "stdout"}
	for msg, stream := range want {
		got := buf.Find(t, msg)
		if len(got) != 1 {
			t.Fatalf("log has %d entries %q, want 1", len(got), msg)
		}
		e := got[0]
		if e["engine"] != "test" || e["pid"] != float64(p.PID()) || e["stream"] != stream {
			t.Errorf("entry %v: want engine=test pid=%d stream=%s", e, p.PID(), stream)
		}
	}
	var truncated int
	for _, e := range buf.Entries(t) {
		if e["truncated"] == true {
			truncated++
			if msg, _ := e["message"].(string); len(msg) != maxLogLine || strings.Trim(msg, "x") != "" {
				t.Errorf("truncated entry has %d bytes, want %d x's", len(msg), maxLogLine)
			}
		}
		if msg, _ := e["message"].(string); len(msg) > maxLogLine {
			t.Errorf("entry of %d bytes exceeds the bound", len(msg))
		}
	}
	if truncated != 1 {
		t.Errorf("%d truncated entries, want 1", truncated)
	}
	if len(buf.Find(t, "engine exited")) != 1 {
		t.Error("no \"engine exited\" entry")
	}
}

func TestProcessExitStatus(t *testing.T) {
	log, _ := newTestLogger(t)
	p, err := Start(script(t, "exit 3"), log)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	var exitErr *exec.ExitError
	if err := p.ExitErr(); !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 {
		t.Fatalf("ExitErr = %v, want exit status 3", err)
	}
	// A stop after the end changes nothing.
	if err := p.Stop(t.Context(), time.Second); err != nil {
		t.Fatalf("Stop after exit: %v", err)
	}
}

func TestProcessExitErrWhileRunning(t *testing.T) {
	log, _ := newTestLogger(t)
	p, err := Start(script(t, "exec sleep 1000"), log)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, p)
	if err := p.ExitErr(); !errors.Is(err, ErrStillRunning) {
		t.Fatalf("ExitErr = %v, want ErrStillRunning", err)
	}
}

func TestStartMissingBinary(t *testing.T) {
	log, _ := newTestLogger(t)
	if _, err := Start(Command{Name: "x", Path: filepath.Join(t.TempDir(), "missing")}, log); err == nil {
		t.Fatal("Start of a missing binary succeeded")
	}
	if _, err := Start(Command{Name: "x"}, log); err == nil {
		t.Fatal("Start with an empty path succeeded")
	}
}

func TestStopGracefulSIGTERM(t *testing.T) {
	log, _ := newTestLogger(t)
	p, err := Start(script(t, "exec sleep 1000"), log)
	if err != nil {
		t.Fatal(err)
	}
	// A long grace: sleep dies of SIGTERM long before it.
	if err := p.Stop(t.Context(), time.Minute); err != nil {
		t.Fatal(err)
	}
	var exitErr *exec.ExitError
	if err := p.ExitErr(); !errors.As(err, &exitErr) {
		t.Fatalf("ExitErr = %v, want a signal exit", err)
	}
	if ws := exitErr.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("exit %v, want death by SIGTERM", exitErr)
	}
}

func TestStopKillsGroupAfterGrace(t *testing.T) {
	log, buf := newTestLogger(t)
	dir := t.TempDir()
	childPID := filepath.Join(dir, "child.pid")
	// Both the leader and its child ignore SIGTERM (the ignore disposition is
	// inherited), so only SIGKILL to the whole group ends them.
	p, err := Start(script(t, fmt.Sprintf(`trap '' TERM
sh -c 'echo $$ > %s.tmp; mv %s.tmp %s; while :; do sleep 0.05; done' &
while :; do sleep 0.05; done`, childPID, childPID, childPID)), log)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, p)
	var child int
	testkit.Eventually(t, "child pid file", func() bool {
		b, err := os.ReadFile(childPID)
		if err != nil {
			return false
		}
		child, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	if err := p.Stop(t.Context(), 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var exitErr *exec.ExitError
	if err := p.ExitErr(); !errors.As(err, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("ExitErr = %v, want death by SIGKILL", err)
	}
	testkit.Eventually(t, "child of the group killed", func() bool { return processGone(child) })
	if e := buf.Find(t, "killing engine process group"); len(e) != 1 || e[0]["reason"] != "engine did not stop within grace" {
		t.Error("no log entry for the kill after grace")
	}
}

// TestExitKillsLeftovers: when the leader exits on its own, whatever it left
// in its group is killed too.
func TestExitKillsLeftovers(t *testing.T) {
	log, _ := newTestLogger(t)
	dir := t.TempDir()
	childPID := filepath.Join(dir, "child.pid")
	p, err := Start(script(t, fmt.Sprintf(`sh -c 'echo $$ > %s.tmp; mv %s.tmp %s; exec sleep 1000' >/dev/null 2>&1 &
while [ ! -f %s ]; do sleep 0.01; done
exit 4`, childPID, childPID, childPID, childPID)), log)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	b, err := os.ReadFile(childPID)
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "leftover child killed", func() bool { return processGone(child) })
}

// TestStopConcurrent: many concurrent Stop calls all wait for the one
// reaper and agree; -race checks the shared state.
func TestStopConcurrent(t *testing.T) {
	log, buf := newTestLogger(t)
	p, err := Start(script(t, "trap '' TERM\necho ready\nwhile :; do sleep 0.05; done"), log)
	if err != nil {
		t.Fatal(err)
	}
	// Only once SIGTERM is ignored does the stop need its SIGKILL.
	testkit.Eventually(t, "script ready", func() bool { return len(buf.Find(t, "ready")) == 1 })
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = p.Stop(t.Context(), 50*time.Millisecond) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Stop #%d: %v", i, err)
		}
	}
	if err := p.ExitErr(); err == nil || errors.Is(err, ErrStillRunning) {
		t.Fatalf("ExitErr = %v, want the kill", err)
	}
	if n := len(buf.Find(t, "stopping engine")); n != 1 {
		t.Errorf("%d SIGTERM rounds logged, want 1", n)
	}
	if n := len(buf.Find(t, "killing engine process group")); n != 1 {
		t.Errorf("%d kills logged, want 1", n)
	}
	if n := len(buf.Find(t, "engine exited")); n != 1 {
		t.Errorf("%d reaps logged, want exactly 1", n)
	}
}

func TestStopContextEnds(t *testing.T) {
	log, _ := newTestLogger(t)
	p, err := Start(script(t, "trap '' TERM\nwhile :; do sleep 0.05; done"), log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	// The context is already over: Stop kills and reports it without waiting.
	if err := p.Stop(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop = %v, want context.Canceled", err)
	}
	<-p.Done()
}
