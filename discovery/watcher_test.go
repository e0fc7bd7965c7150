package discovery_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
	"github.com/infera/infera/internal/testkit"
)

// Records present before Run and put, updated and deleted afterwards all
// show in the snapshot; onChange sees every published snapshot; records
// outside the prefix are not ours.
func TestWatcherFollowsPrefix(t *testing.T) {
	eps := etcdtest.Start(t)
	cli := etcdtest.Client(t, eps)
	put(t, cli, record("b:1"))
	if _, err := cli.Put(t.Context(), "/infera-test/other/x:1", "{}"); err != nil {
		t.Fatal(err)
	}

	var last atomic.Pointer[discovery.Snapshot]
	w := discovery.NewWatcher(cli, testPrefix, zerolog.Nop(), func(s *discovery.Snapshot) { last.Store(s) })
	if s := w.Snapshot(); s == nil || len(s.Workers) != 0 {
		t.Fatalf("snapshot before Run = %#v, want empty non-nil", s)
	}
	startWatcher(t, w)
	select {
	case <-w.Synced():
	case <-time.After(waitDeadline):
		t.Fatal("not synced")
	}
	waitIDs(t, w, "b:1")

	put(t, cli, record("c:1"))
	put(t, cli, record("a:1"))
	waitIDs(t, w, "a:1", "b:1", "c:1")

	drain := record("b:1")
	drain.Status = discovery.StatusDraining
	put(t, cli, drain)
	testkit.Eventually(t, "b:1 draining", func() bool {
		r, ok := w.Snapshot().Get("b:1")
		return ok && !r.Active()
	})

	del(t, cli, "a:1")
	waitIDs(t, w, "b:1", "c:1")
	if last.Load() != w.Snapshot() {
		t.Fatal("onChange did not receive the published snapshot")
	}
	if rev := w.Snapshot().Revision; rev == 0 {
		t.Fatal("snapshot revision not set")
	}
}

