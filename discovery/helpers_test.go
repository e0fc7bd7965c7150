package discovery_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
	"github.com/infera/infera/internal/testkit"
)

const testPrefix = "/infera-test/workers/"

// waitDeadline is generous: these tests share two cores with other work, and
// the conditions they wait for are protocol outcomes, not timings.
const waitDeadline = 30 * time.Second

// debugLogger logs JSON at debug level into b.
func debugLogger(b *testkit.LogSink) zerolog.Logger { return zerolog.New(b).Level(zerolog.DebugLevel) }

// watcherOver starts an etcd server, registers the workers ids in it and
// returns a client of it and a watcher of the records (not yet running)
// that logs into logs at debug level.
func watcherOver(t *testing.T, logs *testkit.LogSink, ids ...string) (*clientv3.Client, *discovery.Watcher) {
	t.Helper()
	cli := etcdtest.Client(t, etcdtest.Start(t))
	for _, id := range ids {
		put(t, cli, record(id))
	}
	return cli, discovery.NewWatcher(cli, testPrefix, debugLogger(logs), nil)
}

func record(id string) discovery.Record {
	return discovery.Record{WorkerID: id, URL: "http://" + id, ModelName: "sim-model", Engine: "sim"}
}

func encode(t *testing.T, rec discovery.Record) string {
	t.Helper()
	b, err := rec.Encode()
	if err != nil {
		t.Error(err)
	}
	return string(b)
}

func put(t *testing.T, cli *clientv3.Client, rec discovery.Record) {
	t.Helper()
	if _, err := cli.Put(t.Context(), testPrefix+rec.WorkerID, encode(t, rec)); err != nil {
		t.Fatal(err)
	}
}

func del(t *testing.T, cli *clientv3.Client, id string) {
	t.Helper()
	if _, err := cli.Delete(t.Context(), testPrefix+id); err != nil {
		t.Fatal(err)
	}
}

// ids lists the worker ids of a snapshot, in order.
func ids(s *discovery.Snapshot) []string {
	out := make([]string, 0, len(s.Workers))
	for _, r := range s.Workers {
		out = append(out, r.WorkerID)
	}
	return out
}

// waitIDs waits until the watcher's snapshot holds exactly want.
func waitIDs(t *testing.T, w *discovery.Watcher, want ...string) {
	t.Helper()
	testkit.Eventually(t, "snapshot "+strings.Join(want, ","), func() bool {
		return slices.Equal(ids(w.Snapshot()), want)
	})
}

// startWatcher runs w (a Watcher or a KVDWatcher) until the test ends
// and checks that Run returned nil.
func startWatcher(t *testing.T, w interface{ Run(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watcher Run: %v", err)
		}
	})
}

// startRegistrar runs r.Run until the returned stop is called or the test
// ends; stop waits for Run to return.
func startRegistrar(t *testing.T, r *discovery.Registrar) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("registrar Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// leaseOf returns the lease a worker's key is attached to (0: key absent).
func leaseOf(t *testing.T, cli *clientv3.Client, id string) clientv3.LeaseID {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, testPrefix+id)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// compactPast writes two revisions outside the prefix and compacts the
// history up to the last one, so that a watch resumed from any earlier
// revision fails with ErrCompacted and the watcher must re-list. It may
// run on the watcher's goroutine (a hook): it reports with t.Error.
func compactPast(t *testing.T, cli *clientv3.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var last int64
	for i := range 2 {
		resp, err := cli.Put(ctx, "/infera-test/noise", strconv.Itoa(i))
		if err != nil {
			t.Error(err)
			return
		}
		last = resp.Header.Revision
	}
	if _, err := cli.Compact(ctx, last, clientv3.WithCompactPhysical()); err != nil {
		t.Error(err)
	}
}

// relistOnce makes the watcher's next resumed watch fail as compacted, so
// that it re-lists; first (optional) runs before, in the gap between the
// closed watch and the re-list. Later resumes are left alone.
func relistOnce(t *testing.T, w *discovery.Watcher, cli *clientv3.Client, first func()) {
	var once sync.Once
	discovery.SetWatcherResumeHook(w, func(int64) {
		once.Do(func() {
			if first != nil {
				first()
			}
			compactPast(t, cli)
		})
	})
}

// delKey deletes a worker's key; unlike del it may run on a watcher's
// goroutine (a hook): it reports with t.Error.
func delKey(t *testing.T, cli *clientv3.Client, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Delete(ctx, testPrefix+id); err != nil {
		t.Error(err)
	}
}
