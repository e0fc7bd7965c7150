package etcdtest

import (
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
