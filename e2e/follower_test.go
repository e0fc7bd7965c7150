package e2e

import (
	"syscall"
	"testing"
	"time"
)

// TestMultinodeFollowerDoesNotRegister: a worker of node rank > 0 in a
// multi-node group (LWS_WORKER_INDEX, as a LeaderWorkerSet sets it) runs its
// engine but never registers; the leader does. It stops cleanly on SIGTERM.
func TestMultinodeFollowerDoesNotRegister(t *testing.T) {
	f := startServe(t)
	env := append(cleanEnv(), "LWS_WORKER_INDEX=1")
	p := startEnv(t, "follower", env, "worker", "--engine", "sim", "--etcd-endpoints", f.etcd,
		"--drain-timeout", "5s", "--stop-grace", "5s", "--", "--model", "sim-model", "--time-scale", "0")
	p.waitLog("multinode follower: not registering (node rank 0 serves and registers)", 60*time.Second)
	_, leader := f.startWorker("leader", "--time-scale", "0")
	f.waitWorkers("the leader alone", 10*time.Second, func(w map[string]string) bool {
		return len(w) == 1 && w[leader] == "active"
	})
	p.signal(syscall.SIGTERM)
	if err := p.wait(30 * time.Second); err != nil {
		t.Fatalf("follower exited with %v, want 0; log:\n%s", err, p.logText())
	}
	if w, err := f.workers(); err != nil || len(w) != 1 {
		t.Fatalf("workers after the follower stopped: %v %v", w, err)
	}
}
