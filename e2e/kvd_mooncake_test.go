package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/kvd"
)

// gpuBuild builds the GPU binary (cgo, tags mooncake,mori,rocm: the shims
// included) and the stub Mooncake Store library, into dir.
func gpuBuild(t *testing.T, dir string) (bin, lib string) {
	t.Helper()
	bin, lib = filepath.Join(dir, "infera-gpu"), filepath.Join(dir, "libmooncake_store.so")
	build := exec.Command("go", "build", "-tags", "mooncake,mori,rocm", "-o", bin, "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags mooncake,mori,rocm: %v\n%s", err, out)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if out, err := exec.Command(cc, "-Wall", "-Werror", "-shared", "-fPIC", "-o", lib,
		filepath.Join("..", "kvd", "mcstore", "testdata", "mooncake_store_stub.c")).CombinedOutput(); err != nil {
		t.Fatalf("build the stub mooncake store: %v\n%s", err, out)
	}
	return bin, lib
}

// TestKVDMooncakeStore (the data plane through the shims, acceptance 1 and
// 4, Mooncake Store half): the GPU build of infera kvd on two "hosts" with
// --long-backend mooncake over one (stub) Mooncake Store: a long block
// written through kvd A is served by kvd B from L4, byte for byte; the
// binary really calls the shim (its C loader is linked in), and the
// default build refuses the backend with a clear error.
func TestKVDMooncakeStore(t *testing.T) {
	dir := t.TempDir()
	bin, lib := gpuBuild(t, dir)
	nm, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, sym := range []string{"mcs_load", "kvd/mcstore.Open", "kvd/l4.OpenMooncake"} {
		if !bytes.Contains(nm, []byte(sym)) {
			t.Errorf("the GPU binary has no %s: the shim is not reached from product code", sym)
		}
	}
	pool := filepath.Join(dir, "pool")
	cfg := filepath.Join(dir, "mooncake.yaml")
	if err := os.WriteFile(cfg, []byte("master_address: stub:"+pool+"\ncluster_id: e2e\nprotocol: tcp\nlibrary: "+lib+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startKVD := func(name, host string) (*proc, string) {
		sock := filepath.Join(dir, name+".sock")
		env := append(cleanEnv(), "INFERA_L4_LOCAL_HOSTNAME="+host)
		p := startBinary(t, bin, name, env, "kvd", "--socket", sock, "--max-bytes", "16MiB", "--shared-arena-bytes", "8MiB",
			"--arena-mlock=false", "--admin-listen", "127.0.0.1:"+strconv.Itoa(freePort(t)),
			"--long-backend", "mooncake", "--mooncake-config", cfg)
		p.waitLog("kvd serving", 20*time.Second)
		return p, sock
	}
	a, sockA := startKVD("kvd-a", "10.0.0.1:14001")
	_, sockB := startKVD("kvd-b", "10.0.0.2:14001")
	if line := a.waitLog("l4 on mooncake store", time.Second); line["cluster_id"] != "e2e" {
		t.Fatalf("kvd A log: %v", line)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dial := func(sock string) *kvd.Client {
		c, err := kvd.Dial(ctx, sock, kvd.ClientOptions{SharedArena: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ca, cb := dial(sockA), dial(sockB)
	ns := kvd.Namespace{Model: "Qwen/Qwen3-8B", CompatKey: "tp0of1_pp0of1"}
	key := []byte{0xca, 0xfe, 0, 1}
	val := bytes.Repeat([]byte("mooncake-block"), 3000)
	if ok, reason, err := ca.Set(ns, key, val, kvd.SetOptions{Retention: "long"}); !ok || err != nil {
		t.Fatal(reason, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, _, ok, err := cb.Get(ns, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if !bytes.Equal(got, val) {
				t.Fatal("kvd B served wrong bytes from Mooncake Store")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("kvd B never found kvd A's block in Mooncake Store")
		}
	}

	// The default (pure Go) build refuses the backend at start-up, naming
	// the build it needs.
	plain := exec.Command(binary, "kvd", "--socket", filepath.Join(dir, "c.sock"), "--long-backend", "mooncake",
		"--mooncake-config", cfg, "--admin-listen", "")
	plain.Env = append(cleanEnv(), "INFERA_L4_LOCAL_HOSTNAME=10.0.0.3:14001")
	out, err := plain.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "built without the mooncake tag") {
		t.Fatalf("default build with --long-backend mooncake: %v\n%s", err, out)
	}
}
