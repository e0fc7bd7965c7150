package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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

// TestKVDCrashServesNoWrongBytes: `infera kvd` is SIGKILLed, repeatedly,
// while two clients overwrite long entries (written through to a
// tablespace small enough to evict); after each restart every key read
// back from L3 holds a whole value written for that key — never another
// key's or a torn mix — and entries do survive each crash.
func TestKVDCrashServesNoWrongBytes(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "kvd.sock")
	args := []string{"kvd", "--socket", sock, "--max-bytes", "2MiB", "--admin-listen", "", "--arena-mlock=false",
		"--long-path", filepath.Join(dir, "l3"), "--long-bytes", "256KiB", "--tablespace-slot-bytes", "4KiB",
		"--tablespace-container-bytes", "64KiB", "--skip-selfcheck"}
	ns := kvd.Namespace{Model: "crash"}
	const keys, unit, reps = 200, 16, 150
	k := func(i int) []byte { return []byte{'c', 'r', 0, 0, 0, 0, byte(i >> 8), byte(i)} }
	mk := func(i, ctr int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("k=%03d c=%07d|", i, ctr)), reps) }
	check := func(i int, v []byte) error {
		u := v[:unit]
		if len(v) != unit*reps || !bytes.Equal(v, bytes.Repeat(u, reps)) || !bytes.HasPrefix(u, []byte(fmt.Sprintf("k=%03d ", i))) {
			return fmt.Errorf("key %d served wrong bytes: %.40q", i, v)
		}
		return nil
	}
	total := 0
	for round := range 3 {
		d := start(t, fmt.Sprintf("kvd-%d", round), args...)
		d.waitLog("kvd serving", 20*time.Second)
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		// Everything that survived the previous crash is whole and its own.
		c, err := kvd.Dial(ctx, sock, kvd.ClientOptions{SharedArena: true})
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for i := range keys {
			v, _, ok, err := c.Get(ns, k(i), nil)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				found++
				if err := check(i, v); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
		}
		c.Close()
		if round > 0 && found == 0 {
			t.Fatalf("round %d: nothing survived the crash", round)
		}
		// Two writers overwrite random keys until enough sets were
		// acknowledged, then the daemon is killed mid-stream.
		var acked atomic.Int64
		var wg sync.WaitGroup
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := kvd.Dial(ctx, sock, kvd.ClientOptions{SharedArena: w == 0})
				if err != nil {
					return
				}
				defer c.Close()
				for j := 0; ; j++ {
					i := (j*7919 + w*31 + round*101) % keys
					if ok, _, err := c.Set(ns, k(i), mk(i, round*100000+w*50000+j), kvd.SetOptions{Retention: "long"}); err != nil {
						return // the daemon was killed
					} else if ok {
						acked.Add(1)
					}
				}
			}()
		}
		// Kill once enough sets were acknowledged and some long writes
		// reached L3 (they are written through asynchronously).
		sc, err := kvd.Dial(ctx, sock, kvd.ClientOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for {
			st, err := sc.Stats()
			if err != nil {
				t.Fatalf("stats: %v\n%s", err, d.logText())
			}
			if acked.Load() >= 400 && st.LongBytes > 0 {
				break
			}
			select {
			case <-d.done:
				t.Fatalf("kvd exited: %s", d.logText())
			case <-ctx.Done():
				t.Fatalf("no progress: %d acked, %+v", acked.Load(), st)
			case <-time.After(time.Millisecond):
			}
		}
		sc.Close()
		d.stop(syscall.SIGKILL)
		wg.Wait()
		cancel()
		total += int(acked.Load())
	}
	if total < 1200 {
		t.Fatalf("only %d acknowledged writes", total)
	}
}
