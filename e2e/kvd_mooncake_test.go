package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd"
)

var (
	gpuOnce                sync.Once
	gpuBin, mcsLib, hipLib string
	teLib                  string // the stub Mooncake Transfer Engine
	gpuErr                 error
)

// gpuBuild builds, once per run, the GPU binary (cgo, tags
// mooncake,mori,rocm: the shims included) and the stub Mooncake Store,
// Mooncake Transfer Engine and HIP libraries, next to the default binary
// (removed with it).
func gpuBuild(t *testing.T) (bin, mooncakeLib, hipStub string) {
	t.Helper()
	gpuOnce.Do(func() {
		dir := filepath.Dir(binary)
		gpuBin, mcsLib, hipLib = filepath.Join(dir, "infera-gpu"), filepath.Join(dir, "libmooncake_store.so"), filepath.Join(dir, "libhipstub.so")
		teLib = filepath.Join(dir, "libtransfer_engine.so")
		// -pgo=off: the shims' behaviour is what is tested here, and a
		// profile-guided build of every package with cgo would cost minutes
		// more (the default binary above is built as it ships, with default.pgo).
		build := exec.Command("go", "build", "-pgo=off", "-tags", "mooncake,mori,rocm", "-o", gpuBin, "..")
		build.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := build.CombinedOutput(); err != nil {
			gpuErr = fmt.Errorf("go build -tags mooncake,mori,rocm: %v\n%s", err, out)
			return
		}
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "cc"
		}
		for lib, src := range map[string]string{
			mcsLib: filepath.Join("..", "kvd", "mcstore", "testdata", "mooncake_store_stub.c"),
			hipLib: filepath.Join("..", "rocm", "testdata", "hipstub", "hipstub.c"),
			teLib:  filepath.Join("..", "transport", "testdata", "mooncake_stub.c"),
		} {
			if out, err := exec.Command(cc, "-Wall", "-Werror", "-shared", "-fPIC", "-o", lib, src, "-lpthread").CombinedOutput(); err != nil {
				gpuErr = fmt.Errorf("build %s: %v\n%s", src, err, out)
				return
			}
		}
	})
	if gpuErr != nil {
		t.Fatal(gpuErr)
	}
	return gpuBin, mcsLib, hipLib
}

