package rocm

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ErrSysfs is wrapped when a sysfs file holds something the kernel would
// not have written there.
var ErrSysfs = errors.New("malformed sysfs entry")

// maxSysfsFile bounds what is read of one sysfs attribute; the kernel's are
// at most one page.
const maxSysfsFile = 64 << 10

// ParseProperties parses a KFD topology properties file: one "name value"
// pair per line, the value a decimal unsigned integer (the kernel prints
// them with %u and %llu). A name given twice, a line without a value or a
// value that is not a number is an error.
func ParseProperties(data []byte) (map[string]uint64, error) {
	if len(data) > maxSysfsFile {
		return nil, fmt.Errorf("%w: properties: %d bytes, want at most %d", ErrSysfs, len(data), maxSysfsFile)
	}
	props := make(map[string]uint64)
	for n, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimRight(line, " \t\r")
		if len(line) == 0 {
			continue
		}
		name, value, ok := bytes.Cut(line, []byte(" "))
		if !ok || len(name) == 0 || !validName(name) {
			return nil, fmt.Errorf("%w: properties line %d: want \"name value\", got %q", ErrSysfs, n+1, line)
		}
		v, err := strconv.ParseUint(string(bytes.TrimSpace(value)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: properties line %d: %s: value %q is not an unsigned integer", ErrSysfs, n+1, name, value)
		}
		if _, dup := props[string(name)]; dup {
			return nil, fmt.Errorf("%w: properties line %d: %s given twice", ErrSysfs, n+1, name)
		}
		props[string(name)] = v
	}
	return props, nil
}

// validName accepts the names the kernel gives properties: lower-case
// letters, digits and underscores.
func validName(b []byte) bool {
	for _, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// GfxTarget names a KFD gfx_target_version: major*10000 + minor*100 +
// stepping, written as LLVM's target name (90402 → gfx942, 90010 → gfx90a,
// 90500 → gfx950, 110000 → gfx1100).
func GfxTarget(version uint64) (string, error) {
	major, minor, step := version/10000, version/100%100, version%100
	if major == 0 || minor > 15 || step > 15 || version > 999999 {
		return "", fmt.Errorf("%w: gfx_target_version %d: want major*10000+minor*100+stepping with minor and stepping < 16", ErrSysfs, version)
	}
	return fmt.Sprintf("gfx%d%x%x", major, minor, step), nil
}

// PCIAddress formats the PCI address of a KFD node from its domain and
// location_id (the kernel's PCI device id: bus << 8 | devfn).
func PCIAddress(domain, location uint64) (string, error) {
	if domain > 0xffff || location > 0xffff {
		return "", fmt.Errorf("%w: PCI domain %d location_id %d out of range", ErrSysfs, domain, location)
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, location>>8, location>>3&0x1f, location&7), nil
}

// PortState is an InfiniBand port's logical state, as the kernel writes it
// in ports/N/state ("4: ACTIVE").
type PortState struct {
	Code int    `json:"code"` // 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER
	Name string `json:"name"` // the kernel's name for it
}

// Active reports whether the port can carry traffic.
func (s PortState) Active() bool { return s.Code == 4 }

// ParseNumbered parses the "N: NAME" form of ports/N/state and
// ports/N/phys_state.
func ParseNumbered(data []byte) (PortState, error) {
	s := strings.TrimSpace(string(data))
	num, name, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	code, err := strconv.Atoi(num)
	if !ok || err != nil || code < 0 || code > 255 || name == "" || len(name) > 64 || !printable(name) {
		return PortState{}, fmt.Errorf("%w: want \"N: NAME\", got %q", ErrSysfs, clip(s))
	}
	return PortState{Code: code, Name: name}, nil
}

// ParseGID parses one ports/N/gids/I entry: eight groups of four hex digits
// separated by colons (the kernel's %pI6 format). An unused slot reads as
// all zeroes; the caller skips those.
func ParseGID(data []byte) (netip.Addr, error) {
	s := strings.TrimSpace(string(data))
	if len(s) != 39 || strings.Count(s, ":") != 7 {
		return netip.Addr{}, fmt.Errorf("%w: GID %q: want 8 colon-separated groups of 4 hex digits", ErrSysfs, clip(s))
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%w: GID %q: not an IPv6-form address", ErrSysfs, clip(s))
	}
	return a, nil
}

// GID types the kernel reports in gid_attrs/types/I.
const (
	GIDTypeRoCEv1 = "IB/RoCE v1"
	GIDTypeRoCEv2 = "RoCE v2"
)

// ParseGIDType parses a gid_attrs/types/I entry.
func ParseGIDType(data []byte) (string, error) {
	s := strings.TrimSpace(string(data))
	switch s {
	case GIDTypeRoCEv1, GIDTypeRoCEv2:
		return s, nil
	}
	return "", fmt.Errorf("%w: GID type %q: want %q or %q", ErrSysfs, clip(s), GIDTypeRoCEv1, GIDTypeRoCEv2)
}

// ParseWord parses a one-word attribute (link_layer, a netdev name, a
// firmware version): printable, no spaces inside, bounded.
func ParseWord(data []byte) (string, error) {
	s := strings.TrimSpace(string(data))
	if s == "" || len(s) > 128 || strings.ContainsAny(s, " \t\n") || !printable(s) {
		return "", fmt.Errorf("%w: want one word, got %q", ErrSysfs, clip(s))
	}
	return s, nil
}

// ParseLine parses a one-line free-text attribute (rate, a device name).
func ParseLine(data []byte) (string, error) {
	s := strings.TrimSpace(string(data))
	if len(s) > 256 || strings.Contains(s, "\n") || !printable(s) {
		return "", fmt.Errorf("%w: want one printable line, got %q", ErrSysfs, clip(s))
	}
	return s, nil
}

// ParseInt parses a decimal integer attribute (numa_node, which is -1 when
// the platform does not say).
func ParseInt(data []byte) (int, error) {
	s := strings.TrimSpace(string(data))
	v, err := strconv.Atoi(s)
	if err != nil || v < -1 || v > 1<<16 {
		return 0, fmt.Errorf("%w: want an integer >= -1, got %q", ErrSysfs, clip(s))
	}
	return v, nil
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == '\uFFFD' {
			return false
		}
	}
	return true
}

// clip bounds what of a bad value goes into an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
