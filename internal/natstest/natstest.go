package natstest

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

// Server is one nats-server process with JetStream enabled.
type Server struct {
	// Addr is host:port of the client listener.
	Addr string
	Port int
	// StoreDir is the JetStream store directory (kept across Restart).
	StoreDir string
	t        testing.TB
	args     []string
	cmd      *exec.Cmd
	done     chan struct{}
	paused   bool
}

// Path finds nats-server, failing the test when it is absent.
func Path(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("nats-server")
	if err != nil {
		t.Fatalf("nats-server is required (Debian: apt-get install nats-server): %v", err)
	}
	return p
}

// Start runs nats-server with JetStream on a free loopback port and extra
// arguments (such as "--user", "u", "--pass", "p"), and waits until it
// announces JetStream in its INFO line.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	Path(t)
	port := testkit.FreePort(t)
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, StoreDir: t.TempDir(), t: t}
	s.args = append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", s.StoreDir}, extra...)
	s.start()
	t.Cleanup(s.Kill)
	return s
}

// URL is the server's nats:// URL.
func (s *Server) URL() string { return "nats://" + s.Addr }

func (s *Server) start() {
	s.t.Helper()
	s.cmd = exec.Command("nats-server", s.args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start nats-server: %v", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(s.cmd, s.done)
	deadline := time.Now().Add(15 * time.Second)
	for {
		if info, err := readInfo(s.Addr); err == nil && strings.Contains(info, `"jetstream":true`) {
			return
		}
		select {
		case <-s.done:
			s.cmd = nil
			s.t.Fatalf("nats-server %v exited at start", s.args)
		default:
		}
		if time.Now().After(deadline) {
			s.Kill()
			s.t.Fatalf("nats-server on %s did not announce JetStream within 15s", s.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readInfo reads the INFO line a NATS server sends first on a connection.
func readInfo(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(line, "INFO ") {
		return "", fmt.Errorf("natstest: first line %q is no INFO", line)
	}
	return line, nil
}

// Pause stops the server with SIGSTOP: its sockets stay open and silent,
// as a hung broker's do.
func (s *Server) Pause() {
	s.t.Helper()
	if s.cmd == nil || s.paused {
		return
	}
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("SIGSTOP nats-server: %v", err)
	}
	s.paused = true
	// The signal is delivered asynchronously: wait until the kernel shows
	// the process stopped, so that nothing sent after Pause is answered.
	stat := fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			return
		}
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return
		}
	}
	s.t.Fatalf("nats-server %d did not stop after SIGSTOP", s.cmd.Process.Pid)
}

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() {
	s.t.Helper()
	if s.cmd == nil || !s.paused {
		return
	}
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("SIGCONT nats-server: %v", err)
	}
	s.paused = false
}

// Kill stops the server with SIGKILL (an outage) and waits for it. A
// paused server is killed too.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
	s.paused = false
}

// Restart starts the server again on the same port and store directory:
// file-backed streams survive, memory-backed ones are empty.
func (s *Server) Restart() {
	s.t.Helper()
	if s.cmd != nil {
		s.Kill()
	}
	s.start()
}