// TestKVDMooncakeStore (the data plane through the shims, acceptance 1 and
// 4, Mooncake Store half): the GPU build of infera kvd on two "hosts" with
// --long-backend mooncake over one (stub) Mooncake Store: a long block
// written through kvd A is served by kvd B from L4, byte for byte; the
// binary really calls the shim (its C loader is linked in), and the
// default build refuses the backend with a clear error.
func TestKVDMooncakeStore(t *testing.T) {
	dir := t.TempDir()
	bin, lib, _ := gpuBuild(t)
	nm, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, sym := range []string{"mcs_load", "kvd/mcstore.Open", "kvd/l4.OpenMooncake", "mc_load", "transport.NewMooncake", "infera_hip_open", "rocm.OpenHIP"} {
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
			"--arena-mlock=false", "--admin-listen", "127.0.0.1:"+strconv.Itoa(testkit.FreePort(t)),
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

// TestKVDArenaHIPRegistered (acceptance 3): the GPU build of kvd registers
// its arena with HIP (the stub runtime) exactly once and unregisters it
// exactly once at shutdown, says so in its log and on /metrics, and runs
// on without HIP (auto) or refuses to start without it (on).
func TestKVDArenaHIPRegistered(t *testing.T) {
	bin, _, hip := gpuBuild(t)
	dir := t.TempDir()
	trace := filepath.Join(dir, "hip.trace")
	admin := "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t))
	args := func(sock, lib string, extra ...string) []string {
		return append([]string{"kvd", "--socket", filepath.Join(dir, sock), "--max-bytes", "16MiB", "--shared-arena-bytes", "8MiB",
			"--arena-mlock=false", "--hip-library", lib}, extra...)
	}
	p := startBinary(t, bin, "kvd-hip", append(cleanEnv(), "HIPSTUB_TRACE="+trace), args("a.sock", hip, "--admin-listen", admin)...)
	p.waitLog("arena registered with HIP (hipHostRegister)", 20*time.Second)
	p.waitLog("kvd serving", 20*time.Second)
	if metricValue(scrape(t, "http://"+admin+"/metrics"), "infera_kvd_arena_hip_registered") != 1 {
		t.Fatalf("no registered gauge in /metrics")
	}
	p.signal(syscall.SIGTERM)
	if err := p.wait(20 * time.Second); err != nil {
		t.Fatalf("kvd exit: %v", err)
	}
	p.waitLog("arena unregistered from HIP", time.Second)
	got, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "hipHostRegister\nhipHostUnregister\n" {
		t.Fatalf("HIP calls of one run:\n%s", got)
	}

	// No HIP runtime: auto serves without registering; on refuses.
	q := startBinary(t, bin, "kvd-nohip", cleanEnv(), args("b.sock", "/nonexistent/libamdhip64.so", "--admin-listen", "")...)
	q.waitLog("arena not registered with HIP: no HIP runtime or GPU here (engines copy through unpinned memory)", 20*time.Second)
	q.waitLog("kvd serving", 20*time.Second)
	out, err := exec.Command(bin, args("c.sock", "/nonexistent/libamdhip64.so", "--admin-listen", "", "--arena-hip-register", "on")...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--arena-hip-register on") {
		t.Fatalf("--arena-hip-register on without HIP: %v\n%s", err, out)
	}
}

// TestKVDPeerPullMooncake (acceptance 1, Mooncake transfer half): the GPU
// build's kvd-to-kvd pull over the Mooncake Transfer Engine shim. The stub
// engine moves bytes between the two kvd processes (process_vm_readv), so
// the bytes B serves crossed processes through the shim; a dead source is
// a miss.
func TestKVDPeerPullMooncake(t *testing.T) {
	bin, _, _ := gpuBuild(t)
	dir := t.TempDir()
	meta := filepath.Join(dir, "segments")
	if err := os.Mkdir(meta, 0o700); err != nil {
		t.Fatal(err)
	}
	peerPort := testkit.FreePort(t)
	startKVD := func(name, segment string, extra ...string) (*proc, string, string) {
		sock, admin := filepath.Join(dir, name+".sock"), "127.0.0.1:"+strconv.Itoa(testkit.FreePort(t))
		args := append([]string{"kvd", "--socket", sock, "--max-bytes", "32MiB", "--shared-arena-bytes", "16MiB",
			"--arena-slot-bytes", "64KiB", "--arena-mlock=false", "--admin-listen", admin, "--hip-library", "/nonexistent",
			"--peer-transport", "mooncake", "--peer-mooncake-library", teLib, "--peer-mooncake-metadata", "dir:" + meta,
			"--peer-mooncake-name", segment}, extra...)
		p := startBinary(t, bin, name, cleanEnv(), args...)
		p.waitLog("kvd serving", 20*time.Second)
		return p, sock, admin
	}
	a, sockA, _ := startKVD("kvd-a", "10.0.0.1:15001", "--peer-listen", "127.0.0.1:"+strconv.Itoa(peerPort))
	_, sockB, adminB := startKVD("kvd-b", "10.0.0.2:15001")
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
	var keys [][]byte
	for i := range 6 {
		k := []byte("mc-block-" + strconv.Itoa(i))
		if ok, reason, err := ca.Set(ns, k, bytes.Repeat([]byte{byte('A' + i)}, 50000), kvd.SetOptions{}); !ok || err != nil {
			t.Fatal(reason, err)
		}
		keys = append(keys, k)
	}
	source := "127.0.0.1:" + strconv.Itoa(peerPort)
	if err := cb.PrefetchFromCtx(ctx, ns, source, keys, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, adminB, "infera_kvd_peer_pulled_blocks_total", 6, "B pulls A's blocks over the Mooncake shim")
	for i, k := range keys {
		got, _, ok, err := cb.Get(ns, k, nil)
		if err != nil || !ok || !bytes.Equal(got, bytes.Repeat([]byte{byte('A' + i)}, 50000)) {
			t.Fatalf("B serves %s: ok %v err %v", k, ok, err)
		}
	}
	a.stop(syscall.SIGKILL)
	if err := cb.PrefetchFromCtx(ctx, ns, source, [][]byte{[]byte("after-death")}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, adminB, "infera_kvd_peer_pulls_failed_total", 1, "B's pull from a dead source fails")
	if _, _, ok, _ := cb.Get(ns, []byte("after-death"), nil); ok {
		t.Fatal("a block from a dead source")
	}
}
