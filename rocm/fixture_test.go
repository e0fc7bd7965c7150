package rocm

import (
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the fixture trees and golden files in testdata")

// tree is a sysfs fixture: files (path → content) and symlinks (path →
// target, relative as sysfs's are), paths relative to the sysfs root.
type tree struct {
	files map[string]string
	links map[string]string
}

func newTree() *tree { return &tree{files: map[string]string{}, links: map[string]string{}} }

func (t *tree) file(path, content string) { t.files[path] = content }

func (t *tree) link(path, target string) { t.links[path] = target }

// kfdCPU adds a CPU node to the KFD topology.
func (t *tree) kfdCPU(node, cores, coreBase int) {
	dir := fmt.Sprintf("class/kfd/kfd/topology/nodes/%d", node)
	t.file(dir+"/gpu_id", "0\n")
	t.file(dir+"/name", "\n")
	t.file(dir+"/properties", fmt.Sprintf("cpu_cores_count %d\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\nio_links_count 0\n"+
		"p2p_links_count 0\ncpu_core_id_base %d\nsimd_id_base 0\nmax_waves_per_simd 0\nlds_size_in_kb 0\ngds_size_in_kb 0\n"+
		"num_gws 0\nwave_front_size 0\narray_count 0\nsimd_arrays_per_engine 0\ncu_per_simd_array 0\nsimd_per_cu 0\n"+
		"max_slots_scratch_cu 0\ngfx_target_version 0\nvendor_id 0\ndevice_id 0\nlocation_id 0\ndomain 0\ndrm_render_minor 0\n"+
		"hive_id 0\nnum_sdma_engines 0\nnum_sdma_xgmi_engines 0\nnum_sdma_queues_per_engine 0\nnum_cp_queues 0\n"+
		"max_engine_clk_ccompute 3700\n", cores, coreBase))
	t.file(dir+"/mem_banks/0/properties", "heap_type 0\nsize_in_bytes 811748818944\nflags 0\nwidth 64\nmem_clk_max 6400\n")
}

// gpuSpec is one GPU of a fixture.
type gpuSpec struct {
	node, gpuID, gfx, simds, deviceID, renderMinor int
	vram                                           uint64
	bus, numa                                      int
	pciPath                                        string // bridges from the root complex, "pci0000:00/0000:00:01.1/..."
	name                                           string
}

func (t *tree) kfdGPU(g gpuSpec) {
	dir := fmt.Sprintf("class/kfd/kfd/topology/nodes/%d", g.node)
	t.file(dir+"/gpu_id", fmt.Sprintf("%d\n", g.gpuID))
	t.file(dir+"/name", g.name+"\n")
	t.file(dir+"/properties", fmt.Sprintf("cpu_cores_count 0\nsimd_count %d\nmem_banks_count 1\ncaches_count 0\nio_links_count 1\n"+
		"p2p_links_count 7\ncpu_core_id_base 0\nsimd_id_base 2147487744\nmax_waves_per_simd 8\nlds_size_in_kb 160\ngds_size_in_kb 0\n"+
		"num_gws 64\nwave_front_size 64\narray_count 32\nsimd_arrays_per_engine 1\ncu_per_simd_array 8\nsimd_per_cu 4\n"+
		"max_slots_scratch_cu 32\ngfx_target_version %d\nvendor_id 4098\ndevice_id %d\nlocation_id %d\ndomain 0\n"+
		"drm_render_minor %d\nhive_id 4660\nnum_sdma_engines 2\nnum_sdma_xgmi_engines 14\nnum_sdma_queues_per_engine 8\n"+
		"num_cp_queues 24\nmax_engine_clk_fcompute 2400\nlocal_mem_size 0\nfw_version 177\ncapability 746554112\n"+
		"sdma_fw_version 22\nunique_id %d\nnum_xcc 8\nmax_engine_clk_ccompute 3700\n",
		g.simds, g.gfx, g.deviceID, g.bus<<8, g.renderMinor, 0x5a00+g.node))
	t.file(dir+"/mem_banks/0/properties", fmt.Sprintf("heap_type 1\nsize_in_bytes %d\nflags 0\nwidth 8192\nmem_clk_max 2000\n", g.vram))
	t.file(dir+"/io_links/0/properties", fmt.Sprintf("type 2\nversion_major 0\nversion_minor 0\nnode_from %d\nnode_to %d\nweight 20\n"+
		"min_latency 0\nmax_latency 0\nmin_bandwidth 312\nmax_bandwidth 64000\nrecommended_transfer_size 0\nflags 3\n", g.node, g.numa))
	t.pciDevice(g.pciPath, fmt.Sprintf("0000:%02x:00.0", g.bus), g.numa, "amdgpu")
}

// pciDevice adds a PCI device below devices/ with the bus/pci/devices
// symlink to it.
func (t *tree) pciDevice(bridges, addr string, numa int, driver string) string {
	dir := "devices/" + bridges + "/" + addr
	t.file(dir+"/numa_node", fmt.Sprintf("%d\n", numa))
	t.file(dir+"/vendor", "0x1002\n")
	t.link(dir+"/driver", strings.Repeat("../", strings.Count(dir, "/")+1)+"bus/pci/drivers/"+driver)
	t.link("bus/pci/devices/"+addr, "../../../"+dir)
	return dir
}

// portSpec is one port of a fixture NIC.
type portSpec struct {
	state, phys string // "4: ACTIVE", "5: LinkUp"
	linkLayer   string
	rate        string
	gids        []gidSpec
}

type gidSpec struct {
	gid, typ, ndev string
}

func (t *tree) nic(name, bridges, addr string, numa int, driver, fw, guid string, ports ...portSpec) {
	devDir := t.pciDevice(bridges, addr, numa, driver)
	dir := "class/infiniband/" + name
	t.link(dir+"/device", "../../../"+devDir)
	t.file(dir+"/fw_ver", fw+"\n")
	t.file(dir+"/node_guid", guid+"\n")
	t.file(dir+"/node_type", "1: CA\n")
	for i, p := range ports {
		pdir := fmt.Sprintf("%s/ports/%d", dir, i+1)
		t.file(pdir+"/state", p.state+"\n")
		t.file(pdir+"/phys_state", p.phys+"\n")
		t.file(pdir+"/link_layer", p.linkLayer+"\n")
		t.file(pdir+"/rate", p.rate+"\n")
		for j, g := range p.gids {
			t.file(fmt.Sprintf("%s/gids/%d", pdir, j), g.gid+"\n")
			if g.typ != "" {
				t.file(fmt.Sprintf("%s/gid_attrs/types/%d", pdir, j), g.typ+"\n")
				t.file(fmt.Sprintf("%s/gid_attrs/ndevs/%d", pdir, j), g.ndev+"\n")
			}
		}
		// Two unused slots, as the kernel shows them.
		for j := len(p.gids); j < len(p.gids)+2; j++ {
			t.file(fmt.Sprintf("%s/gids/%d", pdir, j), "0000:0000:0000:0000:0000:0000:0000:0000\n")
		}
	}
}

const zeroGIDPrefix = "fe80:0000:0000:0000:"

// mi355x is an 8-GPU MI355X node (gfx950, 256 CUs, 288 GiB HBM each) with
// one AMD Pollara (ionic) RoCE NIC behind the same PCIe switch as each GPU,
// four GPU/NIC pairs per socket.
func mi355x() *tree {
	t := newTree()
	t.kfdCPU(0, 128, 0)
	t.kfdCPU(1, 128, 128)
	for i := range 8 {
		numa := i / 4
		root := fmt.Sprintf("pci%04x:%02x", 0, 0x00+0x20*i)
		sw := fmt.Sprintf("%s/0000:%02x:01.1/0000:%02x:00.0", root, 0x20*i, 0x20*i+1)
		gpuBus, nicBus := 0x20*i+3, 0x20*i+4
		t.kfdGPU(gpuSpec{
			node: 2 + i, gpuID: 10000 + 1111*i, gfx: 90500, simds: 1024, deviceID: 0x75a3, renderMinor: 128 + i,
			vram: 288 << 30, bus: gpuBus, numa: numa, name: "gfx950",
			pciPath: sw + fmt.Sprintf("/0000:%02x:00.0", 0x20*i+2),
		})
		ip := fmt.Sprintf("0000:0000:0000:0000:0000:ffff:0a%02x:%02x0b", 0x10+i, i)
		ndev := fmt.Sprintf("benic%dp1", i+1)
		t.nic(fmt.Sprintf("ionic_%d", i), sw+fmt.Sprintf("/0000:%02x:04.0", 0x20*i+2), fmt.Sprintf("0000:%02x:00.0", nicBus),
			numa, "ionic", "1.117.1-a-42", fmt.Sprintf("0490:81ff:fe%02x:%02x00", 0x20+i, i),
			portSpec{state: "4: ACTIVE", phys: "5: LinkUp", linkLayer: "Ethernet", rate: "400 Gb/sec (1X NDR)", gids: []gidSpec{
				{gid: fmt.Sprintf("%s0690:81ff:fe%02x:%02x00", zeroGIDPrefix, 0x20+i, i), typ: GIDTypeRoCEv1, ndev: ndev},
				{gid: fmt.Sprintf("%s0690:81ff:fe%02x:%02x00", zeroGIDPrefix, 0x20+i, i), typ: GIDTypeRoCEv2, ndev: ndev},
				{gid: ip, typ: GIDTypeRoCEv1, ndev: ndev},
				{gid: ip, typ: GIDTypeRoCEv2, ndev: ndev},
			}})
	}
	return t
}

// noRDMA is a 4-GPU MI300X node (gfx942) without any RDMA device: no
// class/infiniband at all, as on a machine without RDMA drivers.
func noRDMA() *tree {
	t := newTree()
	t.kfdCPU(0, 96, 0)
	for i := range 4 {
		t.kfdGPU(gpuSpec{
			node: 1 + i, gpuID: 20000 + 7*i, gfx: 90402, simds: 1216, deviceID: 0x74a1, renderMinor: 128 + i,
			vram: 192 << 30, bus: 0x10 + 0x10*i, numa: 0, name: "gfx942",
			pciPath: fmt.Sprintf("pci0000:%02x/0000:%02x:01.1", 0x10*i, 0x10*i),
		})
	}
	return t
}

// portDown is a 2-GPU MI300X node with one ConnectX InfiniBand NIC whose only
// port is down (no cable: phys_state Polling).
func portDown() *tree {
	t := newTree()
	t.kfdCPU(0, 64, 0)
	for i := range 2 {
		t.kfdGPU(gpuSpec{
			node: 1 + i, gpuID: 30000 + 13*i, gfx: 90402, simds: 1216, deviceID: 0x74a1, renderMinor: 128 + i,
			vram: 192 << 30, bus: 0x20 + 0x20*i, numa: 0, name: "gfx942",
			pciPath: fmt.Sprintf("pci0000:%02x/0000:%02x:01.1", 0x20*i, 0x20*i),
		})
	}
	t.nic("mlx5_0", "pci0000:80/0000:80:01.1", "0000:81:00.0", 0, "mlx5_core", "28.39.1002", "a088:c203:0012:3456",
		portSpec{state: "1: DOWN", phys: "2: Polling", linkLayer: "InfiniBand", rate: "10 Gb/sec (4X SDR)", gids: []gidSpec{
			{gid: zeroGIDPrefix + "a288:c2ff:fe12:3456"},
		}})
	return t
}

// fixtures are the trees in testdata, by directory name.
var fixtures = map[string]func() *tree{
	"mi355x":   mi355x,
	"nordma":   noRDMA,
	"portdown": portDown,
}

func (t *tree) write(root string) error {
	for _, p := range slices.Sorted(maps.Keys(t.files)) {
		path := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(t.files[p]), 0o644); err != nil {
			return err
		}
	}
	for _, p := range slices.Sorted(maps.Keys(t.links)) {
		path := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.Symlink(t.links[p], path); err != nil {
			return err
		}
	}
	return nil
}

