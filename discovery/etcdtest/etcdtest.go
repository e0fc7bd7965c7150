package etcdtest

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
)

// Start runs an embedded etcd on free loopback ports with its data in
// t.TempDir() and returns its client endpoints. It is closed by t.Cleanup.
// etcd's errors go to stderr: they are rare and always worth seeing, and
// t.Log cannot take lines logged after the test ends.
func Start(t testing.TB) []string {
	t.Helper()
	e, err := discovery.StartEmbedded(discovery.EmbeddedConfig{
		ClientListen: "127.0.0.1:0",
		PeerListen:   "127.0.0.1:0",
		Dir:          t.TempDir(),
	}, zerolog.New(os.Stderr).Level(zerolog.ErrorLevel))
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	t.Cleanup(e.Close)
	return e.Endpoints()
}

// Client returns a client of endpoints, closed by t.Cleanup (before the
// server that Start registered earlier, as cleanups run last-in first-out).
func Client(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := discovery.NewClient(config.Etcd{Endpoints: endpoints, DialTimeout: 5 * time.Second}, zerolog.Nop())
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Restartable is an embedded etcd a test stops and starts again on the same
// client address and data directory, to play an etcd outage. It is not safe
// for concurrent Stop and Start; the test goroutine drives it.
type Restartable struct {
	t    testing.TB
	addr string
	dir  string
	eps  []string
	e    *discovery.Embedded
}

// StartRestartable runs an embedded etcd on a free loopback port with its
// data in t.TempDir(); t.Cleanup stops it if it is running then.
func StartRestartable(t testing.TB) *Restartable {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("etcd: free port: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	r := &Restartable{t: t, addr: addr, dir: t.TempDir()}
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Start starts the server again after Stop (on the same address and data).
func (r *Restartable) Start() {
	r.t.Helper()
	if r.e != nil {
		r.t.Fatal("etcd: Start while running")
	}
	e, err := discovery.StartEmbedded(discovery.EmbeddedConfig{ClientListen: r.addr, Dir: r.dir}, zerolog.Nop())
	if err != nil {
		r.t.Fatalf("start embedded etcd: %v", err)
	}
	r.e = e
	r.eps = e.Endpoints()
}

// Stop stops the server; its data stays for the next Start.
func (r *Restartable) Stop() {
	if r.e != nil {
		r.e.Close()
		r.e = nil
	}
}

// Endpoints are the client endpoints, the same across restarts.
func (r *Restartable) Endpoints() []string { return append([]string(nil), r.eps...) }
