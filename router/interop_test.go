package router_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/router"
)

const interopPrefix = "/infera/workers/"

// startUpstreamOn is startUpstream on a given loopback (127.0.0.1 or ::1).
func startUpstreamOn(t *testing.T, host string) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: ln.Addr().String()}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		sr := seenRequest{Path: string(ctx.Path()), Headers: map[string]string{}}
		for k, v := range ctx.Request.Header.All() {
			sr.Headers[string(k)] = string(v)
		}
		u.mu.Lock()
		u.requests = append(u.requests, sr)
		u.mu.Unlock()
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"cmpl-1","object":"chat.completion","choices":[]}`)
	}, CloseOnShutdown: true}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown(); <-done })
	return u
}

// Records written byte-for-byte as Python Infera's workers write them, put
// into a real etcd and followed by the discovery watcher: the router routes
// every routable one, lists the others with their reason, skips Infera's
// planner key, and logs nothing above info per request.
func TestInteropPythonRecords(t *testing.T) {
	eps := etcdtest.Start(t)
	cli := etcdtest.Client(t, eps)
	var logs testkit.LogSink
	log := zerolog.New(&logs).Level(zerolog.DebugLevel)
	tr := startRouterLog(t, router.RoundRobin{}, router.DefaultConfig(), log)

	routable := map[string]string{ // golden file → host it listens on
		"vllm.json": "127.0.0.1", "sglang-dp4.json": "127.0.0.1", "atom.json": "127.0.0.1",
		"external-dp-rank.json": "127.0.0.1", "ipv6.json": "::1", "no-engine.json": "127.0.0.1", "kv-block.json": "127.0.0.1",
	}
	unroutable := map[string]string{"nats.json": "unroutable: nats transport", "dead.json": "unroutable: status dead"}
	ups := map[string]*upstream{} // model → upstream
	ids := map[string]string{}    // model → worker_id as written
	for _, name := range append(keys(routable), keys(unroutable)...) {
		raw, err := os.ReadFile(filepath.Join("..", "testdata", "infera-python", name))
		if err != nil {
			t.Fatal(err)
		}
		host := routable[name]
		if host == "" {
			host = "127.0.0.1"
		}
		u := startUpstreamOn(t, host)
		_, port, _ := net.SplitHostPort(u.addr)
		value := strings.ReplaceAll(string(raw), "{port}", port)
		var rec struct {
			WorkerID  string `json:"worker_id"`
			ModelName string `json:"model_name"`
		}
		if err := json.Unmarshal([]byte(value), &rec); err != nil {
			t.Fatal(err)
		}
		if host == "::1" && rec.WorkerID != "::1:"+port {
			t.Fatalf("golden IPv6 record has worker_id %q, want Infera's unbracketed form", rec.WorkerID)
		}
		ups[rec.ModelName], ids[rec.ModelName] = u, rec.WorkerID
		if _, err := cli.Put(t.Context(), interopPrefix+rec.WorkerID, value); err != nil {
			t.Fatal(err)
		}
	}
	planner, err := os.ReadFile(filepath.Join("..", "testdata", "infera-python", "planner-decision.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), interopPrefix+"planner/decision", string(planner)); err != nil {
		t.Fatal(err)
	}

	w := discovery.NewWatcher(cli, interopPrefix, log, tr.UpdateFleet)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watcher: %v", err)
		}
	})

	var list struct {
		Workers []struct {
			WorkerID   string `json:"worker_id"`
			ModelName  string `json:"model_name"`
			Engine     string `json:"engine"`
			Status     string `json:"status"`
			Unroutable string `json:"unroutable"`
			KV         *struct {
				TokenizerCanary []int `json:"tokenizer_canary"`
			} `json:"kv"`
		} `json:"workers"`
		Revision int64 `json:"revision"`
	}
	testkit.Eventually(t, "every record listed", func() bool {
		_, body := tr.do(t, http.MethodGet, "/v1/workers", "")
		return json.Unmarshal(body, &list) == nil && len(list.Workers) == len(routable)+len(unroutable)
	})
	if list.Revision == 0 {
		t.Fatal("no revision beside workers")
	}
	for _, lw := range list.Workers {
		if lw.WorkerID != ids[lw.ModelName] {
			t.Errorf("%s listed as %q, want %q as written", lw.ModelName, lw.WorkerID, ids[lw.ModelName])
		}
		want := ""
		for name, reason := range unroutable {
			if strings.Contains(name, strings.TrimPrefix(lw.ModelName, "m-")) {
				want = reason
			}
		}
		if lw.Unroutable != want {
			t.Errorf("%s unroutable = %q, want %q", lw.ModelName, lw.Unroutable, want)
		}
		switch lw.ModelName {
		case "m-noengine":
			if lw.Engine != "sglang" {
				t.Errorf("record without engine listed as %q, want sglang", lw.Engine)
			}
		case "m-kv":
			if lw.KV == nil || len(lw.KV.TokenizerCanary) != 3 {
				t.Errorf("kv block not kept: %+v", lw.KV)
			}
		}
	}

	// Every routable model is served by its worker, twice.
	for model, u := range ups {
		if model == "m-nats" || model == "m-dead" {
			continue
		}
		for range 2 {
			resp, body := tr.chat(t, model)
			if resp.StatusCode != 200 {
				t.Fatalf("%s: %d %s", model, resp.StatusCode, body)
			}
		}
		if n := len(u.seen()); n != 2 {
			t.Errorf("%s: worker got %d requests, want 2", model, n)
		}
	}
	// External DP rank: the worker serves one rank and is not pinned.
	for _, sr := range ups["m-extdp"].seen() {
		if _, ok := sr.Headers["X-Data-Parallel-Rank"]; ok {
			t.Errorf("external-rank worker got X-Data-Parallel-Rank")
		}
	}
	// The unroutable ones are known models with nobody to take them.
	for _, model := range []string{"m-nats", "m-dead"} {
		resp, body := tr.chat(t, model)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "no_worker_available") {
			t.Errorf("%s: %d %s, want 503 no_worker_available", model, resp.StatusCode, body)
		}
		if n := len(ups[model].seen()); n != 0 {
			t.Errorf("%s: unroutable worker got %d requests", model, n)
		}
	}
	if got := metric(t, tr, `infera_router_unroutable_workers{reason="unroutable: nats transport"}`); got != 1 {
		t.Errorf("unroutable nats gauge = %v, want 1", got)
	}
	if got := metric(t, tr, `infera_active_workers{disagg_mode="mixed"}`); got != float64(len(routable)) {
		t.Errorf("active workers = %v, want %d", got, len(routable))
	}

	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, `"level":"error"`) || strings.Contains(line, `"level":"warn"`) {
			t.Errorf("logged: %s", line)
		}
	}
	if n := strings.Count(logs.String(), "skipping non-worker key"); n != 1 {
		t.Errorf("planner key logged %d times, want once", n)
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
