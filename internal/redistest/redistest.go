package redistest

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

// Server is one redis-server process.
type Server struct {
	Addr string
	Port int
	t    testing.TB
	dir  string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

// Path finds redis-server, failing the test when it is absent.
func Path(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is required (Debian: apt-get install redis-server): %v", err)
	}
	return p
}

// Start runs redis-server with extra configuration arguments (such as
// "--requirepass", "pw") and waits until it answers.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	Path(t)
	port := testkit.FreePort(t)
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, t: t, dir: t.TempDir()}
	s.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--daemonize", "no", "--loglevel", "warning"}, extra...)
	s.start()
	t.Cleanup(s.Kill)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	s.cmd = exec.Command("redis-server", s.args...)
	var out bytes.Buffer // why it exited, if it does at start
	s.cmd.Stdout, s.cmd.Stderr = &out, &out
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(s.cmd, s.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
			// A loading or protected server may not answer yet: PING it.
			_, _ = c.Write([]byte("PING\r\n"))
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.HasPrefix(line, "+PONG") || strings.HasPrefix(line, "-NOAUTH") {
				return
			}
		}
		select {
		case <-s.done:
			s.t.Fatalf("redis-server %v exited at start:\n%s", s.args, out.String())
		default:
		}
		if time.Now().After(deadline) {
			s.Kill()
			s.t.Fatalf("redis-server on %s did not answer within 10s", s.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL (an outage) and waits for it.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Restart starts the server again on the same port (empty: nothing was
// saved).
func (s *Server) Restart() {
	s.t.Helper()
	if s.cmd != nil {
		s.Kill()
	}
	s.start()
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return fmt.Sprintf("redis://%s", s.Addr) }

// StartCluster runs n cluster-enabled redis-servers and joins them into
// one cluster without replicas (redis-cli --cluster create), waiting
// until every node reports cluster_state:ok.
func StartCluster(t testing.TB, n int) []*Server {
	t.Helper()
	nodes := make([]*Server, n)
	args := []string{"--cluster", "create"}
	for i := range nodes {
		dir := t.TempDir()
		// The cluster bus port is chosen as well: by default it is the
		// client port + 10000, which from FreePort's range lands in the
		// kernel's ephemeral one, where any outgoing connection on the box
		// may hold it (a node "exited at start" in CI).
		nodes[i] = Start(t, "--cluster-enabled", "yes", "--cluster-config-file", dir+"/nodes.conf", "--cluster-node-timeout", "2000",
			"--cluster-port", strconv.Itoa(testkit.FreePort(t)))
		args = append(args, nodes[i].Addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range nodes {
		for {
			out, _ := exec.Command("redis-cli", "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "CLUSTER", "INFO").Output()
			if strings.Contains(string(out), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok on %s: %s", s.Addr, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nodes
}
