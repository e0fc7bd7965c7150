package rocm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
)

// ErrPreflight is wrapped when a prefill or decode worker must not register:
// KV would move over TCP, or to an address other hosts cannot reach.
var ErrPreflight = errors.New("PD preflight failed")

// Severity of a finding.
type Severity string

// Severities, least severe first.
const (
	SeverityInfo  Severity = "info"
	SeverityWarn  Severity = "warn"
	SeverityBlock Severity = "block"
)

// Finding is one thing the preflight noticed.
type Finding struct {
	Severity Severity `json:"severity"`
	Code     string   `json:"code"` // stable identifier, e.g. "no_rdma_device"
	Message  string   `json:"message"`
}

// Verdicts.
const (
	VerdictPass     = "pass"
	VerdictAllowTCP = "pass (TCP allowed)"
	VerdictFail     = "fail"
)

// PreflightInput is the worker side of a preflight.
type PreflightInput struct {
	SysfsRoot     string // where Discover read the node
	Role          string // "prefill", "decode", "mixed"; a PD role makes RDMA required
	AdvertiseHost string // the host the worker advertises
	AllowTCP      bool   // --disaggregation-allow-tcp
}

// Report is the outcome of a preflight.
type Report struct {
	SysfsRoot     string    `json:"sysfs_root"`
	Role          string    `json:"role"`
	AdvertiseHost string    `json:"advertise_host"`
	AllowTCP      bool      `json:"disaggregation_allow_tcp"`
	Node          Node      `json:"node"`
	Findings      []Finding `json:"findings"`
	Verdict       string    `json:"verdict"`
}

// pdRole reports whether a role moves KV between hosts.
func pdRole(role string) bool { return role == "prefill" || role == "decode" || role == RoleAnyPD }

// RoleAnyPD is the role of a node-only preflight (no engine given): judged
// as for a prefill or decode worker.
const RoleAnyPD = "prefill or decode"

// Preflight judges whether a worker with in's role and address can serve on
// node. For a prefill or decode worker, an unroutable advertise address or
// a node without an active RDMA port is blocking unless in.AllowTCP, which
// turns those into warnings; for a mixed worker they are information.
func Preflight(node Node, in PreflightInput) Report {
	r := Report{SysfsRoot: in.SysfsRoot, Role: in.Role, AdvertiseHost: in.AdvertiseHost, AllowTCP: in.AllowTCP, Node: node, Findings: []Finding{}}
	pd := pdRole(in.Role)
	// needed is the severity of what a PD worker cannot do without.
	needed := SeverityInfo
	if pd {
		needed = SeverityBlock
		if in.AllowTCP {
			needed = SeverityWarn
		}
	}
	add := func(s Severity, code, format string, args ...any) {
		r.Findings = append(r.Findings, Finding{Severity: s, Code: code, Message: fmt.Sprintf(format, args...)})
	}

	if len(node.GPUs) == 0 {
		add(SeverityInfo, "no_gpu", "no GPU in the KFD topology (%s/class/kfd/kfd/topology/nodes)", in.SysfsRoot)
	} else {
		add(SeverityInfo, "gpus", "%d GPU(s): %s", len(node.GPUs), gpuSummary(node.GPUs))
	}

	if why := unroutable(in.AdvertiseHost); why != "" {
		add(needed, "advertise_unroutable", "advertise host %q is %s: peers on other hosts cannot reach this worker (set --advertise-host)", in.AdvertiseHost, why)
	}

	var active []string
	routableGID := false
	for _, n := range node.NICs {
		for _, p := range n.Ports {
			id := fmt.Sprintf("%s port %d", n.Name, p.Number)
			if !p.State.Active() {
				add(SeverityWarn, "port_not_active", "%s is %s (phys %s)", id, p.State.Name, p.PhysState.Name)
				continue
			}
			active = append(active, id)
			if p.LinkLayer != "Ethernet" {
				routableGID = true // InfiniBand routes by LID, not by a RoCE GID
			}
			for _, g := range p.GIDs {
				if g.Type == GIDTypeRoCEv2 && g.Routable() {
					routableGID = true
				}
			}
		}
	}
	switch {
	case len(node.NICs) == 0:
		add(needed, "no_rdma_device", "no RDMA device: %s/class/infiniband has none, so KV would move over TCP", in.SysfsRoot)
	case len(active) == 0:
		add(needed, "no_active_rdma_port", "no active RDMA port on %s, so KV would move over TCP", nicNames(node.NICs))
	default:
		add(SeverityInfo, "rdma_ports", "%d active RDMA port(s): %s", len(active), strings.Join(active, ", "))
		if !routableGID {
			add(SeverityWarn, "no_routable_gid", "no active RoCE port has a routable RoCE v2 GID: RDMA reaches only this L2 segment")
		}
	}
	for _, a := range node.Affinity {
		if a.Locality == LocalitySystem {
			add(SeverityWarn, "gpu_nic_far", "GPU (KFD node %d) has no RDMA device on its PCIe switch or NUMA node", a.GPU)
		}
	}

	r.Verdict = VerdictPass
	for _, f := range r.Findings {
		if f.Severity == SeverityBlock {
			r.Verdict = VerdictFail
			break
		}
		if pd && in.AllowTCP && f.Severity == SeverityWarn && (f.Code == "no_rdma_device" || f.Code == "no_active_rdma_port" || f.Code == "advertise_unroutable") {
			r.Verdict = VerdictAllowTCP
		}
	}
	return r
}

