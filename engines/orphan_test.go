package engines

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

// supervisorEnv switches the test binary into a stand-in worker (see
// TestMain): it starts a looping shell engine through Start, writes the
// engine's pid to the file the variable names and waits to be killed.
const supervisorEnv = "INFERA_ENGINES_TEST_SUPERVISOR"

var errMainThread = errors.New("on the main thread")

// runSupervisor is the stand-in worker. It calls Start from a goroutine
// locked to a thread that then exits, the way any goroutine's thread may be
// retired: the engine must survive that and die only with the process.
func runSupervisor(pidPath string) int {
	log, _ := newTestLogger(nil)
	// The runtime never retires the main thread (a goroutine locked there
	// that exits wedges it instead), so the caller must run elsewhere.
	runtime.LockOSThread()
	var p *Process
	for p == nil {
		res := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
			if syscall.Gettid() == syscall.Getpid() {
				res <- errMainThread
				return
			}
			var err error
			p, err = Start(Command{Name: "loop", Path: "/bin/sh", Args: []string{"-c", "while :; do sleep 0.05; done"}}, log)
			res <- err
		}()
		if err := <-res; errors.Is(err, errMainThread) {
			continue // that thread now stays locked, so the next try lands elsewhere
		} else if err != nil {
			fmt.Fprintln(os.Stderr, "supervisor:", err)
			return 1
		}
	}
	if err := os.WriteFile(pidPath+".tmp", []byte(strconv.Itoa(p.PID())), 0o600); err != nil {
		return 1
	}
	if err := os.Rename(pidPath+".tmp", pidPath); err != nil {
		return 1
	}
	<-p.Done()
	return 0
}

// TestEngineDiesWithKilledWorker SIGKILLs a process that started an engine
// through Start; the kernel's parent-death signal must take the engine with
// it, although the goroutine (and thread) that called Start had ended.
func TestEngineDiesWithKilledWorker(t *testing.T) {
	pidPath := filepath.Join(t.TempDir(), "engine.pid")
	sup := exec.Command(os.Args[0], "-test.run=^$")
	sup.Env = append(os.Environ(), supervisorEnv+"="+pidPath)
	sup.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := sup.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sup.Process.Kill(); _ = sup.Wait() })
	var pid int
	testkit.Eventually(t, "the engine's pid", func() bool {
		data, err := os.ReadFile(pidPath)
		pid, _ = strconv.Atoi(string(data))
		return err == nil && pid > 0
	})
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	// The thread that called Start is gone by now (it exited before the
	// pid was written); the engine must still run.
	time.Sleep(200 * time.Millisecond)
	if processGone(pid) {
		t.Fatal("the engine died when the goroutine that started it ended")
	}
	if err := sup.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = sup.Wait()
	testkit.Eventually(t, "the engine to die with its worker", func() bool { return processGone(pid) })
}

// startStray starts a looping shell in its own group, outside any
// supervisor, like an engine its worker lost; it is killed on cleanup.
func startStray(t *testing.T) *exec.Cmd {
	t.Helper()
	c := exec.Command("/bin/sh", "-c", "while :; do sleep 0.05; done")
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan struct{})
	go func() { _ = c.Wait(); close(reaped) }()
	t.Cleanup(func() { _ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL); <-reaped })
	return c
}

func TestReclaimKillsRecordedEngine(t *testing.T) {
	log, buf := newTestLogger(t)
	stray := startStray(t)
	pf := pidfilePath(t.TempDir(), 18123)
	testkit.Eventually(t, "the stray's exec", func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", stray.Process.Pid))
		return strings.Contains(string(b), "while")
	})
	if err := pf.write(stray.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := pf.reclaim(log); err != nil {
		t.Fatal(err)
	}
	if !processGone(stray.Process.Pid) {
		t.Fatal("the recorded engine still runs after reclaim")
	}
	if _, err := os.Stat(pf.path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pidfile left behind: %v", err)
	}
	if len(buf.Find(t, "killing the engine a previous worker left behind")) != 1 {
		t.Fatalf("the kill is not logged:\n%s", logMessages(t, buf))
	}
}

func TestReclaimSparesOtherProcess(t *testing.T) {
	log, _ := newTestLogger(t)
	stray := startStray(t)
	pf := pidfilePath(t.TempDir(), 18124)
	// The pid was recycled: the recorded command line is another one.
	if err := os.WriteFile(pf.path, []byte(strconv.Itoa(stray.Process.Pid)+"\nvllm\x00serve\x00"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pf.reclaim(log); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if processGone(stray.Process.Pid) {
		t.Fatal("reclaim killed a process whose command line does not match the pidfile")
	}
	if _, err := os.Stat(pf.path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale pidfile kept: %v", err)
	}
	// A malformed pidfile is dropped too.
	if err := os.WriteFile(pf.path, []byte("nonsense"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pf.reclaim(log); err != nil {
		t.Fatal(err)
	}
}

func TestCheckPortFreeNamesHolder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	err = checkPortFree("127.0.0.1", port)
	if !errors.Is(err, ErrPortInUse) {
		t.Fatalf("checkPortFree = %v, want ErrPortInUse", err)
	}
	if want := "pid " + strconv.Itoa(os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name %s", err, want)
	}
	if err := checkPortFree("0.0.0.0", port); !errors.Is(err, ErrPortInUse) {
		t.Fatalf("wildcard probe = %v, want ErrPortInUse", err)
	}
	ln.Close()
	if err := checkPortFree("127.0.0.1", port); err != nil {
		t.Fatalf("free port: %v", err)
	}
}
