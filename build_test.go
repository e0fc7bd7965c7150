package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func goTool(t *testing.T, env []string, args ...string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is not on PATH: %v", err)
	}
	cmd := exec.Command(goBin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestStaticBuild: the binary `make build` produces (CGO_ENABLED=0) is cgo
// free and statically linked, whatever cgo shims the tree holds behind tags,
// and optimised with the profile beside the main package (default.pgo,
// scripts/pgo-profile.sh): the build must find it without being told.
func TestStaticBuild(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "infera")
	goTool(t, []string{"CGO_ENABLED=0"}, "build", "-trimpath", "-o", bin, ".")
	info := goTool(t, nil, "version", "-m", bin)
	if !strings.Contains(info, "CGO_ENABLED=0") {
		t.Fatalf("go version -m does not show CGO_ENABLED=0:\n%s", info)
	}
	if !strings.Contains(info, "-pgo=") || !strings.Contains(info, "default.pgo") {
		t.Fatalf("go version -m shows no build with default.pgo:\n%s", info)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("binary has a program interpreter: dynamically linked")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Fatalf("binary needs shared libraries %v (%v)", libs, err)
	}
}

// TestTaggedBuildCompiles: the cgo shims compile and vet under their tags
// (the stub-library tests run them: make test-cgo), and the tags alone do
// not break a cgo-free build.
func TestTaggedBuildCompiles(t *testing.T) {
	const tags = "mooncake,mori,rocm"
	goTool(t, []string{"CGO_ENABLED=1"}, "vet", "-tags", tags, "./transport/...", "./kvd/mcstore/...", "./rocm/...", ".")
	// -pgo=off: this only proves the tags compile; a profile-guided build of
	// every package again would cost minutes and prove nothing more.
	goTool(t, []string{"CGO_ENABLED=0"}, "build", "-pgo=off", "-tags", tags, "-o", os.DevNull, ".")
}
