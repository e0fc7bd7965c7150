package rocm

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Heap types of a KFD memory bank that are the GPU's own memory (HBM):
// HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC and _PRIVATE.
const (
	heapFBPublic  = 1
	heapFBPrivate = 2
)

// Node is what Discover found on one machine.
type Node struct {
	GPUs []GPU `json:"gpus"`
	NICs []NIC `json:"nics"`
	// Affinity pairs each GPU with its nearest RDMA device(s).
	Affinity []Affinity `json:"affinity"`
}

// GPU is one KFD topology node with compute units (CPU nodes are left out).
type GPU struct {
	Node             int    `json:"kfd_node"` // KFD topology node id
	GPUID            uint64 `json:"gpu_id"`   // KFD gpu_id (what HIP and the KFD ioctls name it by)
	Name             string `json:"name"`     // KFD node name, e.g. "gfx950"
	GfxTarget        string `json:"gfx_target"`
	GfxTargetVersion uint64 `json:"gfx_target_version"`
	SIMDs            uint64 `json:"simd_count"`
	ComputeUnits     uint64 `json:"compute_units"`
	VRAMBytes        uint64 `json:"vram_bytes"`
	VendorID         uint64 `json:"vendor_id"`
	DeviceID         uint64 `json:"device_id"`
	PCIAddress       string `json:"pci_address"`
	NUMANode         int    `json:"numa_node"` // -1 unknown
	DRMRenderMinor   uint64 `json:"drm_render_minor"`
	pciPath          []string
}

// NIC is one RDMA device under /sys/class/infiniband.
type NIC struct {
	Name       string `json:"name"` // e.g. "ionic_0", "mlx5_0"
	Driver     string `json:"driver,omitempty"`
	Firmware   string `json:"fw_ver,omitempty"`
	NodeGUID   string `json:"node_guid,omitempty"`
	PCIAddress string `json:"pci_address,omitempty"`
	NUMANode   int    `json:"numa_node"` // -1 unknown
	Ports      []Port `json:"ports"`
	pciPath    []string
}

// Port is one port of an RDMA device.
type Port struct {
	Number    int       `json:"port"`
	State     PortState `json:"state"`
	PhysState PortState `json:"phys_state"`
	LinkLayer string    `json:"link_layer"` // "Ethernet" (RoCE) or "InfiniBand"
	Rate      string    `json:"rate,omitempty"`
	GIDs      []GID     `json:"gids"`
}

// GID is one used GID table entry of a port.
type GID struct {
	Index  int        `json:"index"`
	Addr   netip.Addr `json:"gid"`
	Type   string     `json:"type,omitempty"` // GIDTypeRoCEv1 or GIDTypeRoCEv2; empty when not reported
	NetDev string     `json:"netdev,omitempty"`
}

// Routable reports whether the GID can address a peer beyond the local
// link: a RoCE v2 (or InfiniBand) GID that is not link-local.
func (g GID) Routable() bool {
	return !g.Addr.IsLinkLocalUnicast() && g.Type != GIDTypeRoCEv1
}

// Locality of a GPU to a NIC, nearest first.
const (
	LocalityPCIe   = "pcie"   // behind the same PCIe bridge or switch
	LocalityNUMA   = "numa"   // on the same NUMA node
	LocalitySystem = "system" // across the inter-socket link
)

// Affinity names the nearest RDMA devices of one GPU.
type Affinity struct {
	GPU      int      `json:"kfd_node"`
	NICs     []string `json:"nics"`
	Locality string   `json:"locality"`
}

// Discover reads the GPUs and RDMA devices below root, a sysfs mount (/sys
// on a real machine). A missing KFD topology or infiniband class is not an
// error (the node has no GPU or no RDMA); a malformed entry is.
func Discover(root string) (Node, error) {
	var n Node
	var err error
	if n.GPUs, err = discoverGPUs(root); err != nil {
		return Node{}, err
	}
	if n.NICs, err = discoverNICs(root); err != nil {
		return Node{}, err
	}
	n.Affinity = affinity(n.GPUs, n.NICs)
	// Empty rather than nil: a JSON report reads [] for "none".
	if n.GPUs == nil {
		n.GPUs = []GPU{}
	}
	if n.NICs == nil {
		n.NICs = []NIC{}
	}
	if n.Affinity == nil {
		n.Affinity = []Affinity{}
	}
	return n, nil
}

