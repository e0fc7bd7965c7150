package rocm

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func FuzzParseProperties(f *testing.F) {
	f.Add([]byte("simd_count 1024\nsimd_per_cu 4\ngfx_target_version 90500\n"))
	f.Add([]byte("heap_type 1\nsize_in_bytes 309237645312\n"))
	f.Add([]byte("a 1\na 2\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseProperties(data)
		if err != nil {
			if !errors.Is(err, ErrSysfs) {
				t.Fatalf("error %v does not wrap ErrSysfs", err)
			}
			return
		}
		// What parsed prints back to the kernel's format and parses the same.
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(p)) {
			fmt.Fprintf(&b, "%s %d\n", k, p[k])
		}
		again, err := ParseProperties([]byte(b.String()))
		if err != nil || !maps.Equal(p, again) {
			t.Fatalf("round trip of %q: %v, %v", data, again, err)
		}
	})
}

func FuzzParseNumbered(f *testing.F) {
	f.Add([]byte("4: ACTIVE\n"))
	f.Add([]byte("5: LinkUp"))
	f.Add([]byte("1:DOWN"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseNumbered(data)
		if err != nil {
			if !errors.Is(err, ErrSysfs) {
				t.Fatalf("error %v does not wrap ErrSysfs", err)
			}
			return
		}
		again, err := ParseNumbered(fmt.Appendf(nil, "%d: %s\n", s.Code, s.Name))
		if err != nil || again != s {
			t.Fatalf("round trip of %q: %+v, %v", data, again, err)
		}
	})
}

func FuzzParseGID(f *testing.F) {
	f.Add([]byte("fe80:0000:0000:0000:0690:81ff:fe20:0000\n"))
	f.Add([]byte("0000:0000:0000:0000:0000:ffff:0a10:000b"))
	f.Add([]byte("0000:0000:0000:0000:0000:0000:0000:0000"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParseGID(data)
		if err != nil {
			if !errors.Is(err, ErrSysfs) {
				t.Fatalf("error %v does not wrap ErrSysfs", err)
			}
			return
		}
		if !a.Is6() {
			t.Fatalf("%q parsed to %v", data, a)
		}
		// The kernel's own spelling of the address parses back to it.
		b := a.As16()
		var s strings.Builder
		for i := 0; i < 16; i += 2 {
			if i > 0 {
				s.WriteByte(':')
			}
			fmt.Fprintf(&s, "%02x%02x", b[i], b[i+1])
		}
		again, err := ParseGID([]byte(s.String()))
		if err != nil || again != a {
			t.Fatalf("round trip of %q via %q: %v, %v", data, s.String(), again, err)
		}
	})
}

func FuzzParseAttrs(f *testing.F) {
	f.Add([]byte("RoCE v2\n"))
	f.Add([]byte("Ethernet\n"))
	f.Add([]byte("400 Gb/sec (1X NDR)\n"))
	f.Add([]byte("-1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for name, parse := range map[string]func([]byte) (string, error){"type": ParseGIDType, "word": ParseWord, "line": ParseLine} {
			s, err := parse(data)
			if err != nil {
				if !errors.Is(err, ErrSysfs) {
					t.Fatalf("%s: error %v does not wrap ErrSysfs", name, err)
				}
				continue
			}
			if again, err := parse([]byte(s)); err != nil || again != s {
				t.Fatalf("%s of %q: not stable: %q, %v", name, data, again, err)
			}
		}
		if v, err := ParseInt(data); err == nil && v < -1 {
			t.Fatalf("ParseInt(%q) = %d", data, v)
		} else if err != nil && !errors.Is(err, ErrSysfs) {
			t.Fatalf("ParseInt: error %v does not wrap ErrSysfs", err)
		}
	})
}

// FuzzDiscover puts fuzzed content into each kind of file Discover reads of
// a small tree: it either finds the node or reports ErrSysfs, never panics.
func FuzzDiscover(f *testing.F) {
	f.Add([]byte("simd_count 4\n"), uint8(0))
	f.Add([]byte("4: ACTIVE\n"), uint8(1))
	f.Add([]byte("fe80:0000:0000:0000:0000:0000:0000:0001\n"), uint8(2))
	f.Add([]byte("RoCE v2\n"), uint8(3))
	f.Add([]byte("-1\n"), uint8(4))
	targets := []string{
		"class/kfd/kfd/topology/nodes/2/properties",
		"class/infiniband/ionic_0/ports/1/state",
		"class/infiniband/ionic_0/ports/1/gids/0",
		"class/infiniband/ionic_0/ports/1/gid_attrs/types/0",
		"devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:04.0/0000:04:00.0/numa_node",
		"class/kfd/kfd/topology/nodes/2/mem_banks/0/properties",
		"class/infiniband/ionic_0/ports/1/link_layer",
		"class/kfd/kfd/topology/nodes/2/gpu_id",
		"class/infiniband/ionic_0/ports/1/phys_state",
	}
	base := f.TempDir()
	if err := mi355x().write(base); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		path := filepath.Join(base, targets[int(which)%len(targets)])
		orig, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := os.WriteFile(path, orig, 0o644); err != nil {
				t.Fatal(err)
			}
		}()
		n, err := Discover(base)
		if err != nil {
			if !errors.Is(err, ErrSysfs) {
				t.Fatalf("error %v does not wrap ErrSysfs", err)
			}
			return
		}
		// Whatever was found makes a report without panicking.
		r := Preflight(n, PreflightInput{SysfsRoot: base, Role: "prefill", AdvertiseHost: "10.0.0.1"})
		if err := r.WriteText(new(strings.Builder)); err != nil {
			t.Fatal(err)
		}
	})
}
