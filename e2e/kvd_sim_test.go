package e2e

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd"
	"github.com/infera/infera/sim"
)

// TestKVDSimSecondLevelCache is issue 15's acceptance 5 with real
// processes: `infera kvd` (RAM + L3), `infera serve --kvd-socket` and two
// `infera worker --engine sim` with a 16-block GPU cache, one with
// --kvd-socket (model sim-kvd), one without (model sim-base). In each
// round a prompt P is answered, two others evict it from the GPU cache,
// and P comes again: the kvd worker loads P's blocks back from kvd (160
// cached tokens, 1 computed) where the other recomputes all 161, and its
// modelled TTFT (the sim's own step model, not wall time) is lower. Then
// kvd restarts (RAM empty, L3 kept), the router's POST /v1/cache/prewarm
// warms P's blocks, and the worker's next get of them is a RAM hit
// (kvd's prefetch "useful" counter, no L3 hit).
//
// INFERA_KVD_SIM_ROUNDS sets the rounds (default 3) and
// INFERA_KVD_SIM_TIME_SCALE the sims' --time-scale (default 0.05; at 1 the
// wall-clock TTFT follows the model, reported but never asserted); the
// summary line
// ("kvd-sim bench") is what docs/performance.md records (make bench-kvd-sim).
func TestKVDSimSecondLevelCache(t *testing.T) {
	rounds := 3
	if v := os.Getenv("INFERA_KVD_SIM_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			t.Fatalf("INFERA_KVD_SIM_ROUNDS %q: want 1..1000", v)
		}
		rounds = n
	}
	scale := "0.05"
	if v := os.Getenv("INFERA_KVD_SIM_TIME_SCALE"); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err != nil || f <= 0 || f > 10 {
			t.Fatalf("INFERA_KVD_SIM_TIME_SCALE %q: want a number in (0, 10]", v)
		}
		scale = v
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "kvd.sock")
	admin := "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t))
	kvdArgs := []string{"kvd", "--socket", sock, "--max-bytes", "16MiB", "--shared-arena-bytes", "8MiB", "--arena-mlock=false",
		"--admin-listen", admin, "--long-path", filepath.Join(dir, "l3"), "--long-bytes", "16MiB",
		"--tablespace-slot-bytes", "64KiB", "--tablespace-container-bytes", "2MiB", "--skip-selfcheck"}
	d := start(t, "kvd", kvdArgs...)
	d.waitLog("kvd serving", 20*time.Second)

	f := startServe(t, "--kvd-socket", sock)
	simArgs := []string{"--kv-blocks", "16", "--max-model-len", "200", "--time-scale", scale, "--kvd-block-bytes", "16384"}
	startWorker := func(name, model string, kvdSocket bool) string {
		args := []string{"worker", "--engine", "sim", "--etcd-endpoints", f.etcd,
			"--lease-ttl", "5s", "--keepalive-interval", "1s", "--drain-timeout", "5s", "--stop-grace", "5s"}
		if kvdSocket {
			args = append(args, "--kvd-socket", sock)
		}
		args = append(append(args, "--", "--model", "sim-model", "--served-model-name", model), simArgs...)
		_, line := startRegistered(t, name, args...)
		id, _ := line["worker_id"].(string)
		if id == "" {
			t.Fatalf("worker registered line has no worker_id: %v", line)
		}
		return "http://" + id
	}
	withKVD := startWorker("worker-kvd", "sim-kvd", true)
	base := startWorker("worker-base", "sim-base", false)

	client := &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	post := func(url, body string) (int, []byte) {
		t.Helper()
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("POST %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
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
	// ask sends a completion through the router (retrying while the
	// router has not seen the worker yet) and returns its cached tokens
	// and wall-clock time.
	ask := func(model, prompt string) (int, time.Duration) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, model, prompt)
		deadline := time.Now().Add(30 * time.Second)
		for {
			begin := time.Now()
			code, b := post(f.base+"/v1/completions", body)
			took := time.Since(begin)
			if code == http.StatusOK {
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
				return r.Usage.Details.Cached, took
			}
			if (code != http.StatusNotFound && code != http.StatusServiceUnavailable) || time.Now().After(deadline) {
				t.Fatalf("completion for %s: %d %s", model, code, b)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	metric := func(url, name string, filters ...string) float64 {
		return metricValue(getText(url+"/metrics"), name, filters...)
	}
	// settled waits for a worker's published counters to cover n requests.
	settled := func(url string, n float64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for metric(url, "infera_sim_first_tokens_total") != n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: first tokens %v, want %v", url, metric(url, "infera_sim_first_tokens_total"), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// blockKeys are the kvd keys of a prompt's full blocks, as the sim
	// names them (its tokens from its own /tokenize).
	blockKeys := func(url, model, prompt string) [][]byte {
		t.Helper()
		code, b := post(url+"/tokenize", fmt.Sprintf(`{"model":%q,"prompt":%q}`, model, prompt))
		var tok struct{ Tokens []uint32 }
		if err := json.Unmarshal(b, &tok); code != http.StatusOK || err != nil {
			t.Fatalf("tokenize: %d %s %v", code, b, err)
		}
		return sim.BlockKeys(tok.Tokens, 16)
	}
	kc, err := kvd.Dial(t.Context(), sock, kvd.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { kc.Close() }()
	prompt := func(round int, c byte) string {
		s := strings.Repeat(fmt.Sprintf("%c%04d:", c, round), 40)
		return s[:161] // 10 full blocks of 16 tokens, and one token
	}

	type result struct {
		cached, requests  int
		prefilled, ttft   float64
		wall              time.Duration
		stored, kvdBlocks float64
	}
	run := func(model, url string, kvdWorker bool) result {
		var res result
		for r := range rounds {
			if c, _ := ask(model, prompt(r, 'P')); c != 0 {
				t.Fatalf("%s round %d: a new prompt had %d cached tokens", model, r, c)
			}
			ask(model, prompt(r, 'Q'))
			ask(model, prompt(r, 'R'))
			res.requests += 3
			settled(url, float64(res.requests))
			if kvdWorker {
				// P's 10 blocks were evicted: wait until kvd has them all
				// (the sim stores them off its scheduler goroutine).
				keys := blockKeys(url, model, prompt(r, 'P'))
				deadline := time.Now().Add(20 * time.Second)
				for {
					present, err := kc.Exists(kvd.Namespace{Model: model, CompatKey: "tp0of1_pp0of1"}, keys, nil)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Contains(present, false) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("round %d: P's blocks in kvd: %v", r, present)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			prefilled, ttft := metric(url, "infera_sim_prefill_computed_tokens_total"), metric(url, "infera_sim_model_ttft_seconds_total")
			c, wall := ask(model, prompt(r, 'P'))
			res.requests++
			settled(url, float64(res.requests))
			res.cached += c
			res.prefilled += metric(url, "infera_sim_prefill_computed_tokens_total") - prefilled
			res.ttft += metric(url, "infera_sim_model_ttft_seconds_total") - ttft
			res.wall += wall
		}
		res.stored = metric(url, "infera_sim_kvd_stored_blocks_total")
		res.kvdBlocks = metric(url, "infera_sim_kvd_hit_blocks_total")
		return res
	}
	with := run("sim-kvd", withKVD, true)
	without := run("sim-base", base, false)
	n := float64(rounds)
	if with.cached != 160*rounds || with.prefilled != n || with.kvdBlocks != 10*n {
		t.Fatalf("with kvd: cached %d, prefilled %v, kvd blocks %v; want %d, %v, %v", with.cached, with.prefilled, with.kvdBlocks, 160*rounds, n, 10*n)
	}
	if without.cached != 0 || without.prefilled != 161*n {
		t.Fatalf("without kvd: cached %d, prefilled %v", without.cached, without.prefilled)
	}
	if !(with.ttft < without.ttft) {
		t.Fatalf("modelled TTFT after eviction: %vs with kvd, %vs without", with.ttft/n, without.ttft/n)
	}
	t.Logf("kvd-sim bench: rounds %d, TTFT of the evicted prompt (161 tokens, 10 blocks) modelled %.2f ms with kvd vs %.2f ms without (%.2fx); "+
		"prefilled tokens %.0f vs %.0f; wall %.2f ms vs %.2f ms (time-scale %s, through the router)",
		rounds, 1e3*with.ttft/n, 1e3*without.ttft/n, without.ttft/with.ttft, with.prefilled/n, without.prefilled/n,
		float64(with.wall.Microseconds())/1e3/n, float64(without.wall.Microseconds())/1e3/n, scale)

	// Prewarm. kvd restarts: its RAM is empty, P's blocks are in L3.
	d.signal(syscall.SIGTERM)
	if err := d.wait(30 * time.Second); err != nil {
		t.Fatalf("kvd exit: %v\n%s", err, d.logText())
	}
	d = start(t, "kvd-2", kvdArgs...)
	d.waitLog("kvd serving", 20*time.Second)
	if code, b := post(withKVD+"/reset_prefix_cache", ""); code != http.StatusOK {
		t.Fatalf("reset_prefix_cache: %d %s", code, b)
	}
	last := prompt(rounds-1, 'P')
	keys := blockKeys(withKVD, "sim-kvd", last)
	var hashes []string
	for _, k := range keys {
		hashes = append(hashes, hex.EncodeToString(k))
	}
	hb, _ := json.Marshal(hashes)
	code, b := post(f.base+"/v1/cache/prewarm", `{"model":"sim-kvd","block_hashes":`+string(hb)+`,"deadline_ms":60000}`)
	if code != http.StatusAccepted || !bytes.Contains(b, []byte(`"keys":10`)) {
		t.Fatalf("prewarm: %d %s", code, b)
	}
	kvdMetrics := "http://" + admin
	deadline := time.Now().Add(20 * time.Second)
	for metric(kvdMetrics, "infera_kvd_prefetch_total", `stage="fetched"`) != 10 {
		if time.Now().After(deadline) {
			t.Fatalf("kvd did not warm the 10 blocks:\n%s", getText(kvdMetrics+"/metrics"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c, _ := ask("sim-kvd", last); c != 160 {
		t.Fatalf("after prewarm: cached %d, want 160 from kvd", c)
	}
	if useful, l3 := metric(kvdMetrics, "infera_kvd_prefetch_total", `stage="useful"`), metric(kvdMetrics, "infera_kvd_long_hits_total"); useful != 10 || l3 != 0 {
		t.Fatalf("after prewarm the gets were not RAM hits: prefetch useful %v, L3 hits %v", useful, l3)
	}
}
