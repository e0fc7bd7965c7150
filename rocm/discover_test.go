package rocm

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestDiscoverMI355X(t *testing.T) {
	n, err := Discover(fixtureRoot("mi355x"))
	if err != nil {
		t.Fatal(err)
	}
	if len(n.GPUs) != 8 || len(n.NICs) != 8 {
		t.Fatalf("found %d GPUs and %d NICs, want 8 and 8", len(n.GPUs), len(n.NICs))
	}
	g := n.GPUs[5]
	if g.Node != 7 || g.GfxTarget != "gfx950" || g.ComputeUnits != 256 || g.VRAMBytes != 288<<30 ||
		g.PCIAddress != "0000:a3:00.0" || g.NUMANode != 1 || g.GPUID != 10000+5*1111 || g.DeviceID != 0x75a3 || g.Name != "gfx950" {
		t.Fatalf("GPU 5: %+v", g)
	}
	nic := n.NICs[2]
	if nic.Name != "ionic_2" || nic.Driver != "ionic" || nic.PCIAddress != "0000:44:00.0" || nic.NUMANode != 0 || nic.Firmware != "1.117.1-a-42" {
		t.Fatalf("NIC 2: %+v", nic)
	}
	if len(nic.Ports) != 1 {
		t.Fatalf("NIC 2 ports: %+v", nic.Ports)
	}
	p := nic.Ports[0]
	if !p.State.Active() || p.PhysState.Name != "LinkUp" || p.LinkLayer != "Ethernet" || len(p.GIDs) != 4 {
		t.Fatalf("NIC 2 port: %+v", p)
	}
	v2 := p.GIDs[3]
	if v2.Type != GIDTypeRoCEv2 || v2.Addr.Unmap().String() != "10.18.2.11" || v2.NetDev != "benic3p1" || !v2.Routable() {
		t.Fatalf("NIC 2 GID 3: %+v", v2)
	}
	if p.GIDs[1].Routable() || p.GIDs[2].Routable() {
		t.Fatalf("link-local or RoCE v1 GIDs must not be routable: %+v", p.GIDs)
	}
	// Each GPU shares a PCIe switch with exactly the NIC of the same index.
	if len(n.Affinity) != 8 {
		t.Fatalf("affinity: %+v", n.Affinity)
	}
	for i, a := range n.Affinity {
		if a.GPU != 2+i || a.Locality != LocalityPCIe || !slices.Equal(a.NICs, []string{n.NICs[i].Name}) {
			t.Fatalf("affinity of GPU %d: %+v", i, a)
		}
	}
}

func TestDiscoverNoRDMA(t *testing.T) {
	n, err := Discover(fixtureRoot("nordma"))
	if err != nil {
		t.Fatal(err)
	}
	if len(n.GPUs) != 4 || len(n.NICs) != 0 || len(n.Affinity) != 0 {
		t.Fatalf("node: %+v", n)
	}
	if g := n.GPUs[0]; g.GfxTarget != "gfx942" || g.ComputeUnits != 304 || g.VRAMBytes != 192<<30 {
		t.Fatalf("GPU 0: %+v", g)
	}
}

func TestDiscoverPortDown(t *testing.T) {
	n, err := Discover(fixtureRoot("portdown"))
	if err != nil {
		t.Fatal(err)
	}
	if len(n.NICs) != 1 || len(n.NICs[0].Ports) != 1 {
		t.Fatalf("NICs: %+v", n.NICs)
	}
	p := n.NICs[0].Ports[0]
	if p.State.Active() || p.State.Name != "DOWN" || p.PhysState.Name != "Polling" || p.LinkLayer != "InfiniBand" {
		t.Fatalf("port: %+v", p)
	}
	if len(p.GIDs) != 1 || p.GIDs[0].Type != "" {
		t.Fatalf("GIDs: %+v", p.GIDs)
	}
	// The NIC is on another root port than both GPUs: NUMA locality only.
	for _, a := range n.Affinity {
		if a.Locality != LocalityNUMA || !slices.Equal(a.NICs, []string{"mlx5_0"}) {
			t.Fatalf("affinity: %+v", a)
		}
	}
}

func TestDiscoverEmptyRoot(t *testing.T) {
	n, err := Discover(t.TempDir())
	if err != nil || len(n.GPUs) != 0 || len(n.NICs) != 0 {
		t.Fatalf("empty root: %+v, %v", n, err)
	}
}