// readAttr reads one sysfs attribute, bounded.
func readAttr(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSysfsFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSysfsFile {
		return nil, fmt.Errorf("%w: %s: longer than %d bytes", ErrSysfs, path, maxSysfsFile)
	}
	return b, nil
}

// numbered lists the entries of dir whose names are decimal numbers, in
// numeric order; a missing dir lists nothing.
func numbered(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		if v, err := strconv.Atoi(e.Name()); err == nil && v >= 0 && strconv.Itoa(v) == e.Name() {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out, nil
}

func discoverGPUs(root string) ([]GPU, error) {
	dir := filepath.Join(root, "class", "kfd", "kfd", "topology", "nodes")
	ids, err := numbered(dir)
	if err != nil {
		return nil, fmt.Errorf("kfd topology: %w", err)
	}
	var gpus []GPU
	for _, id := range ids {
		nodeDir := filepath.Join(dir, strconv.Itoa(id))
		g, ok, err := readGPU(root, nodeDir, id)
		if err != nil {
			return nil, err
		}
		if ok {
			gpus = append(gpus, g)
		}
	}
	return gpus, nil
}

func readGPU(root, dir string, id int) (GPU, bool, error) {
	path := filepath.Join(dir, "properties")
	b, err := readAttr(path)
	if errors.Is(err, fs.ErrPermission) {
		// The KFD hides GPUs outside this container's device cgroup
		// (EPERM): not this worker's GPU.
		return GPU{}, false, nil
	}
	if err != nil {
		return GPU{}, false, fmt.Errorf("kfd node %d: %w", id, err)
	}
	p, err := ParseProperties(b)
	if err != nil {
		return GPU{}, false, fmt.Errorf("%s: %w", path, err)
	}
	if p["simd_count"] == 0 {
		return GPU{}, false, nil // a CPU node
	}
	g := GPU{
		Node:             id,
		GfxTargetVersion: p["gfx_target_version"],
		SIMDs:            p["simd_count"],
		VendorID:         p["vendor_id"],
		DeviceID:         p["device_id"],
		DRMRenderMinor:   p["drm_render_minor"],
		NUMANode:         -1,
	}
	if spc := p["simd_per_cu"]; spc > 0 {
		g.ComputeUnits = g.SIMDs / spc
	}
	if g.GfxTarget, err = GfxTarget(g.GfxTargetVersion); err != nil {
		return GPU{}, false, fmt.Errorf("%s: %w", path, err)
	}
	if g.PCIAddress, err = PCIAddress(p["domain"], p["location_id"]); err != nil {
		return GPU{}, false, fmt.Errorf("%s: %w", path, err)
	}
	if b, err := readAttr(filepath.Join(dir, "gpu_id")); err == nil {
		if g.GPUID, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return GPU{}, false, fmt.Errorf("%w: %s: gpu_id %q", ErrSysfs, dir, clip(string(b)))
		}
	}
	if b, err := readAttr(filepath.Join(dir, "name")); err == nil {
		if g.Name, err = ParseWord(b); err != nil {
			return GPU{}, false, fmt.Errorf("%s/name: %w", dir, err)
		}
	}
	banks, err := numbered(filepath.Join(dir, "mem_banks"))
	if err != nil {
		return GPU{}, false, fmt.Errorf("kfd node %d: %w", id, err)
	}
	for _, bank := range banks {
		path := filepath.Join(dir, "mem_banks", strconv.Itoa(bank), "properties")
		b, err := readAttr(path)
		if err != nil {
			return GPU{}, false, fmt.Errorf("kfd node %d: %w", id, err)
		}
		mp, err := ParseProperties(b)
		if err != nil {
			return GPU{}, false, fmt.Errorf("%s: %w", path, err)
		}
		if h := mp["heap_type"]; h == heapFBPublic || h == heapFBPrivate {
			if g.VRAMBytes+mp["size_in_bytes"] < g.VRAMBytes {
				return GPU{}, false, fmt.Errorf("%w: %s: memory size overflows", ErrSysfs, path)
			}
			g.VRAMBytes += mp["size_in_bytes"]
		}
	}
	pci := filepath.Join(root, "bus", "pci", "devices", g.PCIAddress)
	if g.NUMANode, g.pciPath, err = pciPlace(root, pci); err != nil {
		return GPU{}, false, err
	}
	return g, true, nil
}

