package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

func parseKVD(t *testing.T, args ...string) (*KVD, error) {
	t.Helper()
	var k KVD
	app := &cli.App{Flags: k.Flags(), Action: func(c *cli.Context) error {
		k.Finish(c)
		return k.Validate()
	}}
	err := app.Run(append([]string{"kvd"}, args...))
	return &k, err
}

func TestKVDDefaults(t *testing.T) {
	k, err := parseKVD(t)
	if err != nil {
		t.Fatal(err)
	}
	if k.Socket != DefaultKVDSocket || k.MaxBytes != 4<<30 || k.ArenaBytes != k.MaxBytes || k.MaxFrameBytes != 1<<30 ||
		!k.ArenaMlock || k.ArenaHugetlb || len(k.AllowUIDs) != 0 || k.AdminListen != "127.0.0.1:9478" {
		t.Fatalf("defaults %+v", k)
	}
}

func TestKVDFlagsAndEnv(t *testing.T) {
	t.Setenv("INFERA_MAX_BYTES", "2GiB")
	k, err := parseKVD(t, "--socket", "/tmp/k.sock", "--shared-arena-bytes", "512MiB", "--allow-uid", "1000,1001", "--allow-uid", "5")
	if err != nil {
		t.Fatal(err)
	}
	if k.MaxBytes != 2<<30 || k.ArenaBytes != 512<<20 || len(k.AllowUIDs) != 3 || k.AllowUIDs[2] != 5 || k.Socket != "/tmp/k.sock" {
		t.Fatalf("%+v", k)
	}
	if k.LongBytes != 64<<30 || k.SlotBytes != 1<<20 || k.ContainerBytes != 1<<30 || len(k.LongPaths) != 0 || k.LongDirectIO != "auto" {
		t.Fatalf("l3 defaults %+v", k)
	}
	if k, err := parseKVD(t, "--long-path", "/a", "--long-paths", "/b,/c"); err != nil || len(k.LongPaths) != 3 || k.LongPaths[2] != "/c" {
		t.Fatalf("long paths: %v %+v", err, k)
	}
	if k, err := parseKVD(t, "--shared-arena-bytes", "0"); err != nil || k.ArenaBytes != 0 {
		t.Fatalf("arena off: %v %+v", err, k)
	}
}

func TestKVDValidateReportsEverything(t *testing.T) {
	_, err := parseKVD(t, "--socket", "rel.sock", "--max-bytes", "lots", "--shared-arena-bytes", "x", "--max-frame-bytes", "1",
		"--allow-uid", "bob", "--admin-listen", "nope", "--prefetch-queue", "0", "--long-write-queue", "0",
		"--long-bytes", "0", "--tablespace-slot-bytes", "1000", "--tablespace-container-bytes", "x", "--long-direct-io", "maybe", "--long-snapshot-interval", "-1s", "--arena-slot-bytes", "8")
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err %v", err)
	}
	for _, f := range []string{"--socket", "--max-bytes", "--shared-arena-bytes", "--max-frame-bytes", "--allow-uid", "--admin-listen", "--prefetch-queue", "--long-write-queue",
		"--long-bytes", "--tablespace-slot-bytes", "--tablespace-container-bytes", "--long-direct-io", "--long-snapshot-interval", "--arena-slot-bytes"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("%s not reported: %v", f, err)
		}
	}
	if _, err := parseKVD(t, "--max-bytes", "1GiB", "--shared-arena-bytes", "2GiB"); err == nil {
		t.Fatal("an arena larger than the RAM budget was accepted")
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "100": 100, "4KiB": 4096, "1.5GiB": 3 << 29, "2G": 2 << 30, "3MB": 3e6, "7 MiB": 7 << 20, "10B": 10} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1XB", "1e30GiB"} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) accepted", in)
		}
	}
}

// The kvd registry: off without endpoints; INFERA_ETCD_ENDPOINTS turns it
// on; it needs a peer listener with a concrete host; the prefix flag is
// the registry's, not the workers'.
func TestKVDRegistryFlags(t *testing.T) {
	k, err := parseKVD(t)
	if err != nil || len(k.Etcd.Endpoints) != 0 || k.Etcd.Prefix != DefaultKVDPrefix || k.LeaseTTL != 10*time.Second {
		t.Fatalf("defaults: %v %+v", err, k.Etcd)
	}
	t.Setenv("INFERA_ETCD_ENDPOINTS", "http://10.0.0.1:2379")
	if _, err := parseKVD(t); err == nil || !strings.Contains(err.Error(), "set --peer-listen too") {
		t.Fatalf("registry without a listener: %v", err)
	}
	if _, err := parseKVD(t, "--peer-listen", ":9480"); err == nil || !strings.Contains(err.Error(), "--peer-advertise") {
		t.Fatalf("registry with a wildcard listener: %v", err)
	}
	k, err = parseKVD(t, "--peer-listen", "0.0.0.0:9480", "--peer-advertise", "node-7", "--etcd-kvd-prefix", "/fleet/kvds")
	if err != nil || k.Etcd.Endpoints[0] != "http://10.0.0.1:2379" || k.Etcd.Prefix != "/fleet/kvds/" || k.PeerRegistryHost() != "node-7" {
		t.Fatalf("registry: %v %+v host %q", err, k.Etcd, k.PeerRegistryHost())
	}
	if k, err := parseKVD(t, "--peer-listen", "[fd00::7]:9480"); err != nil || k.PeerRegistryHost() != "fd00::7" {
		t.Fatalf("IPv6 listener: %v host %q", err, k.PeerRegistryHost())
	}
	if _, err := parseKVD(t, "--peer-listen", "10.0.0.7:9480", "--keepalive-interval", "20s"); err == nil || !strings.Contains(err.Error(), "--keepalive-interval") {
		t.Fatalf("keepalive above the TTL: %v", err)
	}
}
