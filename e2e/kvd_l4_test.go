package e2e

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/redistest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd"
)

// TestKVDSharedRedis (issue 15, acceptance 4): two hosts simulated by two
// `infera kvd` processes sharing one redis-server as L4. A block written
// through kvd A is served by kvd B from L4, then from B's RAM; killing
// Redis leaves both serving what they hold.
func TestKVDSharedRedis(t *testing.T) {
	rs := redistest.Start(t)
	dir := t.TempDir()
	type daemon struct {
		p     *proc
		sock  string
		admin string
	}
	respPort := testkit.FreePort(t)
	startKVD := func(name string) daemon {
		d := daemon{sock: filepath.Join(dir, name+".sock"), admin: "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t))}
		args := []string{"kvd", "--socket", d.sock, "--max-bytes", "16MiB", "--shared-arena-bytes", "8MiB", "--arena-mlock=false",
			"--admin-listen", d.admin, "--l4-redis", rs.URL(), "--l4-prefix", "e2e:", "--l4-ttl", "10m"}
		if name == "kvd-a" {
			args = append(args, "--resp-listen", strconv.Itoa(respPort), "--resp-model", "Qwen/Qwen3-8B", "--resp-compat-key", "tp0of1_pp0of1", "--resp-retention", "long")
		}
		d.p = start(t, name, args...)
		d.p.waitLog("kvd serving", 20*time.Second)
		return d
	}
	a, b := startKVD("kvd-a"), startKVD("kvd-b")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dial := func(d daemon) *kvd.Client {
		c, err := kvd.Dial(ctx, d.sock, kvd.ClientOptions{SharedArena: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ca, cb := dial(a), dial(b)
	ns := kvd.Namespace{Model: "Qwen/Qwen3-8B", CompatKey: "tp0of1_pp0of1"}
	key := []byte{0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1}
	val := bytes.Repeat([]byte("prefix-kv"), 4000)
	if ok, reason, err := ca.Set(ns, key, val, kvd.SetOptions{Retention: "long"}); !ok || err != nil {
		t.Fatal(reason, err)
	}
	// A's RESP listener (loopback) serves the same namespace: a value SET
	// over RESP with long retention reaches B through L4 as well.
	rc, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(respPort))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := rc.Write([]byte("*3\r\n$3\r\nSET\r\n$4\r\nresp\r\n$5\r\nhello\r\n*2\r\n$3\r\nGET\r\n$4\r\nresp\r\n")); err != nil {
		t.Fatal(err)
	}
	want := "+OK\r\n$5\r\nhello\r\n"
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(rc, buf); err != nil || string(buf) != want {
		t.Fatalf("RESP on kvd A: %q %v", buf, err)
	}
	// B has never seen the block: its first get is an L4 hit (after A's
	// write-behind lands).
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _, ok, err := cb.Get(ns, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if !bytes.Equal(got, val) {
				t.Fatal("B served wrong bytes")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("B never found A's block in L4")
		}
		time.Sleep(20 * time.Millisecond)
	}
	metric := func(d daemon, name string) string {
		resp, err := http.Get("http://" + d.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, name+" ") {
				return strings.TrimPrefix(line, name+" ")
			}
		}
		t.Fatalf("no %s in /metrics", name)
		return ""
	}
	if v := metric(b, `infera_kvd_l4_reads_total{outcome="hit"}`); v != "1" {
		t.Fatalf("B's L4 hits: %s", v)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, _, ok, err := cb.Get(ns, []byte("resp"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if ok && string(got) == "hello" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("B never found the RESP-set value in L4")
		}
	}
	// The next get is from B's RAM: L4 is not read again.
	if got, _, ok, err := cb.Get(ns, key, nil); err != nil || !ok || !bytes.Equal(got, val) {
		t.Fatalf("B second get: %v %v", ok, err)
	}
	if v := metric(b, `infera_kvd_l4_reads_total{outcome="hit"}`); v != "2" {
		t.Fatalf("B's second get went to L4: hits %s", v)
	}
	if v := metric(a, "infera_kvd_l4_up"); v != "1" {
		t.Fatalf("A's l4 gauge %s", v)
	}
	// Redis dies: both keep serving their RAM, A's gauge drops after its
	// next L4 call fails.
	rs.Kill()
	if ok, _, err := ca.Set(ns, []byte("after-k1"), val, kvd.SetOptions{Retention: "long"}); !ok || err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := ca.Get(ns, []byte("missing1"), nil); err != nil || ok {
		t.Fatalf("miss during the outage: %v %v", ok, err)
	}
	if got, _, ok, err := cb.Get(ns, key, nil); err != nil || !ok || !bytes.Equal(got, val) {
		t.Fatalf("B during the outage: %v %v", ok, err)
	}
	for deadline := time.Now().Add(10 * time.Second); metric(a, "infera_kvd_l4_up") != "0"; {
		if time.Now().After(deadline) {
			t.Fatal("A's l4 gauge did not drop")
		}
		_, _, _, _ = ca.Get(ns, []byte("missing2"), nil)
		time.Sleep(50 * time.Millisecond)
	}
	if n := strings.Count(a.p.logText(), "l4 redis unreachable"); n != 1 {
		t.Fatalf("A logged the outage %d times, want once", n)
	}
	for _, d := range []daemon{a, b} {
		d.p.signal(syscall.SIGTERM)
		if err := d.p.wait(30 * time.Second); err != nil {
			t.Fatalf("kvd exit: %v\n%s", err, d.p.logText())
		}
	}
}
