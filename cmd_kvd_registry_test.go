package main

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"

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
	port := freeLoopbackPair(t)
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
	ctx, cancel := context.WithCancel(t.Context())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- runKVD(ctx, cfg, zerolog.Nop(), ready) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
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

// freeLoopbackPair returns a loopback port whose next port was free too.
func freeLoopbackPair(t *testing.T) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		next, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		ln.Close()
		if err == nil {
			next.Close()
			return p
		}
	}
	t.Fatal("no two adjacent free loopback ports")
	return 0
}
