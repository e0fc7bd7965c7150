package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/discovery/kube"
	"github.com/infera/infera/discovery/kube/kubetest"
)

// kubeFleet is `infera serve --discovery-backend kubernetes` against a real
// kube-apiserver, and the worker Pods the test creates (there is no kubelet:
// the workers run here with POD_NAME set, and the test sets the Pods' phase).
type kubeFleet struct {
	*fleet
	api        *kubetest.Server
	cli        *kube.Client
	kubeconfig string
}

const kubeSelector = "app=infera-worker"

func startKubeServe(t *testing.T, extra ...string) *kubeFleet {
	t.Helper()
	api := kubetest.Start(t)
	cli, err := kube.NewClient(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cli.Close)
	kc := api.Kubeconfig(t)
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--log-level", "debug",
		"--discovery-backend", "kubernetes", "--kubeconfig", kc, "--k8s-label-selector", kubeSelector}, extra...)
	p := start(t, "serve", args...)
	line := p.waitLog("infera serve listening", 60*time.Second)
	addr, _ := line["addr"].(string)
	if addr == "" {
		t.Fatalf("serve listening line has no addr: %v", line)
	}
	return &kubeFleet{fleet: &fleet{t: t, serve: p, base: "http://" + addr}, api: api, cli: cli, kubeconfig: kc}
}

// startPodWorker creates a Running Pod named pod and runs `infera worker
// --engine sim --discovery-backend kubernetes` as that Pod (POD_NAME,
// POD_NAMESPACE, POD_IP as the downward API sets them); it waits for the
// registration and returns the process and the worker id.
func (k *kubeFleet) startPodWorker(pod string, simArgs ...string) (*proc, string) {
	k.t.Helper()
	kubetest.CreateRunningPod(k.t, k.cli, pod, map[string]string{"app": "infera-worker"})
	env := append(cleanEnv(), "POD_NAME="+pod, "POD_NAMESPACE=default", "POD_IP=127.0.0.1")
	args := append([]string{"worker", "--engine", "sim", "--discovery-backend", "kubernetes", "--kubeconfig", k.kubeconfig,
		"--drain-timeout", "20s", "--stop-grace", "5s", "--", "--model", "sim-model"}, simArgs...)
	p := startEnv(k.t, pod, env, args...)
	line := p.waitLog("worker registered", 60*time.Second)
	id, _ := line["worker_id"].(string)
	if id == "" {
		k.t.Fatalf("worker registered line has no worker_id: %v", line)
	}
	return p, id
}

func (k *kubeFleet) deletePod(name string, graceSeconds int) {
	k.t.Helper()
	body := fmt.Sprintf(`{"gracePeriodSeconds":%d}`, graceSeconds)
	if _, err := k.cli.Do(context.Background(), http.MethodDelete, "/api/v1/namespaces/default/pods/"+name,
		"application/json", []byte(body)); err != nil {
		k.t.Fatalf("delete pod %s: %v", name, err)
	}
}

