package discovery_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
	"github.com/infera/infera/internal/testkit"
)

func TestRegistrarOptionDefaults(t *testing.T) {
	for _, tt := range []struct {
		opts          discovery.RegistrarOptions
		ttl, interval time.Duration
	}{
		{discovery.RegistrarOptions{}, 10 * time.Second, 3 * time.Second},
		{discovery.RegistrarOptions{TTL: 1500 * time.Millisecond, KeepAliveInterval: 500 * time.Millisecond}, 2 * time.Second, 500 * time.Millisecond},
		// A keepalive slower than TTL/2 could let the lease lapse after one miss.
		{discovery.RegistrarOptions{TTL: 3 * time.Second, KeepAliveInterval: 5 * time.Second}, 3 * time.Second, time.Second},
	} {
		r := discovery.NewRegistrar(nil, testPrefix, record("a:1"), tt.opts, zerolog.Nop())
		ttl, interval := discovery.RegistrarInterval(r)
		if time.Duration(ttl) != tt.ttl || time.Duration(interval) != tt.interval {
			t.Errorf("%+v: ttl %v interval %v, want %v %v", tt.opts, time.Duration(ttl), time.Duration(interval), tt.ttl, tt.interval)
		}
	}
}

// Register puts the record under a lease; the watcher sees it; SetStatus
// rewrites it under the same lease.
func TestRegistrarRegisterAndSetStatus(t *testing.T) {
	eps := etcdtest.Start(t)
	cli := etcdtest.Client(t, eps)
	w := discovery.NewWatcher(cli, testPrefix, zerolog.Nop(), nil)
	startWatcher(t, w)

	r := discovery.NewRegistrar(cli, testPrefix, record("a:1"), discovery.RegistrarOptions{TTL: 5 * time.Second, KeepAliveInterval: 200 * time.Millisecond}, zerolog.Nop())
	if err := r.Register(t.Context()); err != nil {
		t.Fatal(err)
	}
	startRegistrar(t, r)
	waitIDs(t, w, "a:1")
	lease := leaseOf(t, cli, "a:1")
	if lease == 0 {
		t.Fatal("record not attached to a lease")
	}

	if err := r.SetStatus(t.Context(), discovery.StatusDraining); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "draining", func() bool {
		rec, ok := w.Snapshot().Get("a:1")
		return ok && rec.Status == discovery.StatusDraining && !rec.Active()
	})
	if got := leaseOf(t, cli, "a:1"); got != lease {
		t.Fatalf("SetStatus moved the record to lease %x, want %x", got, lease)
	}
	if err := r.SetStatus(t.Context(), discovery.StatusActive); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "active again", func() bool {
		rec, ok := w.Snapshot().Get("a:1")
		return ok && rec.Active()
	})
	if err := r.SetStatus(t.Context(), "gone"); !errors.Is(err, discovery.ErrInvalidRecord) {
		t.Fatalf("SetStatus(gone) = %v, want ErrInvalidRecord", err)
	}
	if r.Record().Status != discovery.StatusActive {
		t.Fatal("a rejected status was stored")
	}
}

func TestRegistrarRejectsInvalidRecord(t *testing.T) {
	cli := etcdtest.Client(t, etcdtest.Start(t))
	bad := record("a:1")
	bad.URL = "http://elsewhere:1"
	r := discovery.NewRegistrar(cli, testPrefix, bad, discovery.RegistrarOptions{}, zerolog.Nop())
	if err := r.Register(t.Context()); !errors.Is(err, discovery.ErrInvalidRecord) {
		t.Fatalf("Register = %v, want ErrInvalidRecord", err)
	}
	leases, err := cli.Leases(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 0 {
		t.Fatalf("%d leases granted for an invalid record", len(leases.Leases))
	}
}

// Stopping keepalives without revoking (a dead host) lets the lease expire,
// which removes the record from every watcher.
func TestRegistrarLeaseExpiry(t *testing.T) {
	cli := etcdtest.Client(t, etcdtest.Start(t))
	w := discovery.NewWatcher(cli, testPrefix, zerolog.Nop(), nil)
	startWatcher(t, w)

	r := discovery.NewRegistrar(cli, testPrefix, record("a:1"), discovery.RegistrarOptions{TTL: 2 * time.Second, KeepAliveInterval: 300 * time.Millisecond}, zerolog.Nop())
	if err := r.Register(t.Context()); err != nil {
		t.Fatal(err)
	}
	stop := startRegistrar(t, r)
	waitIDs(t, w, "a:1")
	stop()
	waitIDs(t, w)
	if leaseOf(t, cli, "a:1") != 0 {
		t.Fatal("key survived its lease")
	}
}

// Revoke deletes the record at once (no waiting for the TTL), ends Run and
// forbids registering again.
func TestRegistrarRevoke(t *testing.T) {
	cli := etcdtest.Client(t, etcdtest.Start(t))
	w := discovery.NewWatcher(cli, testPrefix, zerolog.Nop(), nil)
	startWatcher(t, w)

	r := discovery.NewRegistrar(cli, testPrefix, record("a:1"), discovery.RegistrarOptions{TTL: 30 * time.Second}, zerolog.Nop())
	if err := r.Register(t.Context()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(t.Context()) }()
	waitIDs(t, w, "a:1")

	if err := r.Revoke(t.Context()); err != nil {
		t.Fatal(err)
	}
	if leaseOf(t, cli, "a:1") != 0 {
		t.Fatal("record still present right after Revoke")
	}
	waitIDs(t, w)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(waitDeadline):
		t.Fatal("Run did not return after Revoke")
	}
	if err := r.Register(t.Context()); !errors.Is(err, discovery.ErrRevoked) {
		t.Fatalf("Register after Revoke = %v, want ErrRevoked", err)
	}
	if err := r.SetStatus(t.Context(), discovery.StatusDraining); err != nil {
		t.Fatalf("SetStatus after Revoke = %v", err)
	}
	if err := r.Revoke(t.Context()); err != nil {
		t.Fatalf("second Revoke = %v", err)
	}
	if leaseOf(t, cli, "a:1") != 0 {
		t.Fatal("record came back after Revoke")
	}
}

