package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestKVDPeerPullRouted (issue 32, acceptance 2): the router directs a
// kvd-to-kvd pull. Two "hosts", each an `infera kvd` with a peer listener
// and an `infera worker --engine sim` using it (--kvd-write-through: the
// sim stores what it computes, as vLLM's kvd connector does). A prompt's
// prefix is computed on host G; while G is busy (two long streams in
// flight), the next request for it goes to host H. Without kvd_peer in H's
// record the router cannot direct a pull and H recomputes the prefix; with
// it the router first hints H's kvd, naming G's kvd as the source, H's kvd
// pulls the 10 blocks before the sim asks, and the sim loads them: 160
// cached tokens and a lower modelled TTFT (the sim's own step model, not
// wall time). The summary line ("kvd-peer routed") is what
// docs/performance.md records.
func TestKVDPeerPullRouted(t *testing.T) {
	dir := t.TempDir()
	const secret = "fleet-secret"
	type host struct {
		sock, admin, peer string
	}
	startKVD := func(name string) host {
		port := freePortPair(t)
		h := host{sock: filepath.Join(dir, name+".sock"), admin: "127.0.0.1:" + strconv.Itoa(freePort(t)),
			peer: "127.0.0.1:" + strconv.Itoa(port)}
		p := start(t, name, "kvd", "--socket", h.sock, "--max-bytes", "32MiB", "--shared-arena-bytes", "16MiB",
			"--arena-slot-bytes", "64KiB", "--arena-mlock=false", "--admin-listen", h.admin,
			"--peer-listen", h.peer, "--peer-secret", secret)
		p.waitLog("kvd serving", 20*time.Second)
		return h
	}
	g, h := startKVD("kvd-g"), startKVD("kvd-h")

	f := startServe(t, "--router-policy", "kv-aware", "--tokenizer", "bytes", "--kv-overlap-weight", "1",
		"--kvd-peer-hints", "--kvd-peer-secret", secret, "--kvd-peer-wait", "3s")
	startWorker := func(name string, kv host, advertise bool, simArgs ...string) (*proc, string, string) {
		args := []string{"worker", "--engine", "sim", "--etcd-endpoints", f.etcd,
			"--lease-ttl", "5s", "--keepalive-interval", "1s", "--drain-timeout", "5s", "--stop-grace", "5s",
			"--kvd-socket", kv.sock}
		if advertise {
			args = append(args, "--kvd-peer", kv.peer)
		}
		args = append(append(args, "--", "--model", "sim-model", "--max-model-len", "8192", "--kvd-block-bytes", "4096",
			"--kvd-write-through"), simArgs...)
		p := start(t, name, args...)
		line := p.waitLog("worker registered", 60*time.Second)
		id, _ := line["worker_id"].(string)
		if id == "" {
			t.Fatalf("worker registered line has no worker_id: %v", line)
		}
		return p, id, "http://" + id
	}
	waitListed := func(id string) {
		t.Helper()
		f.waitWorkers(id+" listed", 30*time.Second, func(ws map[string]string) bool { _, ok := ws[id]; return ok })
	}

	client := &http.Client{Timeout: 60 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	getText := func(url string) string {
		t.Helper()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	metric := func(url, name string, filters ...string) float64 {
		return metricValue(getText(url+"/metrics"), name, filters...)
	}
	// ask sends a one-token completion through the router and returns the
	// worker that served it and its cached tokens.
	ask := func(prompt string) (string, int) {
		t.Helper()
		body := fmt.Sprintf(`{"model":"sim-model","prompt":%q,"max_tokens":1}`, prompt)
		resp, err := client.Post(f.base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %d %s", resp.StatusCode, b)
		}
		var r struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("answer %s: %v", b, err)
		}
		return resp.Header.Get("X-Infera-Worker"), r.Usage.Details.Cached
	}
	// A prompt of 10 full 16-token blocks and one token.
	prompt := func(c byte) string { return strings.Repeat(fmt.Sprintf("%c-shared-prefix:", c), 12)[:161] }
	p1, p2 := prompt('A'), prompt('B')

	// Host G computes both prefixes; its KV events tell the router.
	_, gID, _ := startWorker("worker-g", g, true, "--step-overhead-ms", "50")
	waitListed(gID)
	for _, p := range []string{p1, p2} {
		if w, c := ask(p); w != gID || c != 0 {
			t.Fatalf("first ask went to %s with %d cached, want %s and 0", w, c, gID)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := f.cacheView(gID)
		if err == nil && v.BlockCount >= 20 && v.Mode == "precise" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("router's view of G: %+v %v", v, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// G gets busy: two long streams whose 20-block prompts are in flight.
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	started := make(chan string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _, _ = streamWithStart(ctx, f.base, strings.Repeat(fmt.Sprintf("busy stream %d keeps G occupied. ", i), 11), 4000, started)
		}()
	}
	for range 2 {
		select {
		case w := <-started:
			if w != gID {
				t.Fatalf("stream went to %s, want G %s", w, gID)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("streams did not start")
		}
	}

	// measure sends p to H (whose sim is at url) and returns its cached
	// tokens, modelled TTFT and the wall-clock time of the request.
	measure := func(p, hID, hURL string) (int, float64, time.Duration) {
		t.Helper()
		before := metric(hURL, "infera_sim_model_ttft_seconds_total")
		begin := time.Now()
		w, cached := ask(p)
		wall := time.Since(begin)
		if w != hID {
			t.Fatalf("request went to %s, want H %s (G %s is busy)", w, hID, gID)
		}
		for deadline := time.Now().Add(20 * time.Second); metric(hURL, "infera_sim_first_tokens_total") != 1; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("H's first-token counter did not settle")
			}
		}
		return cached, metric(hURL, "infera_sim_model_ttft_seconds_total") - before, wall
	}

	// Without the pull: H's record names no kvd, the router cannot direct
	// one, and H recomputes p2.
	hp, hID, hURL := startWorker("worker-h-plain", h, false)
	waitListed(hID)
	cachedWithout, ttftWithout, wallWithout := measure(p2, hID, hURL)
	hp.stop(syscall.SIGTERM)
	f.waitWorkers(hID+" gone", 30*time.Second, func(ws map[string]string) bool { _, ok := ws[hID]; return !ok })

	// With it: H's record names its kvd; the router hints it to pull p1's
	// blocks from G's kvd and waits for the pull; H's sim loads them.
	_, hID, hURL = startWorker("worker-h", h, true)
	waitListed(hID)
	cachedWith, ttftWith, wallWith := measure(p1, hID, hURL)

	routerMetrics := getText(f.base + "/metrics")
	pulledHints := metricValue(routerMetrics, "infera_router_kvd_peer_hints_total", `outcome="pulled"`)
	otherHints := metricValue(routerMetrics, "infera_router_kvd_peer_hints_total") - pulledHints
	hMetrics := scrape(t, "http://"+h.admin+"/metrics")
	kvdPulled := metricValue(hMetrics, "infera_kvd_peer_pulled_blocks_total")
	useful := metricValue(hMetrics, "infera_kvd_prefetch_total", `stage="useful"`)
	simLoaded := metric(hURL, "infera_sim_kvd_hit_blocks_total")
	t.Logf("kvd-peer routed: modelled TTFT %.4fs with the pull (%d cached tokens), %.4fs without (%d cached), %.2fx; wall %v with, %v without (not asserted); hints pulled %v other %v, blocks pulled by H's kvd %v, useful %v, loaded by H's sim %v",
		ttftWith, cachedWith, ttftWithout, cachedWithout, ttftWithout/ttftWith, wallWith.Round(time.Millisecond), wallWithout.Round(time.Millisecond),
		pulledHints, otherHints, kvdPulled, useful, simLoaded)
	if cachedWithout != 0 {
		t.Fatalf("without the pull H had %d cached tokens, want 0", cachedWithout)
	}
	// useful: H's sim read every pulled block, each after its pull
	// finished (a get before it would have been a miss, not a hit).
	if pulledHints != 1 || otherHints != 0 || kvdPulled != 10 || useful != 10 || simLoaded != 10 || cachedWith != 160 {
		t.Fatalf("with the pull: hints pulled %v (others %v), H's kvd pulled %v (useful %v), H's sim loaded %v, cached %d; want 1, 0, 10 (10), 10, 160",
			pulledHints, otherHints, kvdPulled, useful, simLoaded, cachedWith)
	}
	if !(ttftWith < ttftWithout) {
		t.Fatalf("modelled TTFT %vs with the pull, %vs without", ttftWith, ttftWithout)
	}
}
