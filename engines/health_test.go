package engines

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitHealthyTurnsHealthy(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		// Starting engines answer 503 (or refuse connections) for a while.
		if calls.Add(1) < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	log, _ := newTestLogger(t)
	p, err := Start(script(t, "exec sleep 1000"), log)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, p)
	if err := p.WaitHealthy(t.Context(), srv.URL+"/health", 10*time.Millisecond, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d health calls, want 3", n)
	}
}

func TestWaitHealthyProcessExits(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	log, _ := newTestLogger(t)
	p, err := Start(script(t, "echo failing to load model >&2\nexit 7"), log)
	if err != nil {
		t.Fatal(err)
	}
	err = p.WaitHealthy(t.Context(), srv.URL+"/health", 10*time.Millisecond, time.Hour)
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "exit status 7") {
		t.Fatalf("WaitHealthy = %v, want ErrExited with exit status 7", err)
	}
}

func TestWaitHealthyDeadline(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	log, _ := newTestLogger(t)
	p, err := Start(script(t, "exec sleep 1000"), log)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, p)
	err = p.WaitHealthy(t.Context(), srv.URL+"/health", 10*time.Millisecond, 100*time.Millisecond)
	if !errors.Is(err, ErrNotHealthy) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("WaitHealthy = %v, want ErrNotHealthy mentioning the last status", err)
	}
}