// TestKubeFleet: serve with the kubernetes discovery backend and two sim
// workers registering through their Pods' annotations on a real API server.
// Requests reach both; after an API server restart the watch re-lists and
// both stay; a Pod given a deletion timestamp leaves routing within a second
// while its in-flight stream finishes; a stopped worker (annotation cleared)
// and a deleted Pod leave routing.
func TestKubeFleet(t *testing.T) {
	k := startKubeServe(t)
	slow := []string{"--time-scale", "1", "--decode-ms-per-token", "40"}
	wA, idA := k.startPodWorker("worker-a", slow...)
	wB, idB := k.startPodWorker("worker-b", slow...)
	k.waitWorkers("both workers", 20*time.Second, func(w map[string]string) bool {
		return w[idA] == "active" && w[idB] == "active"
	})
	pods := map[string]string{idA: "worker-a", idB: "worker-b"}
	procs := map[string]*proc{idA: wA, idB: wB}

	served := func(what string, n int) map[string]int {
		t.Helper()
		got := map[string]int{}
		for i := 0; i < n; i++ {
			status, worker, body, err := chat(t.Context(), k.base, i%2 == 1, fmt.Sprintf("%s %d", what, i), 2)
			if err != nil || status != http.StatusOK {
				t.Fatalf("%s request %d: status %d err %v body %s", what, i, status, err, body)
			}
			got[worker]++
		}
		return got
	}
	if got := served("hello", 10); got[idA] == 0 || got[idB] == 0 {
		t.Fatalf("traffic did not reach both workers: %v (want %s and %s)", got, idA, idB)
	}

	// The API server restarts: the watch breaks, the server re-lists and
	// keeps both workers; it goes on watching (the deletion below is seen).
	k.api.Restart()
	k.waitWorkers("both workers after the API server restart", 20*time.Second, func(w map[string]string) bool {
		return w[idA] == "active" && w[idB] == "active"
	})
	if got := served("after restart", 10); got[idA] == 0 || got[idB] == 0 {
		t.Fatalf("after the API server restart traffic did not reach both workers: %v", got)
	}

	// A stream runs on one worker when its Pod is deleted gracefully.
	type result struct {
		status int
		body   string
		err    error
	}
	streamDone := make(chan result, 1)
	started := make(chan string, 1)
	go func() {
		status, _, body, err := streamWithStart(context.Background(), k.base, "a long story", 80, started)
		streamDone <- result{status, body, err}
	}()
	var victim string
	select {
	case victim = <-started:
	case r := <-streamDone:
		t.Fatalf("stream ended before it started: %+v", r)
	case <-time.After(20 * time.Second):
		t.Fatal("stream did not start")
	}
	other := idA
	if victim == idA {
		other = idB
	}
	deleted := time.Now()
	k.deletePod(pods[victim], 30)
	k.waitWorkers("the deleted Pod's worker to drain", 10*time.Second, func(w map[string]string) bool {
		return w[victim] == "draining"
	})
	d := time.Since(deleted)
	t.Logf("deletion timestamp to draining: %v", d)
	if d > time.Second {
		t.Errorf("Pod with a deletion timestamp left routing after %v, want within 1s", d)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			status, worker, body, err := chat(context.Background(), k.base, false, fmt.Sprintf("during drain %d", i), 2)
			if err != nil || status != http.StatusOK {
				errs <- fmt.Errorf("request %d during drain: status %d err %v body %s", i, status, err, body)
				return
			}
			if worker != other {
				errs <- fmt.Errorf("request %d during drain served by %s, want %s", i, worker, other)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	r := <-streamDone
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("stream on the deleted Pod's worker: status %d err %v", r.status, r.err)
	}
	if err := checkStream(r.body); err != nil {
		t.Fatalf("stream on the deleted Pod's worker did not complete: %v\n%s", err, r.body)
	}

	// The other worker stops: it clears its annotation and leaves routing.
	procs[other].signal(syscall.SIGTERM)
	k.waitWorkers("the stopped worker to leave", 30*time.Second, func(w map[string]string) bool {
		_, ok := w[other]
		return !ok
	})
	if err := procs[other].wait(30 * time.Second); err != nil {
		t.Fatalf("stopped worker exited with %v, want 0; log:\n%s", err, procs[other].logText())
	}
	if status, _, body, err := chat(t.Context(), k.base, false, "nobody", 2); err != nil || status == http.StatusOK {
		t.Fatalf("with one worker draining and the other gone: status %d err %v body %s, want an error status", status, err, body)
	}

	// The deleted Pod goes for good: its worker leaves the fleet.
	k.deletePod(pods[victim], 0)
	k.waitWorkers("the deleted Pod's worker to leave", 20*time.Second, func(w map[string]string) bool {
		return len(w) == 0
	})
}

// TestKubePythonWorkerAnnotation: a Pod annotated the way the reference's
// Python workers write it (json.dumps of their payload: no status, no
// replay endpoint) is routed by a Go server, and leaves when the
// annotation is cleared, as a Python worker deregisters.
func TestKubePythonWorkerAnnotation(t *testing.T) {
	k := startKubeServe(t)
	sim := start(t, "sim", "sim", "--port", "0", "--time-scale", "0", "--model", "sim-model")
	addr, _ := sim.waitLog("sim listening", 30*time.Second)["addr"].(string)
	if addr == "" {
		t.Fatal("sim listening line has no addr")
	}
	kubetest.CreateRunningPod(t, k.cli, "py-worker", map[string]string{"app": "infera-worker"})
	payload := `{"worker_id": "` + addr + `", "url": "http://` + addr + `", "model_name": "sim-model", "engine": "vllm", ` +
		`"disagg_mode": "mixed", "disagg_meta": {}, "kv_events_endpoint": null, "kv_block_size": null, "dp_rank": null, ` +
		`"dp_size": null, "request_transport": "http"}`
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{kube.AnnotationKey: payload}}})
	if err != nil {
		t.Fatal(err)
	}
	podPath := "/api/v1/namespaces/default/pods/py-worker"
	if _, err := k.cli.Do(t.Context(), http.MethodPatch, podPath, "application/merge-patch+json", patch); err != nil {
		t.Fatal(err)
	}
	k.waitWorkers("the Python-registered worker", 20*time.Second, func(w map[string]string) bool { return w[addr] == "active" })
	for i := range 4 {
		status, worker, body, err := chat(t.Context(), k.base, i%2 == 1, fmt.Sprintf("python %d", i), 2)
		if err != nil || status != http.StatusOK || worker != addr {
			t.Fatalf("request %d: status %d worker %q err %v body %s", i, status, worker, err, body)
		}
	}
	if _, err := k.cli.Do(t.Context(), http.MethodPatch, podPath, "application/merge-patch+json", []byte(kube.ClearPatch)); err != nil {
		t.Fatal(err)
	}
	k.waitWorkers("the cleared worker to leave", 20*time.Second, func(w map[string]string) bool { return len(w) == 0 })
}