// pciPlace reads a PCI device's NUMA node and its path of bridges from the
// root complex down (resolved through sysfs's symlinks). A device sysfs does
// not show is -1 and no path.
func pciPlace(root, dev string) (int, []string, error) {
	numa := -1
	// An unreadable numa_node is an unknown one.
	if b, err := readAttr(filepath.Join(dev, "numa_node")); err == nil {
		if numa, err = ParseInt(b); err != nil {
			return 0, nil, fmt.Errorf("%s/numa_node: %w", dev, err)
		}
	}
	real, err := filepath.EvalSymlinks(dev)
	if err != nil {
		return numa, nil, nil
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return numa, nil, nil
	}
	rel, err := filepath.Rel(filepath.Join(realRoot, "devices"), real)
	if err != nil || strings.HasPrefix(rel, "..") {
		return numa, nil, nil
	}
	return numa, strings.Split(filepath.ToSlash(rel), "/"), nil
}

func discoverNICs(root string) ([]NIC, error) {
	dir := filepath.Join(root, "class", "infiniband")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("infiniband: %w", err)
	}
	var nics []NIC
	for _, e := range ents {
		nic, err := readNIC(root, filepath.Join(dir, e.Name()), e.Name())
		if err != nil {
			return nil, err
		}
		nics = append(nics, nic)
	}
	return nics, nil
}

