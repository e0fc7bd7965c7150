package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func envOf(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

// TestMooncakeL4Config: the YAML keys of the Python fleet, INFERA_L4_*
// variables winning over them, POD_IP:14001 as the local hostname under
// Kubernetes, defaults, and every missing key reported at once.
func TestMooncakeL4Config(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mooncake.yaml")
	yaml := "master_address: 10.1.0.1:50051\ncluster_id: fleet-a\nprotocol: tcp\nglobal_segment_size: 2147483648\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := LoadMooncakeL4(path, envOf(map[string]string{"INFERA_L4_CLUSTER_ID": "fleet-b", "POD_IP": "10.2.0.7", "INFERA_L4_LOCAL_BUFFER_SIZE": "512MiB"}))
	if err != nil {
		t.Fatal(err)
	}
	want := MooncakeL4{MasterAddress: "10.1.0.1:50051", ClusterID: "fleet-b", Protocol: "tcp", LocalHostname: "10.2.0.7:14001",
		MetadataServer: "P2PHANDSHAKE", GlobalSegmentSize: 2 << 30, LocalBufferSize: 512 << 20, MaxValueBytes: 64 << 20}
	if m != want {
		t.Fatalf("got %+v\nwant %+v", m, want)
	}

	_, err = LoadMooncakeL4("", envOf(nil))
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty: %v", err)
	}
	for _, key := range []string{"master_address", "cluster_id", "local_hostname"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("%q does not name %s", err, key)
		}
	}
	env := map[string]string{"INFERA_L4_MASTER_ADDRESS": "m:1", "INFERA_L4_CLUSTER_ID": "c", "INFERA_L4_LOCAL_HOSTNAME": "h:1", "INFERA_L4_PROTOCOL": "rdma"}
	if _, err := LoadMooncakeL4("", envOf(env)); err == nil || !strings.Contains(err.Error(), "device_name") {
		t.Fatalf("rdma without a device: %v", err)
	}
	env["INFERA_L4_ALLOW_TCP_FALLBACK"] = "1"
	if _, err := LoadMooncakeL4("", envOf(env)); err != nil {
		t.Fatalf("rdma with the fallback allowed: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("master_adress: typo:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadMooncakeL4(bad, envOf(env)); err == nil || !strings.Contains(err.Error(), "master_adress") {
		t.Fatalf("unknown key: %v", err)
	}
}

// TestLongBackendFlags: mooncake is one L4 (not beside --l4-redis), and
// --mooncake-config belongs to it.
func TestLongBackendFlags(t *testing.T) {
	if _, err := parseKVD(t, "--long-backend", "nvme"); err == nil || !strings.Contains(err.Error(), "want tablespace or mooncake") {
		t.Fatalf("unknown backend: %v", err)
	}
	if _, err := parseKVD(t, "--mooncake-config", "/x.yaml"); err == nil || !strings.Contains(err.Error(), "--long-backend") {
		t.Fatalf("config without the backend: %v", err)
	}
	t.Setenv("INFERA_L4_MASTER_ADDRESS", "m:1")
	t.Setenv("INFERA_L4_CLUSTER_ID", "c")
	t.Setenv("INFERA_L4_LOCAL_HOSTNAME", "h:1")
	if _, err := parseKVD(t, "--long-backend", "mooncake", "--l4-redis", "redis://127.0.0.1:6379"); err == nil || !strings.Contains(err.Error(), "one L4 only") {
		t.Fatalf("two L4s: %v", err)
	}
	k, err := parseKVD(t, "--long-backend", "mooncake")
	if err != nil || k.Mooncake.MasterAddress != "m:1" {
		t.Fatalf("%+v %v", k.Mooncake, err)
	}
}
