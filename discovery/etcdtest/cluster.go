package etcdtest

import (
	"bufio"
	"context"
	"fmt"
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
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Cluster is an etcd cluster of real etcd server processes (the etcd
// binary: Debian's etcd-server in CI) on loopback ports, for tests that
// kill a member — its leader, say — as a crash would.
type Cluster struct {
	t       testing.TB
	members []*member
}

type member struct {
	name               string
	clientURL, peerURL string
	cmd                *exec.Cmd
	log                string // path of its stderr
	done               chan struct{}
}

// StartCluster runs an n-member cluster, with its data and logs in
// t.TempDir(), and waits until every member is healthy; t.Cleanup kills
// the members still running. It fails the test with the install hint when
// the etcd binary is missing.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatalf("the etcd server binary is not installed (%v): run .ci/run, or apt-get install etcd-server", err)
	}
	dir := t.TempDir()
	c := &Cluster{t: t}
	var initial []string
	for i := range n {
		m := &member{name: fmt.Sprintf("m%d", i),
			clientURL: "http://" + testkit.FreeAddr(t), peerURL: "http://" + testkit.FreeAddr(t),
			log: filepath.Join(dir, fmt.Sprintf("m%d.log", i))}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peerURL)
	}
	t.Cleanup(func() {
		for i := range c.members {
			c.Kill(i)
		}
	})
	for _, m := range c.members {
		logf, err := os.Create(m.log)
		if err != nil {
			t.Fatal(err)
		}
		m.cmd = exec.Command(bin,
			"--name", m.name,
			"--data-dir", filepath.Join(dir, m.name),
			"--listen-client-urls", m.clientURL, "--advertise-client-urls", m.clientURL,
			"--listen-peer-urls", m.peerURL, "--initial-advertise-peer-urls", m.peerURL,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", "etcdtest",
			"--logger", "zap", "--log-outputs", "stderr")
		m.cmd.Stderr = logf
		err = m.cmd.Start()
		_ = logf.Close() // the child holds its own descriptor
		if err != nil {
			t.Fatalf("start etcd %s: %v", m.name, err)
		}
		m.done = make(chan struct{})
		go func(m *member) {
			_ = m.cmd.Wait()
			close(m.done)
		}(m)
	}
	deadline := time.Now().Add(60 * time.Second)
	for i, m := range c.members {
		for !healthy(m.clientURL) {
			select {
			case <-m.done:
				t.Fatalf("etcd %s exited before it was healthy; log:\n%s", m.name, c.Log(i))
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("etcd %s not healthy within 60 s; log:\n%s", m.name, c.Log(i))
			}
			time.Sleep(50 * time.Millisecond) // pacing: poll /health
		}
	}
	return c
}

func healthy(url string) bool {
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get(url + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Endpoints returns the client URLs of the members, in member order.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.clientURL
	}
	return eps
}

// Kill SIGKILLs member i (no-op if it is not running) and waits until it
// is gone.
func (c *Cluster) Kill(i int) {
	m := c.members[i]
	if m.cmd == nil || m.cmd.Process == nil {
		return
	}
	select {
	case <-m.done:
		return
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.done
}

// Pause stops member i with SIGSTOP, as a stalled host or process would:
// its connections stay open and nothing answers. Resume continues it.
func (c *Cluster) Pause(i int) { c.signal(i, syscall.SIGSTOP) }

// Resume continues member i after Pause.
func (c *Cluster) Resume(i int) { c.signal(i, syscall.SIGCONT) }

func (c *Cluster) signal(i int, sig syscall.Signal) {
	c.t.Helper()
	if err := c.members[i].cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("etcd %s: %v: %v", c.members[i].name, sig, err)
	}
}

// Leader returns the index of the running member that is the cluster's
// leader by its own account, or -1 when none is (an election is under way).
func (c *Cluster) Leader(cli *clientv3.Client) int {
	for i, m := range c.members {
		select {
		case <-m.done:
			continue
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := cli.Status(ctx, m.clientURL)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}

// WatchStreams returns how many watch streams member i serves (its
// etcd_debugging_mvcc_watch_stream_total gauge), or -1 when it does not
// answer.
func (c *Cluster) WatchStreams(i int) int {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(c.members[i].clientURL + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_debugging_mvcc_watch_stream_total "); ok {
			if n, err := strconv.ParseFloat(v, 64); err == nil {
				return int(n)
			}
		}
	}
	return -1
}

// Log returns what member i wrote to stderr so far.
func (c *Cluster) Log(i int) string {
	b, _ := os.ReadFile(c.members[i].log)
	return string(b)
}
