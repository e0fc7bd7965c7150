package router_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

func TestFleetSnapshot(t *testing.T) {
	a, b, c := jsonUpstream(t), jsonUpstream(t), jsonUpstream(t)
	drain := record(c, "m", discovery.StatusDraining)
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.AdminToken = "adm" }),
		record(a, "m", discovery.StatusActive), record(b, "m", discovery.StatusActive), drain)
	auth := []string{"Authorization", "Bearer adm"}

	resp, body := tr.do(t, http.MethodGet, "/v1/admin/fleet", "")
	wantError(t, resp, body, http.StatusUnauthorized, "invalid_api_key")

	for range 4 {
		if resp, body := tr.chat(t, "m"); resp.StatusCode != http.StatusOK {
			t.Fatalf("chat: %d %s", resp.StatusCode, body)
		}
	}
	resp, body = tr.do(t, http.MethodGet, "/v1/admin/fleet", "", auth...)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("fleet: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var snap router.FleetSnapshot
	if err := json.Unmarshal(body, &snap); err != nil {
		t.Fatalf("fleet body %s: %v", body, err)
	}
	if snap.Policy != router.PolicyRoundRobin {
		t.Errorf("policy %q", snap.Policy)
	}
	if len(snap.Workers) != 3 || snap.Revision != 1 {
		t.Fatalf("snapshot %s", body)
	}
	var picks uint64
	states := map[string]string{}
	for _, w := range snap.Workers {
		picks += w.Picks
		states[w.WorkerID] = w.State
		if w.Model != "m" || w.Engine != "sim" || w.Role != "mixed" || w.DPSize != 1 || w.Breaker != "closed" || w.Stalled {
			t.Errorf("worker %+v", w)
		}
	}
	if picks != 4 || snap.Requests.Total != 4 || snap.Requests.Errors != 0 {
		t.Errorf("picks %d, requests %+v", picks, snap.Requests)
	}
	if states[a.addr] != "ok" || states[b.addr] != "ok" || states[c.addr] != "draining" {
		t.Errorf("states %v", states)
	}
	if len(snap.PD.Pairs) != 0 || snap.KVD != nil {
		t.Errorf("pd %+v kvd %+v", snap.PD, snap.KVD)
	}

	// The stream: one whole snapshot per event.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, tr.url+"/v1/admin/fleet?stream=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer adm")
	sresp, err := tr.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if ct := sresp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("stream content-type %q", ct)
	}
	r := bufio.NewReader(sresp.Body)
	for range 2 {
		ev := readEvent(t, r)
		data, ok := strings.CutPrefix(ev, "event: fleet\ndata: ")
		if !ok {
			t.Fatalf("event %q", ev)
		}
		var s router.FleetSnapshot
		if err := json.Unmarshal([]byte(strings.TrimSpace(data)), &s); err != nil || len(s.Workers) != 3 {
			t.Fatalf("event data %q: %v", data, err)
		}
	}
	_ = sresp.Body.Close()

	// The page is static and open; it carries no fleet data.
	resp, body = tr.do(t, http.MethodGet, "/dashboard", "")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(string(body), "/v1/admin/fleet?stream=1") || strings.Contains(string(body), a.addr) {
		t.Fatalf("dashboard: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	resp, body = tr.do(t, http.MethodPost, "/v1/admin/fleet", "", auth...)
	wantError(t, resp, body, http.StatusMethodNotAllowed, "method_not_allowed")
}

// An open fleet stream ends when the router shuts down: the test's cleanup
// (the router's Serve returning, goleak) would hang otherwise.
func TestFleetStreamEndsOnShutdown(t *testing.T) {
	a := jsonUpstream(t)
	var resp *http.Response
	t.Cleanup(func() { // after the router stopped: cleanups run last-in first-out
		if resp != nil {
			_ = resp.Body.Close()
		}
	})
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), record(a, "m", discovery.StatusActive))
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, tr.url+"/v1/admin/fleet", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err = tr.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readEvent(t, bufio.NewReader(resp.Body))
}

// Under kv-aware the snapshot gives each worker's mode and predicted hit
// ratio: the same long prompt three times on one worker predicts its second
// and third copies held (approximate mode, the router's placements).
func TestFleetSnapshotKVPredicted(t *testing.T) {
	up := jsonUpstream(t)
	tr := startRouter(t, newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = router.TokenizerBytes })),
		router.DefaultConfig(), record(up, "m", discovery.StatusActive))
	prompt := strings.Repeat("the same long prompt ", 64)
	for range 3 {
		if resp, body := tr.do(t, http.MethodPost, "/v1/completions", `{"model":"m","prompt":"`+prompt+`"}`); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	_, body := tr.do(t, http.MethodGet, "/v1/admin/fleet", "")
	var snap router.FleetSnapshot
	if err := json.Unmarshal(body, &snap); err != nil || len(snap.Workers) != 1 {
		t.Fatalf("fleet %s: %v", body, err)
	}
	w := snap.Workers[0]
	if w.Mode != "approximate" || w.HitRatioPredicted == nil || *w.HitRatioPredicted < 0.5 || *w.HitRatioPredicted > 0.7 {
		t.Fatalf("worker %+v (hit ratio %v), want approximate and about 2/3 predicted", w, w.HitRatioPredicted)
	}
	if snap.KV.HitRatioPredicted == nil || *snap.KV.HitRatioPredicted != *w.HitRatioPredicted || snap.KV.ApproximatePicks != 3 {
		t.Fatalf("kv %+v", snap.KV)
	}
}
