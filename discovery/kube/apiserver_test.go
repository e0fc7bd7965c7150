package kube_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/kube"
	"github.com/infera/infera/discovery/kube/kubetest"
)

const podsPath = "/api/v1/namespaces/default/pods"

func createRunningPod(t *testing.T, cli *kube.Client, name string) {
	kubetest.CreateRunningPod(t, cli, name, map[string]string{"app": "infera-worker"})
}

func rec(id string) discovery.Record {
	return discovery.Record{WorkerID: id, URL: "http://" + id, ModelName: "m", Engine: "sim"}
}

type fleet struct {
	mu   sync.Mutex
	snap *discovery.Snapshot
	ch   chan struct{}
}

func (f *fleet) update(s *discovery.Snapshot) {
	f.mu.Lock()
	f.snap = s
	f.mu.Unlock()
	select {
	case f.ch <- struct{}{}:
	default:
	}
}

// wait polls until cond holds on the latest snapshot.
func (f *fleet) wait(t *testing.T, what string, cond func(*discovery.Snapshot) bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.After(30 * time.Second)
	for {
		f.mu.Lock()
		s := f.snap
		f.mu.Unlock()
		if s != nil && cond(s) {
			return time.Since(start)
		}
		select {
		case <-f.ch:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out waiting for %s (fleet %+v)", what, s)
		}
	}
}

func status(s *discovery.Snapshot, id string) discovery.Status {
	r, ok := s.Get(id)
	if !ok {
		return ""
	}
	return r.Status
}

// Against a real kube-apiserver: workers register through their Pods'
// annotations; a deletion timestamp drains at once; a cleared annotation
// and a deleted Pod leave the fleet; an API server restart re-lists and
// loses nothing.
func TestPodDiscoveryAgainstAPIServer(t *testing.T) {
	srv := kubetest.Start(t)
	cli, err := kube.NewClient(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	createRunningPod(t, cli, "w-0")
	createRunningPod(t, cli, "w-1")

	f := &fleet{ch: make(chan struct{}, 1)}
	w := kube.NewWatcher(cli, "default", "app=infera-worker", zerolog.Nop(), f.update)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	r0 := kube.NewRegistrar(cli, "default", "w-0", rec("10.0.0.1:8000"), zerolog.Nop())
	r1 := kube.NewRegistrar(cli, "default", "w-1", rec("10.0.0.2:8000"), zerolog.Nop())
	if err := r0.Register(ctx); err != nil {
		t.Fatal(err)
	}
	f.wait(t, "w-0 active", func(s *discovery.Snapshot) bool { return status(s, "10.0.0.1:8000") == discovery.StatusActive })

	srv.Restart()
	if err := r1.Register(ctx); err != nil {
		t.Fatal(err)
	}
	f.wait(t, "both active after restart", func(s *discovery.Snapshot) bool {
		return s.Len() == 2 && status(s, "10.0.0.1:8000") == discovery.StatusActive && status(s, "10.0.0.2:8000") == discovery.StatusActive
	})

	// Graceful delete: the Pod has a node, so it gets a deletionTimestamp and stays.
	if _, err := cli.Do(ctx, http.MethodDelete, podsPath+"/w-0", "", nil); err != nil {
		t.Fatal(err)
	}
	d := f.wait(t, "w-0 draining", func(s *discovery.Snapshot) bool { return status(s, "10.0.0.1:8000") == discovery.StatusDraining })
	t.Logf("deletion to draining: %v", d)

	if err := r1.Revoke(ctx); err != nil {
		t.Fatal(err)
	}
	f.wait(t, "w-1 gone", func(s *discovery.Snapshot) bool { _, ok := s.Get("10.0.0.2:8000"); return !ok })

	if _, err := cli.Do(ctx, http.MethodDelete, podsPath+"/w-0", "application/json", []byte(`{"gracePeriodSeconds":0}`)); err != nil {
		t.Fatal(err)
	}
	f.wait(t, "w-0 gone", func(s *discovery.Snapshot) bool { return s.Len() == 0 })
}
