package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestFleetServesThroughRouter: serve + two sim workers; unary and streaming
// requests succeed and both workers receive traffic.
func TestFleetServesThroughRouter(t *testing.T) {
	f := startServe(t)
	_, idA := f.startWorker("worker-a", "--time-scale", "0")
	_, idB := f.startWorker("worker-b", "--time-scale", "0")
	f.waitWorkers("both workers", 10*time.Second, func(w map[string]string) bool {
		return w[idA] == "active" && w[idB] == "active"
	})

	served := map[string]int{}
	for i := 0; i < 10; i++ {
		stream := i%2 == 1
		status, worker, body, err := chat(t.Context(), f.base, stream, fmt.Sprintf("hello %d", i), 8)
		if err != nil || status != http.StatusOK {
			t.Fatalf("request %d: status %d err %v body %s", i, status, err, body)
		}
		if stream {
			if err := checkStream(body); err != nil {
				t.Fatalf("request %d: %v\n%s", i, err, body)
			}
		}
		served[worker]++
	}
	if served[idA] == 0 || served[idB] == 0 {
		t.Fatalf("traffic did not reach both workers: %v (want %s and %s)", served, idA, idB)
	}
}

// TestEngineKillDeregisters: kill -9 of one worker's engine removes its record
// within a second and every later request succeeds on the other worker.
func TestEngineKillDeregisters(t *testing.T) {
	f := startServe(t)
	victim, idA := f.startWorker("worker-a", "--time-scale", "0")
	_, idB := f.startWorker("worker-b", "--time-scale", "0")
	f.waitWorkers("both workers", 10*time.Second, func(w map[string]string) bool {
		return w[idA] == "active" && w[idB] == "active"
	})

	pid := enginePID(t, victim)
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill engine %d: %v", pid, err)
	}
	f.waitWorkers("the killed worker's record to go", 5*time.Second, func(w map[string]string) bool {
		_, ok := w[idA]
		return !ok
	})
	if gone := time.Since(killed); gone > time.Second {
		t.Errorf("record of the killed engine disappeared after %v, want within 1s", gone)
	}
	if err := victim.wait(10 * time.Second); err == nil {
		t.Errorf("worker whose engine died exited 0, want non-zero")
	}

	for i := 0; i < 10; i++ {
		status, worker, body, err := chat(t.Context(), f.base, i%2 == 0, fmt.Sprintf("after kill %d", i), 4)
		if err != nil || status != http.StatusOK {
			t.Fatalf("request %d after the kill: status %d err %v body %s", i, status, err, body)
		}
		if worker != idB {
			t.Fatalf("request %d served by %q, want the survivor %s", i, worker, idB)
		}
	}
}

// TestWorkerDrain: SIGTERM to a worker while it streams — the stream
// completes, the draining worker gets no new requests, then its record goes
// and the worker exits 0.
func TestWorkerDrain(t *testing.T) {
	f := startServe(t)
	// A slow decode keeps the stream running for a few seconds.
	slow := []string{"--time-scale", "1", "--decode-ms-per-token", "40"}
	wA, idA := f.startWorker("worker-a", slow...)
	wB, idB := f.startWorker("worker-b", slow...)
	f.waitWorkers("both workers", 10*time.Second, func(w map[string]string) bool {
		return w[idA] == "active" && w[idB] == "active"
	})
	procs := map[string]*proc{idA: wA, idB: wB}

	type result struct {
		status int
		worker string
		body   string
		err    error
	}
	streamDone := make(chan result, 1)
	started := make(chan string, 1)
	go func() {
		status, worker, body, err := streamWithStart(t.Context(), f.base, "a long story", 80, started)
		streamDone <- result{status, worker, body, err}
	}()
	var drainingID string
	select {
	case drainingID = <-started:
	case r := <-streamDone:
		t.Fatalf("stream ended before it started: %+v", r)
	case <-time.After(20 * time.Second):
		t.Fatal("stream did not start")
	}
	other := idA
	if drainingID == idA {
		other = idB
	}
	draining := procs[drainingID]
	draining.signal(syscall.SIGTERM)
	f.waitWorkers("the worker to be draining", 5*time.Second, func(w map[string]string) bool {
		return w[drainingID] == "draining"
	})

	// While it drains, new requests all go to the other worker.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			status, worker, body, err := chat(context.Background(), f.base, false, fmt.Sprintf("during drain %d", i), 2)
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
		t.Fatalf("stream on the draining worker: status %d err %v", r.status, r.err)
	}
	if err := checkStream(r.body); err != nil {
		t.Fatalf("stream on the draining worker did not complete: %v\n%s", err, r.body)
	}
	f.waitWorkers("the drained worker's record to go", 30*time.Second, func(w map[string]string) bool {
		_, ok := w[drainingID]
		return !ok
	})
	if err := draining.wait(30 * time.Second); err != nil {
		t.Fatalf("drained worker exited with %v, want 0; log:\n%s", err, draining.logText())
	}
}