// A lease that disappears under the registrar (here revoked by someone
// else) is noticed at the next keepalive; the record comes back under a new
// lease and the loss is logged once.
func TestRegistrarReRegistersAfterLeaseLoss(t *testing.T) {
	cli := etcdtest.Client(t, etcdtest.Start(t))
	var logs testkit.LogSink
	r := discovery.NewRegistrar(cli, testPrefix, record("a:1"), discovery.RegistrarOptions{TTL: 10 * time.Second, KeepAliveInterval: 200 * time.Millisecond}, debugLogger(&logs))
	if err := r.Register(t.Context()); err != nil {
		t.Fatal(err)
	}
	startRegistrar(t, r)
	old := leaseOf(t, cli, "a:1")
	if _, err := cli.Revoke(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "record under a new lease", func() bool {
		l := leaseOf(t, cli, "a:1")
		return l != 0 && l != old
	})
	// The line is written just after the put that the poll above saw.
	testkit.Eventually(t, "re-registration logged", func() bool { return logs.Count("worker record re-registered") == 1 })
	if n := logs.Count("etcd lease lost, re-registering"); n != 1 {
		t.Fatalf("lease loss logged %d times, want 1", n)
	}
}

// etcd down for longer than the TTL: the registrar retries without
// flooding the log, presumes the lease lost, and once etcd is back writes
// the record (with the status set meanwhile) under a new lease and revokes
// the old one.
func TestRegistrarReGrantsAfterOutageLongerThanTTL(t *testing.T) {
	etcd := etcdtest.StartRestartable(t)
	cli := etcdtest.Client(t, etcd.Endpoints())
	var logs testkit.LogSink
	r := discovery.NewRegistrar(cli, testPrefix, record("a:1"), discovery.RegistrarOptions{TTL: 2 * time.Second, KeepAliveInterval: 300 * time.Millisecond}, debugLogger(&logs))
	if err := r.Register(t.Context()); err != nil {
		t.Fatal(err)
	}
	startRegistrar(t, r)
	old := leaseOf(t, cli, "a:1")

	etcd.Stop()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	err := r.SetStatus(ctx, discovery.StatusDraining)
	cancel()
	if err == nil {
		t.Fatal("SetStatus succeeded with etcd down")
	}
	testkit.Eventually(t, "lease presumed lost", func() bool { return discovery.RegistrarStale(r) })

	etcd.Start()
	testkit.Eventually(t, "record under a new lease", func() bool {
		l := leaseOf(t, cli, "a:1")
		return l != 0 && l != old
	})
	resp, err := cli.Get(t.Context(), testPrefix+"a:1")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := discovery.DecodeRecord(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != discovery.StatusDraining {
		t.Fatalf("status %q after recovery, want draining", rec.Status)
	}
	testkit.Eventually(t, "old lease revoked", func() bool {
		ttl, err := cli.TimeToLive(t.Context(), old)
		return err == nil && ttl.TTL == -1
	})
	testkit.Eventually(t, "re-registration logged", func() bool { return logs.Count("worker record re-registered") > 0 })
	for _, msg := range []string{"etcd unreachable, retrying", "etcd lease lost, re-registering", "worker record re-registered"} {
		if n := logs.Count(msg); n != 1 {
			t.Errorf("%q logged %d times, want 1", msg, n)
		}
	}
}

// TestRegistrarLeavesStoppedMember (session 24): a member that stops
// answering without closing its connections (SIGSTOP here; a hung host or
// a dead link alike) holds every call the client's round robin sends it
// until gRPC keepalive drops the connection (~15 s). Three registrars on
// one client of a 3-member cluster, one follower stopped (so no election
// is part of the fault). Their Register calls run one after the other, so
// their six grants and puts go to each member twice: each Register must
// complete well within the TTL (before: the first whose call went to the
// stopped member waited the whole TTL and failed). Then the leases must be
// kept alive for a TTL, a third of the keepalives going to the stopped
// member; and, the registrars stopped, three Revokes one after the other
// (one goes to the stopped member), each bounded as the worker bounds it
// (3 s), must each delete its record. The stall is logged naming the
// stopped member.
func TestRegistrarLeavesStoppedMember(t *testing.T) {
	const ttl = 6 * time.Second
	// A bound that only a call held by the stopped member breaks: the
	// first try of each call is bounded by 600 ms (a tenth of the TTL).
	const bound = ttl / 2
	c := etcdtest.StartCluster(t, 3)
	eps := c.Endpoints()
	boot := etcdtest.Client(t, eps)
	lead := -1
	testkit.Eventually(t, "a leader", func() bool { lead = c.Leader(boot); return lead >= 0 })
	stopped := (lead + 1) % len(eps)
	// The test's own reads go to the members that answer.
	admin := etcdtest.Client(t, slices.Delete(slices.Clone(eps), stopped, stopped+1))
	cli := etcdtest.Client(t, eps)
	// Every member connected, so that the round robin counts each as
	// ready and sends it every third call (a member still connecting is
	// skipped): reads until each has answered one.
	seen := map[string]bool{}
	testkit.Eventually(t, "a read answered by every member", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), waitDeadline)
		m, err := discovery.GetMember(ctx, cli, "/infera-test/warm")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		seen[m] = true
		return len(seen) == len(eps)
	})
	var logs testkit.LogSink
	c.Pause(stopped)
	t.Cleanup(func() { c.Resume(stopped) })
	t.Logf("stopped member %d (%s), a follower of member %d", stopped, eps[stopped], lead)

	regs := make([]*discovery.Registrar, 3)
	leases := make([]clientv3.LeaseID, len(regs))
	for i := range regs {
		id := "a:" + strconv.Itoa(i+1)
		regs[i] = discovery.NewRegistrar(cli, testPrefix, record(id),
			discovery.RegistrarOptions{TTL: ttl, KeepAliveInterval: time.Second}, debugLogger(&logs))
		began := time.Now()
		err := regs[i].Register(t.Context())
		took := time.Since(began)
		t.Logf("Register %s took %v", id, took.Round(time.Millisecond))
		if err != nil {
			t.Fatalf("Register %s with one member stopped: %v (after %v)\n%s", id, err, took, logs.String())
		}
		if took > bound {
			t.Errorf("Register %s took %v, want at most %v (TTL %v)\n%s", id, took, bound, ttl, logs.String())
		}
		if leases[i] = leaseOf(t, admin, id); leases[i] == 0 {
			t.Fatalf("%s not registered", id)
		}
	}

	// The fault lasts a TTL while the registrars keep their leases alive.
	stops := make([]func(), len(regs))
	for i, r := range regs {
		stops[i] = startRegistrar(t, r)
	}
	time.Sleep(ttl)
	for _, stop := range stops {
		stop()
	}
	for i := range regs {
		id := "a:" + strconv.Itoa(i+1)
		if got := leaseOf(t, admin, id); got != leases[i] {
			t.Errorf("%s under lease %x after a TTL with one member stopped, want %x kept alive", id, got, leases[i])
		}
	}
	if n := logs.Count("etcd lease lost, re-registering"); n != 0 {
		t.Errorf("%d leases lost with one member stopped:\n%s", n, logs.String())
	}

	for i, r := range regs {
		id := "a:" + strconv.Itoa(i+1)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		began := time.Now()
		err := r.Revoke(ctx)
		cancel()
		t.Logf("Revoke %s took %v", id, time.Since(began).Round(time.Millisecond))
		if err != nil {
			t.Errorf("Revoke %s with one member stopped: %v", id, err)
		}
		if leaseOf(t, admin, id) != 0 {
			t.Errorf("%s still registered after Revoke", id)
		}
	}

	member := strings.TrimPrefix(eps[stopped], "http://")
	named := 0
	for _, e := range logs.Find(t, "etcd member did not answer in time, retrying on another") {
		if e["etcd_member"] == member {
			named++
		}
	}
	if named == 0 {
		t.Errorf("no stall logged naming the stopped member %s:\n%s", member, logs.String())
	}
}
