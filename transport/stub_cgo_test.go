//go:build (mooncake || mori) && cgo

package transport

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// buildStub compiles testdata/<src> into a shared library with the
// system C compiler and returns its path.
func buildStub(t *testing.T, src, lib string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	out := filepath.Join(t.TempDir(), lib)
	cmd := exec.Command(cc, "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", out, filepath.Join("testdata", src), "-lpthread")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", src, err, b)
	}
	return out
}
