package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/kvd"
)

// TestKVDProcess runs `infera kvd` as a real process: the Python client
// written from the protocol document talks to it, `infera kvd stat` reads
// it, long entries survive a graceful restart (from L3), and after a
// SIGKILL the next daemon replaces the stale socket.
func TestKVDProcess(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "kvd.sock")
	args := []string{"kvd", "--socket", sock, "--max-bytes", "16MiB", "--shared-arena-bytes", "8MiB", "--admin-listen", "", "--arena-mlock=false",
		"--long-path", filepath.Join(dir, "l3"), "--long-bytes", "8MiB", "--tablespace-slot-bytes", "64KiB",
		"--tablespace-container-bytes", "2MiB", "--skip-selfcheck"}
	d := start(t, "kvd", args...)
	d.waitLog("kvd serving", 20*time.Second)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi, err)
	}

	if py := pythonWithMsgpack(); py != "" {
		out, err := exec.CommandContext(t.Context(), py, "../kvd/testdata/kvd_client.py", sock).CombinedOutput()
		if err != nil {
			t.Fatalf("python client: %v\n%s", err, out)
		}
	} else if os.Getenv("CI") != "" {
		t.Fatal("python3 with msgpack not installed: .ci/run must install python3-msgpack")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ns := kvd.Namespace{Model: "e2e", CompatKey: "tp0of1"}
	val := func(i int) []byte { return bytes.Repeat([]byte{byte(i), 0x5A}, 5000) }
	k := func(i int) []byte { return []byte{'e', '2', 'e', 0, 0, 0, 0, byte(i)} }
	c, err := kvd.Dial(ctx, sock, kvd.ClientOptions{SharedArena: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clear(kvd.Namespace{}); err != nil { // what the Python client left
		t.Fatal(err)
	}
	for i := range 20 {
		if ok, reason, err := c.Set(ns, k(i), val(i), kvd.SetOptions{Retention: "long"}); !ok || err != nil {
			t.Fatal(reason, err)
		}
	}
	c.Close()
	out, err := exec.CommandContext(ctx, binary, "kvd", "stat", "--socket", sock, "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("kvd stat: %v\n%s", err, out)
	}
	var st kvd.StatsCounters
	if err := json.Unmarshal(out, &st); err != nil || st.Entries != 20 {
		t.Fatalf("kvd stat: %v %s", err, out)
	}

	d.signal(syscall.SIGTERM)
	if err := d.wait(30 * time.Second); err != nil {
		t.Fatalf("kvd exit: %v\n%s", err, d.logText())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatal("socket left behind after a graceful stop")
	}

	d = start(t, "kvd-2", args...)
	d.waitLog("kvd serving", 20*time.Second)
	c, err = kvd.Dial(ctx, sock, kvd.ClientOptions{SharedArena: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		got, _, ok, err := c.Get(ns, k(i), nil)
		if err != nil || !ok || !bytes.Equal(got, val(i)) {
			t.Fatalf("long entry %d after a graceful restart: ok=%v %v", i, ok, err)
		}
	}
	c.Close()

	d.stop(syscall.SIGKILL)
	if _, err := os.Stat(sock); err != nil {
		t.Fatal("a killed daemon's socket should remain:", err)
	}
	d = start(t, "kvd-3", args...)
	d.waitLog("kvd serving", 20*time.Second)
	out, err = exec.CommandContext(ctx, binary, "kvd", "stat", "--socket", sock).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "entries") {
		t.Fatalf("kvd stat after a stale socket: %v\n%s", err, out)
	}
	d.signal(syscall.SIGTERM)
	if err := d.wait(30 * time.Second); err != nil {
		t.Fatalf("kvd exit: %v", err)
	}
}

// pythonWithMsgpack finds a python3 that imports msgpack, or "".
func pythonWithMsgpack() string {
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil && exec.Command(path, "-c", "import msgpack").Run() == nil {
			return path
		}
	}
	return ""
}