// TestDiscoverMalformed corrupts one file of a fixture at a time: each is
// reported as ErrSysfs naming the file's place, never a panic or a silent
// zero.
func TestDiscoverMalformed(t *testing.T) {
	cases := []struct{ path, content, want string }{
		{"class/kfd/kfd/topology/nodes/2/properties", "simd_count lots\n", "simd_count"},
		{"class/kfd/kfd/topology/nodes/2/properties", "simd_count 4\nsimd_count 4\n", "twice"},
		{"class/kfd/kfd/topology/nodes/2/properties", "simd_count 4\ngfx_target_version 7\n", "gfx_target_version"},
		{"class/kfd/kfd/topology/nodes/3/mem_banks/0/properties", "heap_type 1\nsize_in_bytes -1\n", "size_in_bytes"},
		{"class/infiniband/ionic_1/ports/1/state", "ACTIVE\n", "state"},
		{"class/infiniband/ionic_1/ports/1/gids/3", "10.0.0.1\n", "gid 3"},
		{"class/infiniband/ionic_1/ports/1/gid_attrs/types/3", "RoCE v3\n", "GID type"},
		{"class/infiniband/ionic_1/ports/1/link_layer", "Ether net\n", "link_layer"},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			root := t.TempDir()
			if err := mi355x().write(root); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, c.path), []byte(c.content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Discover(root)
			if !errors.Is(err, ErrSysfs) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Discover: %v, want ErrSysfs mentioning %q", err, c.want)
			}
		})
	}
}

func TestGfxTarget(t *testing.T) {
	for v, want := range map[uint64]string{90402: "gfx942", 90010: "gfx90a", 90500: "gfx950", 110000: "gfx1100", 100300: "gfx1030", 120001: "gfx1201"} {
		if got, err := GfxTarget(v); err != nil || got != want {
			t.Errorf("GfxTarget(%d) = %q, %v; want %q", v, got, err, want)
		}
	}
	for _, v := range []uint64{0, 99, 91600, 90016, 1000000} {
		if got, err := GfxTarget(v); !errors.Is(err, ErrSysfs) {
			t.Errorf("GfxTarget(%d) = %q, %v; want ErrSysfs", v, got, err)
		}
	}
}

func TestPCIAddress(t *testing.T) {
	got, err := PCIAddress(1, 0xc1<<8|2<<3|1)
	if err != nil || got != "0001:c1:02.1" {
		t.Fatalf("PCIAddress = %q, %v", got, err)
	}
	if _, err := PCIAddress(0x10000, 0); !errors.Is(err, ErrSysfs) {
		t.Fatalf("domain out of range: %v", err)
	}
}

func TestParseNumbered(t *testing.T) {
	s, err := ParseNumbered([]byte("5: ACTIVE_DEFER\n"))
	if err != nil || s.Code != 5 || s.Name != "ACTIVE_DEFER" || s.Active() {
		t.Fatalf("%+v, %v", s, err)
	}
	for _, bad := range []string{"", "4", ": ACTIVE", "x: ACTIVE", "4: ", "-1: DOWN", "4: A\x01"} {
		if _, err := ParseNumbered([]byte(bad)); !errors.Is(err, ErrSysfs) {
			t.Errorf("ParseNumbered(%q): %v, want ErrSysfs", bad, err)
		}
	}
}

func TestParseGID(t *testing.T) {
	a, err := ParseGID([]byte("0000:0000:0000:0000:0000:ffff:0a00:0001\n"))
	if err != nil || a.Unmap().String() != "10.0.0.1" {
		t.Fatalf("%v, %v", a, err)
	}
	for _, bad := range []string{"::1", "fe80::1", "fe80:0000:0000:0000:0000:0000:0000:000g", "fe80:0000:0000:0000:0000:0000:0000:0000:0000"} {
		if _, err := ParseGID([]byte(bad)); !errors.Is(err, ErrSysfs) {
			t.Errorf("ParseGID(%q): %v, want ErrSysfs", bad, err)
		}
	}
}

func TestParseProperties(t *testing.T) {
	p, err := ParseProperties([]byte("simd_count 1024\nhive_id 18446744073709551615\n\n"))
	if err != nil || p["simd_count"] != 1024 || p["hive_id"] != 1<<64-1 || len(p) != 2 {
		t.Fatalf("%v, %v", p, err)
	}
	for _, bad := range []string{"simd_count\n", "Simd 1\n", "simd_count 1 2\n", "a -1\n", " a 1\n"} {
		if _, err := ParseProperties([]byte(bad)); !errors.Is(err, ErrSysfs) {
			t.Errorf("ParseProperties(%q): %v, want ErrSysfs", bad, err)
		}
	}
}

// TestDiscoverUnreadable: an attribute the kernel refuses to read (EINVAL
// for the netdev of a GID it does not apply to) is absent, not an error.
// Unreadable is simulated with a directory in the file's place, which
// read(2) refuses with EISDIR.
func TestDiscoverUnreadable(t *testing.T) {
	root := t.TempDir()
	if err := mi355x().write(root); err != nil {
		t.Fatal(err)
	}
	ndev := filepath.Join(root, "class/infiniband/ionic_0/ports/1/gid_attrs/ndevs/3")
	if err := os.Remove(ndev); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(ndev, 0o755); err != nil {
		t.Fatal(err)
	}
	n, err := Discover(root)
	if err != nil {
		t.Fatal(err)
	}
	if g := n.NICs[0].Ports[0].GIDs[3]; g.NetDev != "" || g.Type != GIDTypeRoCEv2 {
		t.Fatalf("GID with an unreadable netdev: %+v", g)
	}
}
