package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/sim"
)

// logField waits for a JSON log line with message msg and returns its field.
func logField(t *testing.T, log *testkit.LogSink, msg, field string) any {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for line := range strings.SplitSeq(log.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["message"] == msg {
				return m[field]
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no log line %q; log:\n%s", msg, log.String())
	return nil
}

// TestServeEmbeddedEtcd runs `infera serve` with its embedded etcd on free
// ports, registers an in-process sim the way a worker does, routes a request
// to it, and stops on cancellation.
func TestServeEmbeddedEtcd(t *testing.T) { testServeEmbeddedEtcd(t) }

// TestServeEmbeddedEtcdLoopDoor is TestServeEmbeddedEtcd with the loop
// front door (the stop right after an answer once waited the whole
// --shutdown-timeout with it).
func TestServeEmbeddedEtcdLoopDoor(t *testing.T) { testServeEmbeddedEtcd(t, "--front-door", "loop") }

func testServeEmbeddedEtcd(t *testing.T, flags ...string) {
	eng, err := sim.New(func() config.Sim { c := config.DefaultSim(); c.Port = 0; return c }(), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	simCtx, stopSim := context.WithCancel(context.Background())
	simDone := make(chan error, 1)
	go func() { simDone <- eng.Serve(simCtx, ln) }()
	defer func() { stopSim(); <-simDone }()

	var stderr testkit.LogSink
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- newApp(io.Discard, &stderr).RunContext(ctx, append([]string{"infera", "serve",
			"--listen", "127.0.0.1:0", "--embedded-etcd-listen", "127.0.0.1:0",
			"--embedded-etcd-dir", t.TempDir(), "--router-policy", "least-load"}, flags...))
	}()
	endpoints, _ := logField(t, &stderr, "embedded etcd started", "endpoints").([]any)
	addr, _ := logField(t, &stderr, "infera serve listening", "addr").(string)
	if len(endpoints) != 1 || strings.HasSuffix(addr, ":0") || addr == "" {
		t.Fatalf("endpoints %v, addr %q: want real bound addresses", endpoints, addr)
	}

	cli := etcdtest.Client(t, []string{endpoints[0].(string)})
	rec := discovery.Record{WorkerID: ln.Addr().String(), URL: "http://" + ln.Addr().String(), ModelName: "sim-model", Engine: "sim"}
	val, err := rec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), "/infera/workers/"+rec.WorkerID, string(val)); err != nil {
		t.Fatal(err)
	}

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get("http://" + addr + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), `"sim-model"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the registered worker never appeared: %s", body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := client.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"sim-model","prompt":"hi","max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Worker") != rec.WorkerID || !strings.Contains(string(body), `"completion_tokens":3`) {
		t.Fatalf("completion through serve: %d %s", resp.StatusCode, body)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
	logField(t, &stderr, "infera serve stopped", "level")
}

func TestServeRejectsBadConfig(t *testing.T) {
	var out bytes.Buffer
	code := run([]string{"infera", "serve", "--listen", "nope", "--router-policy", "random", "--max-body-bytes", "0"}, &out, &out)
	if code != exitConfig {
		t.Fatalf("exit %d, want %d: %s", code, exitConfig, out.String())
	}
	for _, want := range []string{"--listen", "--router-policy \"random\": want one of kv-aware, least-load, round-robin", "--max-body-bytes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("error output lacks %q: %s", want, out.String())
		}
	}
}

// TestServeKVAware runs `infera serve --router-policy kv-aware` over a
// simulator that publishes KV events: the record's event endpoints are
// followed, and the cache view counts the blocks the simulator cached.
func TestServeKVAware(t *testing.T) {
	cfg := config.DefaultSim()
	cfg.Port, cfg.TimeScale = 0, 0
	cfg.KVEventsEndpoint, cfg.KVEventsReplayEndpoint = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	eng, err := sim.New(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	simCtx, stopSim := context.WithCancel(context.Background())
	simDone := make(chan error, 1)
	go func() { simDone <- eng.Serve(simCtx, ln) }()
	defer func() { stopSim(); <-simDone }()
	deadline := time.Now().Add(10 * time.Second)
	for eng.KVEventsEndpoint() == "" {
		if time.Now().After(deadline) {
			t.Fatal("simulator event sockets never bound")
		}
		time.Sleep(5 * time.Millisecond)
	}

	var stderr testkit.LogSink
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- newApp(io.Discard, &stderr).RunContext(ctx, []string{"infera", "serve",
			"--listen", "127.0.0.1:0", "--embedded-etcd-listen", "127.0.0.1:0",
			"--embedded-etcd-dir", t.TempDir(), "--router-policy", "kv-aware", "--tokenizer", "bytes"})
	}()
	endpoints, _ := logField(t, &stderr, "embedded etcd started", "endpoints").([]any)
	addr, _ := logField(t, &stderr, "infera serve listening", "addr").(string)
	if tok := logField(t, &stderr, "kv-aware routing ready", "tokenizer"); tok != "bytes" {
		t.Fatalf("tokenizer %v", tok)
	}
	ev, rep, bs := eng.KVEventsEndpoint(), eng.KVEventsReplayEndpoint(), 16
	rec := discovery.Record{WorkerID: ln.Addr().String(), URL: "http://" + ln.Addr().String(), ModelName: "sim-model", Engine: "sim",
		KVEventsEndpoint: &ev, KVEventsReplayEndpoint: &rep, KVBlockSize: &bs}
	val, err := rec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	cli := etcdtest.Client(t, []string{endpoints[0].(string)})
	if _, err := cli.Put(t.Context(), "/infera/workers/"+rec.WorkerID, string(val)); err != nil {
		t.Fatal(err)
	}

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	view := func() (int, string) {
		resp, err := client.Get("http://" + addr + "/v1/admin/cache-view/" + rec.WorkerID)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v struct {
			BlockCount int    `json:"block_count"`
			Mode       string `json:"mode"`
		}
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&v) != nil {
			return -1, ""
		}
		return v.BlockCount, v.Mode
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("the worker's event stream to be confirmed", func() bool { _, mode := view(); return mode == "precise" })
	resp, err := client.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"sim-model","prompt":"`+strings.Repeat("z", 100)+`","max_tokens":1}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("completion: %d", resp.StatusCode)
	}
	waitFor("the 6 cached blocks in the cache view", func() bool { n, _ := view(); return n == 6 })

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// TestServeAdminAndKeys: API keys from the environment guard /v1/*, and the
// admin endpoints live on --admin-listen behind --admin-token.
func TestServeAdminAndKeys(t *testing.T) {
	t.Setenv("INFERA_API_KEYS", "k1,k2")
	var stderr testkit.LogSink
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- newApp(io.Discard, &stderr).RunContext(ctx, []string{"infera", "serve",
			"--listen", "127.0.0.1:0", "--embedded-etcd-listen", "127.0.0.1:0",
			"--embedded-etcd-dir", t.TempDir(), "--admin-listen", "127.0.0.1:0", "--admin-token", "adm"})
	}()
	admin, _ := logField(t, &stderr, "infera serve admin listening", "addr").(string)
	addr, _ := logField(t, &stderr, "infera serve listening", "addr").(string)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	get := func(url, token string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		url, token string
		want       int
	}{
		{"http://" + addr + "/v1/models", "", 401},
		{"http://" + addr + "/v1/models", "wrong", 401},
		{"http://" + addr + "/v1/models", "k2", 200},
		{"http://" + addr + "/health", "", 200},
		{"http://" + addr + "/metrics", "adm", 404},
		{"http://" + addr + "/v1/workers", "k1", 404},
		{"http://" + admin + "/metrics", "", 401},
		{"http://" + admin + "/metrics", "adm", 200},
		{"http://" + admin + "/v1/workers", "adm", 200},
		{"http://" + admin + "/v1/models", "k1", 404},
	} {
		if got := get(c.url, c.token); got != c.want {
			t.Errorf("GET %s (token %q) = %d, want %d", c.url, c.token, got, c.want)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// TestServeUnwindsPartialStart: when a late start step fails (the listen
// address is taken), `infera serve` returns the error and stops what had
// started, in reverse: the embedded etcd's port is free again.
func TestServeUnwindsPartialStart(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	// The etcd port is probed free and then bound by serve; another test's
	// process can take it in between. That race is not what this test is
	// about, so a start that failed on the etcd port is tried again with a
	// fresh one; a start that got past etcd must fail on the taken listener.
	var etcdAddr string
	var stderr *testkit.LogSink
	for attempt := 0; ; attempt++ {
		probe, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		etcdAddr = probe.Addr().String()
		_ = probe.Close()
		stderr = &testkit.LogSink{}
		err = newApp(io.Discard, stderr).RunContext(t.Context(), []string{"infera", "serve",
			"--listen", taken.Addr().String(), "--embedded-etcd-listen", etcdAddr,
			"--embedded-etcd-dir", t.TempDir(), "--router-policy", "least-load"})
		if err != nil && strings.Contains(err.Error(), "listen on "+taken.Addr().String()) {
			break
		}
		if attempt < 3 && err != nil && strings.Contains(err.Error(), etcdAddr) {
			t.Logf("etcd port %s was taken before serve bound it, retrying: %v", etcdAddr, err)
			continue
		}
		t.Fatalf("serve on a taken address returned %v", err)
	}
	logField(t, stderr, "embedded etcd started", "level")
	again, err := net.Listen("tcp", etcdAddr)
	if err != nil {
		t.Fatalf("the embedded etcd still holds %s after the failed start: %v", etcdAddr, err)
	}
	_ = again.Close()
}
