package e2e

import (
	"bytes"
	"context"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd"
)

// TestKVDPeerPull (the data plane, acceptance 1, TCP half): two `infera
// kvd` processes standing for two hosts. A block set on kvd A is pulled by
// kvd B when B is told (a prefetch hint naming A as the source, as the
// router sends) and then served from B's RAM byte for byte; a wrong
// secret pulls nothing; once A is SIGKILLed a hint is a miss, and B keeps
// serving.
func TestKVDPeerPull(t *testing.T) {
	dir := t.TempDir()
	peerPort := testkit.FreePortPair(t)
	type daemon struct {
		p     *proc
		sock  string
		admin string
	}
	startKVD := func(name string, extra ...string) daemon {
		d := daemon{sock: filepath.Join(dir, name+".sock"), admin: "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t))}
		args := append([]string{"kvd", "--socket", d.sock, "--max-bytes", "32MiB", "--shared-arena-bytes", "16MiB",
			"--arena-slot-bytes", "64KiB", "--arena-mlock=false", "--admin-listen", d.admin}, extra...)
		d.p = start(t, name, args...)
		d.p.waitLog("kvd serving", 20*time.Second)
		return d
	}
	a := startKVD("kvd-a", "--peer-listen", "127.0.0.1:"+strconv.Itoa(peerPort), "--peer-secret", "fleet-secret")
	b := startKVD("kvd-b", "--peer-secret", "fleet-secret")
	c := startKVD("kvd-c", "--peer-secret", "not-the-fleet's")
	source := "127.0.0.1:" + strconv.Itoa(peerPort)

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dial := func(d daemon) *kvd.Client {
		cl, err := kvd.Dial(ctx, d.sock, kvd.ClientOptions{SharedArena: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	ca, cb, cc := dial(a), dial(b), dial(c)
	ns := kvd.Namespace{Model: "Qwen/Qwen3-8B", CompatKey: "tp0of1_pp0of1"}
	var keys [][]byte
	vals := map[string][]byte{}
	for i := range 8 {
		k := []byte("prefix-block-" + strconv.Itoa(i))
		v := bytes.Repeat([]byte{byte('a' + i)}, 40000+i)
		if ok, reason, err := ca.Set(ns, k, v, kvd.SetOptions{}); !ok || err != nil {
			t.Fatal(reason, err)
		}
		keys = append(keys, k)
		vals[string(k)] = v
	}
	if err := cb.PrefetchFromCtx(ctx, ns, source, keys, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, b.admin, "infera_kvd_peer_pulled_blocks_total", 8, "B pulls A's blocks")
	for _, k := range keys {
		got, _, ok, err := cb.Get(ns, k, nil)
		if err != nil || !ok || !bytes.Equal(got, vals[string(k)]) {
			t.Fatalf("B serves %s: ok %v err %v, %d bytes", k, ok, err, len(got))
		}
	}
	// A kvd with the wrong secret pulls nothing.
	if err := cc.PrefetchFromCtx(ctx, ns, source, keys, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, c.admin, "infera_kvd_peer_pulls_failed_total", 1, "C's pull with the wrong secret fails")
	if _, _, ok, _ := cc.Get(ns, keys[0], nil); ok {
		t.Fatal("a kvd with the wrong secret got a block")
	}
	// The source dies: a hint for a block B lacks is a miss, B serves on.
	a.p.stop(syscall.SIGKILL)
	more := []byte("never-pulled")
	if err := cb.PrefetchFromCtx(ctx, ns, source, [][]byte{more}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, b.admin, "infera_kvd_peer_pulls_failed_total", 1, "B's pull from a dead source fails")
	if _, _, ok, err := cb.Get(ns, more, nil); ok || err != nil {
		t.Fatalf("block from a dead source: ok %v err %v", ok, err)
	}
	if got, _, ok, err := cb.Get(ns, keys[3], nil); !ok || err != nil || !bytes.Equal(got, vals[string(keys[3])]) {
		t.Fatalf("B after A died: ok %v err %v", ok, err)
	}
}
