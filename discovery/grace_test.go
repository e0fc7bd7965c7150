package discovery_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
	"github.com/infera/infera/internal/testkit"
)

// With an outage grace, a worker missing from a re-list (its record was
// deleted while no watch ran) stays in the view, and so does one whose
// delete arrives by the watch just after the re-list; a record put again
// ends the hold, and the re-appeared worker was never out of the view.
func TestWatcherHoldsRemovalsAfterRelist(t *testing.T) {
	eps := etcdtest.Start(t)
	cli := etcdtest.Client(t, eps)
	var logs testkit.LogSink
	put(t, cli, record("a:1"))
	put(t, cli, record("b:1"))

	var mu sync.Mutex
	var sawWithout []string // snapshots that lacked a:1 or b:1
	w := discovery.NewWatcher(cli, testPrefix, debugLogger(&logs), func(s *discovery.Snapshot) {
		got := ids(s)
		if !slices.Contains(got, "a:1") || !slices.Contains(got, "b:1") {
			mu.Lock()
			sawWithout = append(sawWithout, strings.Join(got, ","))
			mu.Unlock()
		}
	})
	w.SetOutageGrace(time.Minute) // longer than the test: nothing expires
	// Between the closed watch and the re-list (the history was compacted
	// meanwhile): b:1's lease expired.
	relistOnce(t, w, cli, func() { delKey(t, cli, "b:1") })
	startWatcher(t, w)
	waitIDs(t, w, "a:1", "b:1")
	testkit.Eventually(t, "watch open", func() bool { return discovery.CloseWatch(w) })
	testkit.Eventually(t, "the re-list", func() bool { return discovery.Lists(w) >= 2 && logs.Count("etcd fleet re-listed") > 0 })
	if got := ids(w.Snapshot()); !slices.Equal(got, []string{"a:1", "b:1"}) {
		t.Fatalf("after the re-list the view is %v: b:1 was removed despite the grace", got)
	}
	if logs.Count("worker missing from the re-list: kept while it may re-register") != 1 {
		t.Fatalf("the hold is not logged once:\n%s", logs.String())
	}

	// A delete by the watch right after the re-list is held too; a later
	// event (c:1) shows the delete was processed.
	del(t, cli, "a:1")
	put(t, cli, record("c:1"))
	waitIDs(t, w, "a:1", "b:1", "c:1")

	// Both re-register: the holds end.
	put(t, cli, record("a:1"))
	put(t, cli, record("b:1"))
	testkit.Eventually(t, "holds ended", func() bool { return logs.Count("held worker re-registered") == 2 })
	mu.Lock()
	defer mu.Unlock()
	if len(sawWithout) > 0 {
		t.Fatalf("the view lacked a held worker: %v", sawWithout)
	}
}

// A held worker that does not re-register is removed once its grace ends;
// without a grace the re-list removes it at once (the default).
func TestWatcherHeldWorkerExpires(t *testing.T) {
	var logs testkit.LogSink
	cli, w := watcherOver(t, &logs, "a:1", "b:1")
	w.SetOutageGrace(300 * time.Millisecond)
	relistOnce(t, w, cli, func() { delKey(t, cli, "b:1") })
	startWatcher(t, w)
	waitIDs(t, w, "a:1", "b:1")
	testkit.Eventually(t, "watch open", func() bool { return discovery.CloseWatch(w) })
	waitIDs(t, w, "a:1")
	if logs.Count("held worker did not re-register within the grace: removed") != 1 {
		t.Fatalf("the expiry is not logged once:\n%s", logs.String())
	}
}

// A worker that deregisters on purpose (its record says draining first, as
// `infera worker` writes it before it revokes its lease) is removed at
// once even inside the grace window; a plain delete there is held.
func TestWatcherDoesNotHoldLeavingWorker(t *testing.T) {
	var logs testkit.LogSink
	cli, w := watcherOver(t, &logs, "a:1", "d:1")
	w.SetOutageGrace(time.Minute)
	relistOnce(t, w, cli, nil) // the re-list opens the grace window
	startWatcher(t, w)
	waitIDs(t, w, "a:1", "d:1")
	testkit.Eventually(t, "watch open", func() bool { return discovery.CloseWatch(w) })
	testkit.Eventually(t, "the re-list", func() bool { return discovery.Lists(w) >= 2 })

	drain := record("d:1")
	drain.Status = discovery.StatusDraining
	put(t, cli, drain)
	del(t, cli, "d:1")
	waitIDs(t, w, "a:1")

	del(t, cli, "a:1")
	put(t, cli, record("c:1"))
	waitIDs(t, w, "a:1", "c:1")
	if n := strings.Count(logs.String(), "kept while it may re-register"); n != 1 {
		t.Fatalf("%d removals held, want 1 (a:1):\n%s", n, logs.String())
	}
}