// readTree reads a tree back from disk.
func readTree(root string) (*tree, error) {
	t := newTree()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.Type()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(path)
			t.links[rel] = target
			return err
		}
		b, err := os.ReadFile(path)
		t.files[rel] = string(b)
		return err
	})
	return t, err
}

func fixtureRoot(name string) string { return filepath.Join("testdata", "sysfs", name) }

// TestFixtureTrees keeps the committed trees in testdata/sysfs equal to the
// generators above (go test -run TestFixtureTrees -update rewrites them).
func TestFixtureTrees(t *testing.T) {
	for name, gen := range fixtures {
		t.Run(name, func(t *testing.T) {
			want := gen()
			root := fixtureRoot(name)
			if *update {
				if err := os.RemoveAll(root); err != nil {
					t.Fatal(err)
				}
				if err := want.write(root); err != nil {
					t.Fatal(err)
				}
			}
			got, err := readTree(root)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got.files, want.files) || !maps.Equal(got.links, want.links) {
				var diff []string
				for p := range want.files {
					if got.files[p] != want.files[p] {
						diff = append(diff, p)
					}
				}
				for p := range got.files {
					if _, ok := want.files[p]; !ok {
						diff = append(diff, p+" (extra)")
					}
				}
				for p := range want.links {
					if got.links[p] != want.links[p] {
						diff = append(diff, p+" (link)")
					}
				}
				slices.Sort(diff)
				t.Fatalf("%s differs from its generator (run with -update): %s", root, strings.Join(diff, ", "))
			}
		})
	}
}