// optionalWord reads a one-word attribute that may be absent or
// unreadable: the kernel answers EINVAL for attributes that do not apply
// (the netdev of an InfiniBand GID), which is the same as absent here.
func optionalWord(path string) (string, error) {
	b, err := readAttr(path)
	if err != nil {
		return "", nil
	}
	s, err := ParseWord(b)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

func readNIC(root, dir, name string) (NIC, error) {
	if _, err := ParseWord([]byte(name)); err != nil {
		return NIC{}, fmt.Errorf("infiniband device name: %w", err)
	}
	nic := NIC{Name: name, NUMANode: -1, Ports: []Port{}}
	var err error
	if nic.Firmware, err = optionalWord(filepath.Join(dir, "fw_ver")); err != nil {
		return NIC{}, err
	}
	if nic.NodeGUID, err = optionalWord(filepath.Join(dir, "node_guid")); err != nil {
		return NIC{}, err
	}
	dev := filepath.Join(dir, "device")
	if real, err := filepath.EvalSymlinks(dev); err == nil {
		nic.PCIAddress = filepath.Base(real)
		if drv, err := os.Readlink(filepath.Join(dev, "driver")); err == nil {
			nic.Driver = filepath.Base(drv)
		}
		if nic.NUMANode, nic.pciPath, err = pciPlace(root, dev); err != nil {
			return NIC{}, err
		}
	}
	ports, err := numbered(filepath.Join(dir, "ports"))
	if err != nil {
		return NIC{}, fmt.Errorf("%s: %w", name, err)
	}
	for _, num := range ports {
		p, err := readPort(filepath.Join(dir, "ports", strconv.Itoa(num)), num)
		if err != nil {
			return NIC{}, fmt.Errorf("%s: %w", name, err)
		}
		nic.Ports = append(nic.Ports, p)
	}
	return nic, nil
}

func readPort(dir string, num int) (Port, error) {
	p := Port{Number: num, GIDs: []GID{}}
	b, err := readAttr(filepath.Join(dir, "state"))
	if err != nil {
		return Port{}, fmt.Errorf("port %d: %w", num, err)
	}
	if p.State, err = ParseNumbered(b); err != nil {
		return Port{}, fmt.Errorf("port %d state: %w", num, err)
	}
	if b, err := readAttr(filepath.Join(dir, "phys_state")); err == nil {
		if p.PhysState, err = ParseNumbered(b); err != nil {
			return Port{}, fmt.Errorf("port %d phys_state: %w", num, err)
		}
	}
	if p.LinkLayer, err = optionalWord(filepath.Join(dir, "link_layer")); err != nil {
		return Port{}, fmt.Errorf("port %d: %w", num, err)
	}
	if b, err := readAttr(filepath.Join(dir, "rate")); err == nil {
		if p.Rate, err = ParseLine(b); err != nil {
			return Port{}, fmt.Errorf("port %d rate: %w", num, err)
		}
	}
	idx, err := numbered(filepath.Join(dir, "gids"))
	if err != nil {
		return Port{}, fmt.Errorf("port %d: %w", num, err)
	}
	for _, i := range idx {
		b, err := readAttr(filepath.Join(dir, "gids", strconv.Itoa(i)))
		if err != nil {
			return Port{}, fmt.Errorf("port %d gid %d: %w", num, i, err)
		}
		a, err := ParseGID(b)
		if err != nil {
			return Port{}, fmt.Errorf("port %d gid %d: %w", num, i, err)
		}
		if a.IsUnspecified() {
			continue // an unused slot
		}
		g := GID{Index: i, Addr: a}
		// Reading the type of a slot the kernel has no attributes for
		// fails (EINVAL); such a GID simply has no type.
		if b, err := readAttr(filepath.Join(dir, "gid_attrs", "types", strconv.Itoa(i))); err == nil {
			if g.Type, err = ParseGIDType(b); err != nil {
				return Port{}, fmt.Errorf("port %d gid %d: %w", num, i, err)
			}
		}
		if g.NetDev, err = optionalWord(filepath.Join(dir, "gid_attrs", "ndevs", strconv.Itoa(i))); err != nil {
			return Port{}, fmt.Errorf("port %d gid %d: %w", num, i, err)
		}
		p.GIDs = append(p.GIDs, g)
	}
	return p, nil
}

// affinity pairs each GPU with the NICs nearest to it: those sharing the
// deepest PCIe bridge, else those on its NUMA node, else all of them.
func affinity(gpus []GPU, nics []NIC) []Affinity {
	if len(nics) == 0 {
		return nil
	}
	out := make([]Affinity, 0, len(gpus))
	for _, g := range gpus {
		best, bestDepth := []string(nil), 0
		for _, n := range nics {
			d := sharedBridges(g.pciPath, n.pciPath)
			switch {
			case d > bestDepth:
				best, bestDepth = []string{n.Name}, d
			case d == bestDepth && d > 0:
				best = append(best, n.Name)
			}
		}
		if bestDepth > 0 {
			out = append(out, Affinity{GPU: g.Node, NICs: best, Locality: LocalityPCIe})
			continue
		}
		var numa []string
		for _, n := range nics {
			if g.NUMANode >= 0 && n.NUMANode == g.NUMANode {
				numa = append(numa, n.Name)
			}
		}
		if len(numa) > 0 {
			out = append(out, Affinity{GPU: g.Node, NICs: numa, Locality: LocalityNUMA})
			continue
		}
		all := make([]string, 0, len(nics))
		for _, n := range nics {
			all = append(all, n.Name)
		}
		out = append(out, Affinity{GPU: g.Node, NICs: all, Locality: LocalitySystem})
	}
	return out
}

// sharedBridges counts the PCI bridges two device paths share below the
// root complex ("pci0000:00", the first element); the devices themselves
// (the last elements) do not count.
func sharedBridges(a, b []string) int {
	if len(a) < 3 || len(b) < 3 || a[0] != b[0] {
		return 0
	}
	n := 0
	for i := 1; i < len(a)-1 && i < len(b)-1; i++ {
		if a[i] != b[i] {
			break
		}
		n++
	}
	return n
}
