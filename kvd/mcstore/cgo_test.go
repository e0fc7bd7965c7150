//go:build mooncake && cgo

package mcstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/infera/infera/kvd/mcstore"
)

// stubLib compiles testdata/mooncake_store_stub.c for the test.
func stubLib(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "libmooncake_store.so")
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	out, err := exec.Command(cc, "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", path,
		filepath.Join("testdata", "mooncake_store_stub.c")).CombinedOutput()
	if err != nil {
		t.Fatalf("build stub: %v\n%s", err, out)
	}
	return path
}

func open(t *testing.T, dir, host string) *mcstore.Store {
	t.Helper()
	st, err := mcstore.Open(mcstore.Config{Library: stubLib(t), LocalHostname: host, MasterAddress: "stub:" + dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestHelperProcess is the second "host": it opens the store named by
// MCSTORE_DIR, reads MCSTORE_GET and prints it, or writes MCSTORE_PUT=k=v.
func TestHelperProcess(t *testing.T) {
	dir := os.Getenv("MCSTORE_DIR")
	if dir == "" {
		return // not a helper run
	}
	st := open(t, dir, "10.0.0.2:14001")
	if kv := os.Getenv("MCSTORE_PUT"); kv != "" {
		k, v, _ := strings.Cut(kv, "=")
		if err := st.Put(k, []byte(v)); err != nil {
			t.Fatal(err)
		}
		return
	}
	v, err := st.Get(os.Getenv("MCSTORE_GET"), nil)
	if err != nil {
		fmt.Printf("GET-ERR %v\n", err)
		return
	}
	fmt.Printf("GET-OK %x\n", v)
}

func helper(t *testing.T, dir string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), append([]string{"MCSTORE_DIR=" + dir}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	return string(out)
}

// TestAcrossProcesses: an object put by one process (host) is read by
// another through the shim, and the other way round; a missing key is
// ErrNotFound there.
func TestAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	a := open(t, dir, "10.0.0.1:14001")
	value := bytes.Repeat([]byte("kv-block-"), 7000) // 63 KiB
	if err := a.Put("infera:m:c:00ff", value); err != nil {
		t.Fatal(err)
	}
	if out := helper(t, dir, "MCSTORE_GET=infera:m:c:00ff"); !strings.Contains(out, fmt.Sprintf("GET-OK %x\n", value)) {
		t.Fatalf("other process read: %.200s", out)
	}
	if out := helper(t, dir, "MCSTORE_GET=infera:m:c:absent"); !strings.Contains(out, "GET-ERR "+mcstore.ErrNotFound.Error()) {
		t.Fatalf("other process, missing key: %.200s", out)
	}
	helper(t, dir, "MCSTORE_PUT=from-b=written by b")
	got, err := a.Get("from-b", []byte("prefix:"))
	if err != nil || string(got) != "prefix:written by b" {
		t.Fatalf("%q %v", got, err)
	}
	if ok, err := a.Exists("from-b"); !ok || err != nil {
		t.Fatalf("exists %v %v", ok, err)
	}
	if err := a.Remove("from-b"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := a.Exists("from-b"); ok {
		t.Fatal("removed object still exists")
	}
	if err := a.Remove("from-b"); err != nil {
		t.Fatalf("removing a missing object: %v", err)
	}
	if _, err := a.Get("from-b", nil); !errors.Is(err, mcstore.ErrNotFound) {
		t.Fatalf("get after remove: %v", err)
	}
	if err := a.Healthy(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if err := a.RegisterBuffer(unsafe.Pointer(&buf[0]), uintptr(len(buf))); err != nil {
		t.Fatal(err)
	}
	if err := a.UnregisterBuffer(unsafe.Pointer(&buf[0])); err != nil {
		t.Fatal(err)
	}
}

// TestOpenErrors: a missing library and a master that refuses are
// ErrUnavailable with the reason.
func TestOpenErrors(t *testing.T) {
	_, err := mcstore.Open(mcstore.Config{Library: "/nonexistent/libmooncake_store.so", LocalHostname: "h:1", MasterAddress: "m:1"})
	if !errors.Is(err, mcstore.ErrUnavailable) || !strings.Contains(err.Error(), "nonexistent") {
		t.Fatalf("missing library: %v", err)
	}
	_, err = mcstore.Open(mcstore.Config{Library: stubLib(t), LocalHostname: "h:1", MasterAddress: "10.9.9.9:50051"})
	var se *mcstore.StoreError
	if !errors.Is(err, mcstore.ErrUnavailable) || !errors.As(err, &se) || se.Code != -900 {
		t.Fatalf("refusing master: %v", err)
	}
}
