package discovery_test

import (
	"errors"
	"net"
	"net/url"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
)

// The etcdtest helper gives a working server and client; port 0 resolves to
// a real port in the endpoints.
func TestEtcdtestStart(t *testing.T) {
	eps := etcdtest.Start(t)
	u, err := url.Parse(eps[0])
	if err != nil || u.Port() == "0" || u.Port() == "" {
		t.Fatalf("endpoint %q has no real port", eps[0])
	}
	cli := etcdtest.Client(t, eps)
	if _, err := cli.Put(t.Context(), "/k", "v"); err != nil {
		t.Fatal(err)
	}
}

// Restarting on the same directory keeps the data, even though the peer
// port (left empty, as `infera serve` does) changes between runs.
func TestEmbeddedRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	e, err := discovery.StartEmbedded(discovery.EmbeddedConfig{ClientListen: "127.0.0.1:0", Dir: dir}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	eps := e.Endpoints()
	cli := etcdtest.Client(t, eps)
	if _, err := cli.Put(t.Context(), "/k", "v"); err != nil {
		t.Fatal(err)
	}
	e.Close()
	e.Close() // idempotent

	u, _ := url.Parse(eps[0])
	e2, err := discovery.StartEmbedded(discovery.EmbeddedConfig{ClientListen: u.Host, Dir: dir}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	resp, err := cli.Get(t.Context(), "/k")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after restart got %v", resp.Kvs)
	}
}

func TestStartEmbeddedErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tt := range []struct {
		name string
		cfg  discovery.EmbeddedConfig
	}{
		{"no dir", discovery.EmbeddedConfig{ClientListen: "127.0.0.1:0"}},
		{"bad listen", discovery.EmbeddedConfig{ClientListen: "nonsense", Dir: t.TempDir()}},
		{"no host", discovery.EmbeddedConfig{ClientListen: ":0", Dir: t.TempDir()}},
		{"port in use", discovery.EmbeddedConfig{ClientListen: busy.Addr().String(), Dir: t.TempDir()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, err := discovery.StartEmbedded(tt.cfg, zerolog.Nop())
			if err == nil {
				e.Close()
				t.Fatal("started")
			}
			if !errors.Is(err, discovery.ErrEmbedded) {
				t.Fatalf("err = %v, want ErrEmbedded", err)
			}
		})
	}
}
