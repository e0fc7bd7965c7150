package discovery_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
	"github.com/infera/infera/internal/testkit"
)

const testKVDPrefix = "/infera-test/kvds/"

func kvdRecord(host, peer string) discovery.KVDRecord {
	return discovery.KVDRecord{Host: host, Peer: peer, Transport: discovery.KVDTransport{Kind: discovery.KVDTransportTCP, Addr: peer[:strings.LastIndexByte(peer, ':')] + ":9"}}
}

func TestKVDRecordRoundTrip(t *testing.T) {
	r := discovery.KVDRecord{Host: "10.0.0.7", Peer: "10.0.0.7:9480", Transport: discovery.KVDTransport{Kind: "tcp", Addr: "10.0.0.7:9481"}}
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"host":"10.0.0.7","peer":"10.0.0.7:9480","transport":{"kind":"tcp","addr":"10.0.0.7:9481"}}`
	if string(b) != want {
		t.Fatalf("encoded\n got %s\nwant %s", b, want)
	}
	got, err := discovery.DecodeKVDRecord(b)
	if err != nil || got != r {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, r)
	}
	// IPv6: the host without brackets, host:port fields with them.
	got, err = discovery.DecodeKVDRecord([]byte(`{"host":"[fd00::7]","peer":"fd00::7:9480","transport":{"kind":"tcp","addr":"fd00::7:9481"},"extra":1}`))
	if err != nil || got.Host != "fd00::7" || got.Peer != "[fd00::7]:9480" || got.Transport.Addr != "[fd00::7]:9481" {
		t.Fatalf("IPv6 record: %+v, %v", got, err)
	}
	// Mooncake names a segment, not necessarily host:port.
	if _, err := discovery.DecodeKVDRecord([]byte(`{"host":"node-7","peer":"node-7:9480","transport":{"kind":"mooncake","addr":"node-7-segment"}}`)); err != nil {
		t.Fatal(err)
	}
}

func TestKVDRecordRejects(t *testing.T) {
	for _, v := range []string{
		``, `null`, `{}`, `[]`,
		`{"host":"","peer":"h:1","transport":{"kind":"tcp","addr":"h:2"}}`,
		`{"host":"h h","peer":"h:1","transport":{"kind":"tcp","addr":"h:2"}}`,
		`{"host":"h:1","peer":"h:1","transport":{"kind":"tcp","addr":"h:2"}}`,
		`{"host":"h","peer":"h","transport":{"kind":"tcp","addr":"h:2"}}`,
		`{"host":"h","peer":"h:0","transport":{"kind":"tcp","addr":"h:2"}}`,
		`{"host":"h","peer":"h:1","transport":{"kind":"tcp","addr":"h"}}`,
		`{"host":"h","peer":"h:1","transport":{"kind":"rdma","addr":"h:2"}}`,
		`{"host":"h","peer":"h:1","transport":{"kind":"mooncake","addr":""}}`,
		`{"host":"h","peer":"h:1","transport":{"kind":"mooncake","addr":"a\u0001"}}`,
		`{"host":"h","peer":"h:1","transport":"tcp"}`,
		`{"host":"h","peer":"h:1","transport":{"kind":"tcp","addr":"h:2"},"pad":"` + strings.Repeat("x", discovery.MaxKVDRecordBytes) + `"}`,
	} {
		if r, err := discovery.DecodeKVDRecord([]byte(v)); !errors.Is(err, discovery.ErrInvalidKVDRecord) {
			t.Errorf("%.80s: got %+v, %v; want ErrInvalidKVDRecord", v, r, err)
		}
	}
}

func TestHostOf(t *testing.T) {
	for in, want := range map[string]string{"10.0.0.1:80": "10.0.0.1", "[::1]:80": "::1", "node:1": "node", "bare": "bare"} {
		if got := discovery.HostOf(in); got != want {
			t.Errorf("HostOf(%q) = %q, want %q", in, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = discovery.HostOf("[fd00::1]:8000") }); n != 0 {
		t.Errorf("HostOf allocates %v times", n)
	}
}

// A kvd registers under a lease kept alive by the worker registrar's code;
// a KVDWatcher lists it, finds it by host, ignores an invalid record and
// sees it go on Revoke.
func TestKVDRegistrarAndWatcher(t *testing.T) {
	eps := etcdtest.Start(t)
	cli := etcdtest.Client(t, eps)
	w := discovery.NewKVDWatcher(cli, testKVDPrefix, zerolog.Nop(), nil)
	startWatcher(t, w)
	<-w.Synced()

	opts := discovery.RegistrarOptions{TTL: 5 * time.Second, KeepAliveInterval: 200 * time.Millisecond}
	a := discovery.NewKVDRegistrar(cli, testKVDPrefix, kvdRecord("10.0.0.1", "10.0.0.1:9480"), opts, zerolog.Nop())
	if err := a.Register(t.Context()); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan error, 1)
	go func() { rdone <- a.Run(rctx) }()
	t.Cleanup(func() { rcancel(); <-rdone })

	// A record under a key that is not its peer, and garbage: ignored.
	other := kvdRecord("10.0.0.2", "10.0.0.2:9480")
	b, _ := other.Encode()
	if _, err := cli.Put(t.Context(), testKVDPrefix+"10.0.0.3:1", string(b)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), testKVDPrefix+"x:1", "{"); err != nil {
		t.Fatal(err)
	}
	v6 := kvdRecord("fd00::2", "[fd00::2]:9480")
	b, _ = v6.Encode()
	if _, err := cli.Put(t.Context(), testKVDPrefix+"[fd00::2]:9480", string(b)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "both kvds listed", func() bool {
		s := w.Snapshot()
		var peers []string
		for _, k := range s.KVDs {
			peers = append(peers, k.Peer)
		}
		return slices.Equal(peers, []string{"10.0.0.1:9480", "[fd00::2]:9480"})
	})
	s := w.Snapshot()
	if k, ok := s.ByHost(discovery.HostOf("10.0.0.1:8000")); !ok || k.Peer != "10.0.0.1:9480" || k.Transport.Kind != "tcp" {
		t.Fatalf("ByHost 10.0.0.1: %+v %v", k, ok)
	}
	if k, ok := s.ByHost(discovery.HostOf("[fd00::2]:8000")); !ok || k.Peer != "[fd00::2]:9480" {
		t.Fatalf("ByHost fd00::2: %+v %v", k, ok)
	}
	if _, ok := s.ByHost("10.0.0.3"); ok {
		t.Fatal("a record under another peer's key was listed")
	}
	if err := a.Revoke(t.Context()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "revoked kvd gone", func() bool {
		_, ok := w.Snapshot().ByHost("10.0.0.1")
		return !ok && w.Snapshot().Len() == 1
	})
}
