package rocm

import (
	"errors"
	"strings"
	"testing"
)

func discover(t *testing.T, name string) Node {
	t.Helper()
	n, err := Discover(fixtureRoot(name))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func codes(r Report, s Severity) []string {
	var out []string
	for _, f := range r.Findings {
		if f.Severity == s {
			out = append(out, f.Code)
		}
	}
	return out
}

func TestPreflightVerdicts(t *testing.T) {
	cases := []struct {
		fixture, role, host string
		allowTCP            bool
		verdict             string
		blocking            string // codes of the blocking findings, comma-joined
	}{
		{"mi355x", "prefill", "10.16.0.11", false, VerdictPass, ""},
		{"mi355x", "decode", "127.0.0.1", false, VerdictFail, "advertise_unroutable"},
		{"mi355x", "decode", "fe80::1", false, VerdictFail, "advertise_unroutable"},
		{"mi355x", "decode", "localhost", true, VerdictAllowTCP, ""},
		{"nordma", "prefill", "10.0.0.5", false, VerdictFail, "no_rdma_device"},
		{"nordma", "decode", "127.0.0.1", false, VerdictFail, "advertise_unroutable,no_rdma_device"},
		{"nordma", "prefill", "10.0.0.5", true, VerdictAllowTCP, ""},
		{"nordma", "mixed", "127.0.0.1", false, VerdictPass, ""},
		{"portdown", "decode", "10.0.0.5", false, VerdictFail, "no_active_rdma_port"},
		{"portdown", "decode", "worker-7.example", true, VerdictAllowTCP, ""},
	}
	for _, c := range cases {
		r := Preflight(discover(t, c.fixture), PreflightInput{SysfsRoot: c.fixture, Role: c.role, AdvertiseHost: c.host, AllowTCP: c.allowTCP})
		if r.Verdict != c.verdict || strings.Join(codes(r, SeverityBlock), ",") != c.blocking {
			t.Errorf("%s %s %s allow=%t: verdict %q blocking %v, want %q %q", c.fixture, c.role, c.host, c.allowTCP, r.Verdict, codes(r, SeverityBlock), c.verdict, c.blocking)
		}
		err := r.Err()
		if (err != nil) != (c.blocking != "") || (err != nil && !errors.Is(err, ErrPreflight)) {
			t.Errorf("%s %s: Err() = %v", c.fixture, c.role, err)
		}
	}
}

func TestPreflightNamesTheDevice(t *testing.T) {
	r := Preflight(discover(t, "portdown"), PreflightInput{SysfsRoot: "portdown", Role: "prefill", AdvertiseHost: "10.0.0.5"})
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "mlx5_0") || !strings.Contains(err.Error(), "--disaggregation-allow-tcp") {
		t.Fatalf("Err() = %v: want the NIC named and the way out", err)
	}
	if w := codes(r, SeverityWarn); len(w) != 1 || w[0] != "port_not_active" {
		t.Fatalf("warnings %v", w)
	}
	r = Preflight(discover(t, "nordma"), PreflightInput{SysfsRoot: "/sys", Role: "decode", AdvertiseHost: "10.0.0.5"})
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "/sys/class/infiniband") {
		t.Fatalf("Err() = %v: want the missing device class named", err)
	}
}

// TestAffinityAcrossSockets: a GPU whose only NIC is on the other socket is
// paired with it at system locality, and the preflight warns.
func TestAffinityAcrossSockets(t *testing.T) {
	gpus := []GPU{{Node: 2, NUMANode: 0, pciPath: []string{"pci0000:00", "0000:00:01.1", "0000:03:00.0"}}}
	nics := []NIC{{Name: "ionic_0", NUMANode: 1, pciPath: []string{"pci0000:80", "0000:80:01.1", "0000:81:00.0"}, Ports: []Port{{
		Number: 1, State: PortState{Code: 4, Name: "ACTIVE"}, LinkLayer: "InfiniBand"}}}}
	aff := affinity(gpus, nics)
	if len(aff) != 1 || aff[0].Locality != LocalitySystem || aff[0].NICs[0] != "ionic_0" {
		t.Fatalf("affinity %+v", aff)
	}
	r := Preflight(Node{GPUs: gpus, NICs: nics, Affinity: aff}, PreflightInput{Role: "decode", AdvertiseHost: "10.0.0.5"})
	if r.Verdict != VerdictPass || strings.Join(codes(r, SeverityWarn), ",") != "gpu_nic_far" {
		t.Fatalf("verdict %q warnings %v", r.Verdict, codes(r, SeverityWarn))
	}
	// Sharing only the root complex is not sharing a bridge.
	if d := sharedBridges([]string{"pci0000:00", "0000:00:01.1", "a"}, []string{"pci0000:00", "0000:00:03.1", "b"}); d != 0 {
		t.Fatalf("sharedBridges across root ports = %d", d)
	}
}

// TestPreflightLinkLocalGIDsOnly: active RoCE ports whose GIDs are all
// link-local or RoCE v1 reach only the local L2 segment: a warning.
func TestPreflightLinkLocalGIDsOnly(t *testing.T) {
	n := discover(t, "mi355x")
	for i := range n.NICs {
		n.NICs[i].Ports[0].GIDs = n.NICs[i].Ports[0].GIDs[:3] // drop the IPv4 RoCE v2 GID
	}
	r := Preflight(n, PreflightInput{Role: "prefill", AdvertiseHost: "10.16.0.11"})
	if r.Verdict != VerdictPass || strings.Join(codes(r, SeverityWarn), ",") != "no_routable_gid" {
		t.Fatalf("verdict %q warnings %v", r.Verdict, codes(r, SeverityWarn))
	}
}
