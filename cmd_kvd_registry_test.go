package main

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
	"github.com/infera/infera/internal/testkit"
)

// TestKVDRegistersItself: `infera kvd --etcd-endpoints` writes its record
// (host, peer listener, TCP transport on the next port) under a lease in
// the kvd registry, and revokes it when it stops.
func TestKVDRegistersItself(t *testing.T) {
	eps := etcdtest.Start(t)
	cli := etcdtest.Client(t, eps)
	port := testkit.FreePortPair(t)
	var cfg config.KVD
	cfg.Flags()
	cfg.Socket = filepath.Join(t.TempDir(), "kvd.sock")
	cfg.MaxBytesText, cfg.ArenaText, cfg.AdminListen = "8MiB", "4MiB", ""
	cfg.ArenaMlock = false
	cfg.PeerListen = "127.0.0.1:" + strconv.Itoa(port)
	cfg.Etcd.Endpoints = eps
	cfg.LeaseTTL, cfg.KeepAliveInterval = 5*time.Second, time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	_, cancel, done := startKVD(t, cfg)
	key := config.DefaultKVDPrefix + cfg.PeerListen
	resp, err := cli.Get(t.Context(), key)
	if err != nil || len(resp.Kvs) != 1 {
		cancel()
		<-done
		t.Fatalf("no record under %s: %v", key, err)
	}
	rec, err := discovery.DecodeKVDRecord(resp.Kvs[0].Value)
	want := discovery.KVDRecord{Host: "127.0.0.1", Peer: cfg.PeerListen,
		Transport: discovery.KVDTransport{Kind: "tcp", Addr: "127.0.0.1:" + strconv.Itoa(port+1)}}
	if err != nil || rec != want || resp.Kvs[0].Lease == 0 {
		t.Errorf("record %+v (lease %x), %v; want %+v under a lease", rec, resp.Kvs[0].Lease, err, want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the record revoked", func() bool {
		r, err := cli.Get(t.Context(), key)
		return err == nil && len(r.Kvs) == 0
	})
}