// Invalid values are ignored with one log line per key and revision (not
// again on each re-list); an invalid value over a valid one removes the
// worker; a record under a key that is not <prefix><worker_id> is invalid.
func TestWatcherIgnoresInvalidRecords(t *testing.T) {
	eps := etcdtest.Start(t)
	cli := etcdtest.Client(t, eps)
	var logs testkit.LogSink
	const msg = "ignoring invalid worker record"

	if _, err := cli.Put(t.Context(), testPrefix+"bad:1", `{"worker_id":"bad:1"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), testPrefix+"y:1", encode(t, record("x:1"))); err != nil {
		t.Fatal(err)
	}
	put(t, cli, record("a:1"))

	w := discovery.NewWatcher(cli, testPrefix, debugLogger(&logs), nil)
	relistOnce(t, w, cli, nil)
	startWatcher(t, w)
	waitIDs(t, w, "a:1")
	if n := logs.Count(msg); n != 2 {
		t.Fatalf("%d invalid-record lines after the first list, want 2", n)
	}

	// A re-list sees the same two values: no new lines.
	before := w.Snapshot()
	testkit.Eventually(t, "watch open", func() bool { return discovery.CloseWatch(w) })
	testkit.Eventually(t, "re-list", func() bool { return discovery.Lists(w) >= 2 && w.Snapshot() != before })
	if n := logs.Count(msg); n != 2 {
		t.Fatalf("%d invalid-record lines after a re-list, want still 2", n)
	}

	// A new invalid value (new revision) is reported once, and it takes a
	// previously valid worker out of the view.
	if _, err := cli.Put(t.Context(), testPrefix+"a:1", `not json`); err != nil {
		t.Fatal(err)
	}
	waitIDs(t, w)
	if n := logs.Count(msg); n != 3 {
		t.Fatalf("%d invalid-record lines, want 3", n)
	}

	// Fixing the value brings the worker back.
	put(t, cli, record("a:1"))
	put(t, cli, record("bad:1"))
	waitIDs(t, w, "a:1", "bad:1")
	if n := logs.Count(msg); n != 3 {
		t.Fatalf("%d invalid-record lines, want still 3", n)
	}
}

// Compaction: changes made between the list at R and the watch from R+1 are
// compacted away, so the watch fails with ErrCompacted; the watcher re-lists
// and holds exactly the live records — the worker deleted in the gap is gone.
func TestWatcherRelistsAfterCompaction(t *testing.T) {
	var logs testkit.LogSink
	cli, w := watcherOver(t, &logs, "a:1", "b:1", "c:1")
	discovery.SetWatcherHooks(w, nil, func(n int, rev int64) {
		if n != 1 {
			return
		}
		// Runs on the watcher's goroutine after the first list at rev and
		// before its watch from rev+1 starts.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := cli.Delete(ctx, testPrefix+"b:1"); err != nil {
			t.Error(err)
		}
		if _, err := cli.Put(ctx, testPrefix+"d:1", encode(t, record("d:1"))); err != nil {
			t.Error(err)
		}
		compactPast(t, cli)
	})
	startWatcher(t, w)
	waitIDs(t, w, "a:1", "c:1", "d:1")
	if n := discovery.Lists(w); n < 2 {
		t.Fatalf("%d lists, want a re-list", n)
	}
	if logs.Count("etcd watch compacted, re-listing") == 0 {
		t.Fatal("compaction was not the reason of the re-list")
	}

	// And the new watch works.
	del(t, cli, "a:1")
	waitIDs(t, w, "c:1", "d:1")
}

// Watch cancel: when the watch stream closes, the watcher resumes it from
// the revision after the last it applied, without a list: a worker deleted
// and one added while no watch was open arrive as events, in order, and the
// delete applies at once although an outage grace is set (etcd answered
// throughout, so nothing it did can have expired a live worker's lease).
func TestWatcherResumesAfterWatchCancel(t *testing.T) {
	var logs testkit.LogSink
	cli, w := watcherOver(t, &logs, "a:1", "b:1")
	w.SetOutageGrace(time.Minute)
	resumes := 0
	discovery.SetWatcherResumeHook(w, func(int64) {
		resumes++
		if resumes != 1 {
			return
		}
		// The old watch is closed and the new one has not started: the gap.
		delKey(t, cli, "b:1")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := cli.Put(ctx, testPrefix+"c:1", encode(t, record("c:1"))); err != nil {
			t.Error(err)
		}
	})
	startWatcher(t, w)
	waitIDs(t, w, "a:1", "b:1")

	testkit.Eventually(t, "watch open", func() bool { return discovery.CloseWatch(w) })
	waitIDs(t, w, "a:1", "c:1")
	if n := discovery.Lists(w); n != 1 {
		t.Fatalf("%d lists, want 1: the watch resumes", n)
	}
	if logs.Count("etcd watch interrupted, resuming") == 0 {
		t.Fatal("the resume was not logged")
	}
	if n := strings.Count(logs.String(), "kept while it may re-register"); n != 0 {
		t.Fatalf("%d removals held after a plain watch interruption:\n%s", n, logs.String())
	}
	put(t, cli, record("d:1"))
	waitIDs(t, w, "a:1", "c:1", "d:1")
}

// While etcd is down the watcher keeps its last view and retries; after
// etcd is back it converges to exactly the live records, and Run still
// returns nil on cancel.
func TestWatcherSurvivesEtcdRestart(t *testing.T) {
	etcd := etcdtest.StartRestartable(t)
	cli := etcdtest.Client(t, etcd.Endpoints())
	put(t, cli, record("a:1"))
	put(t, cli, record("b:1"))

	w := discovery.NewWatcher(cli, testPrefix, zerolog.Nop(), nil)
	startWatcher(t, w)
	waitIDs(t, w, "a:1", "b:1")

	etcd.Stop()
	if got := ids(w.Snapshot()); !slices.Equal(got, []string{"a:1", "b:1"}) {
		t.Fatalf("view changed while etcd was down: %v", got)
	}
	etcd.Start()
	del(t, cli, "b:1")
	put(t, cli, record("c:1"))
	waitIDs(t, w, "a:1", "c:1")
}

// TestWatcherLogsOutageOnce: while etcd is down the watcher says so once
// (however long the outage and however many retries), keeps its view, and
// says once that etcd is back.
func TestWatcherLogsOutageOnce(t *testing.T) {
	etcd := etcdtest.StartRestartable(t)
	cli := etcdtest.Client(t, etcd.Endpoints())
	put(t, cli, record("a:1"))

	logs := &testkit.LogSink{}
	w := discovery.NewWatcher(cli, testPrefix, zerolog.New(logs), nil)
	discovery.SetProbeInterval(w, 100*time.Millisecond)
	startWatcher(t, w)
	waitIDs(t, w, "a:1")

	etcd.Stop()
	testkit.Eventually(t, "the outage to be logged", func() bool { return strings.Count(logs.String(), "keeping the last fleet snapshot") == 1 })
	// Many probe and list retries later, still one line, and the view kept.
	sessions := discovery.Sessions(w)
	testkit.Eventually(t, "more retries", func() bool { return discovery.Sessions(w) >= sessions+3 })
	if n := strings.Count(logs.String(), "keeping the last fleet snapshot"); n != 1 {
		t.Fatalf("outage logged %d times, want once:\n%s", n, logs.String())
	}
	if got := ids(w.Snapshot()); !slices.Equal(got, []string{"a:1"}) {
		t.Fatalf("view changed while etcd was down: %v", got)
	}

	etcd.Start()
	testkit.Eventually(t, "the recovery to be logged", func() bool { return strings.Count(logs.String(), "etcd reachable again") == 1 })
	put(t, cli, record("b:1"))
	waitIDs(t, w, "a:1", "b:1")
	if n := strings.Count(logs.String(), "keeping the last fleet snapshot"); n != 1 {
		t.Fatalf("outage logged %d times, want once:\n%s", n, logs.String())
	}
}

// Keys under the prefix that cannot be worker records (Infera's planner
// writes planner/decision there) are skipped with one debug line per key,
// not reported as invalid records, on the first list, on re-lists and in
// watch events.
func TestWatcherSkipsNonWorkerKeys(t *testing.T) {
	eps := etcdtest.Start(t)
	cli := etcdtest.Client(t, eps)
	var logs testkit.LogSink
	const skip = "skipping non-worker key under the prefix"
	const invalid = "ignoring invalid worker record"

	if _, err := cli.Put(t.Context(), testPrefix+"planner/decision", `{"replicas": 3}`); err != nil {
		t.Fatal(err)
	}
	put(t, cli, record("a:1"))
	w := discovery.NewWatcher(cli, testPrefix, debugLogger(&logs), nil)
	relistOnce(t, w, cli, nil)
	startWatcher(t, w)
	waitIDs(t, w, "a:1")

	before := w.Snapshot()
	testkit.Eventually(t, "watch open", func() bool { return discovery.CloseWatch(w) })
	testkit.Eventually(t, "re-list", func() bool { return discovery.Lists(w) >= 2 && w.Snapshot() != before })

	// Updates through the watch: the planner key changes, then a worker
	// arrives so the test knows the events before it were applied.
	if _, err := cli.Put(t.Context(), testPrefix+"planner/decision", `{"replicas": 4}`); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), testPrefix+"planner/history/1", `[]`); err != nil {
		t.Fatal(err)
	}
	put(t, cli, record("b:1"))
	waitIDs(t, w, "a:1", "b:1")
	if n := logs.Count(skip); n != 2 {
		t.Fatalf("%d skip lines, want one per non-worker key (2)", n)
	}
	if n := logs.Count(invalid); n != 0 {
		t.Fatalf("%d invalid-record lines, want 0", n)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "planner") && !strings.Contains(line, `"level":"debug"`) {
			t.Fatalf("non-worker key logged above debug: %s", line)
		}
	}
}