// Blocking returns the blocking findings.
func (r Report) Blocking() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Severity == SeverityBlock {
			out = append(out, f)
		}
	}
	return out
}

// Err is nil unless a finding is blocking; then it wraps ErrPreflight and
// says every blocking finding and the way out.
func (r Report) Err() error {
	b := r.Blocking()
	if len(b) == 0 {
		return nil
	}
	msgs := make([]string, len(b))
	for i, f := range b {
		msgs[i] = f.Message
	}
	return fmt.Errorf("%w for a %s worker: %s (pass --disaggregation-allow-tcp to accept TCP KV transfer)", ErrPreflight, r.Role, strings.Join(msgs, "; "))
}

// unroutable says why host cannot be reached from another machine, or ""
// when it can (or, a host name, cannot be judged here).
func unroutable(host string) string {
	if host == "" {
		return "empty"
	}
	if strings.EqualFold(host, "localhost") {
		return "loopback"
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return ""
	}
	a = a.Unmap()
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsUnspecified():
		return "unspecified"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast():
		return "multicast"
	}
	return ""
}

func gpuSummary(gpus []GPU) string {
	var b strings.Builder
	for i, g := range gpus {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s %s", g.PCIAddress, g.GfxTarget, gib(g.VRAMBytes))
	}
	return b.String()
}

func nicNames(nics []NIC) string {
	names := make([]string, len(nics))
	for i, n := range nics {
		names[i] = n.Name
	}
	return strings.Join(names, ", ")
}

func gib(b uint64) string {
	if b%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", b>>30)
	}
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}

// WriteJSON writes the report as one indented JSON object.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for a person: the node, then the findings,
// then the verdict.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "sysfs root:     %s\n", r.SysfsRoot)
	fmt.Fprintf(&b, "role:           %s\n", r.Role)
	fmt.Fprintf(&b, "advertise host: %s\n", r.AdvertiseHost)
	fmt.Fprintf(&b, "allow tcp:      %t\n", r.AllowTCP)
	fmt.Fprintf(&b, "\nGPUs (%d)\n", len(r.Node.GPUs))
	for _, g := range r.Node.GPUs {
		fmt.Fprintf(&b, "  kfd node %-2d  %s  %-7s %4d CUs  %s VRAM  numa %d  gpu_id %d  device 0x%04x  renderD%d\n",
			g.Node, g.PCIAddress, g.GfxTarget, g.ComputeUnits, gib(g.VRAMBytes), g.NUMANode, g.GPUID, g.DeviceID, g.DRMRenderMinor)
	}
	fmt.Fprintf(&b, "\nRDMA devices (%d)\n", len(r.Node.NICs))
	for _, n := range r.Node.NICs {
		fmt.Fprintf(&b, "  %s  %s  driver %s  fw %s  numa %d\n", n.Name, orDash(n.PCIAddress), orDash(n.Driver), orDash(n.Firmware), n.NUMANode)
		for _, p := range n.Ports {
			fmt.Fprintf(&b, "    port %d  %s (%s)  %s  %s\n", p.Number, p.State.Name, orDash(p.PhysState.Name), orDash(p.LinkLayer), orDash(p.Rate))
			for _, g := range p.GIDs {
				fmt.Fprintf(&b, "      gid %-2d %-39s  %-10s  %s\n", g.Index, g.Addr, orDash(g.Type), orDash(g.NetDev))
			}
		}
	}
	if len(r.Node.Affinity) > 0 {
		b.WriteString("\nGPU to RDMA affinity\n")
		for _, a := range r.Node.Affinity {
			fmt.Fprintf(&b, "  kfd node %-2d -> %s (%s)\n", a.GPU, strings.Join(a.NICs, ", "), a.Locality)
		}
	}
	b.WriteString("\nFindings\n")
	for _, f := range r.Findings {
		fmt.Fprintf(&b, "  [%s] %s: %s\n", f.Severity, f.Code, f.Message)
	}
	fmt.Fprintf(&b, "\nverdict: %s\n", r.Verdict)
	_, err := io.WriteString(w, b.String())
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
