package sim

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd"
	"github.com/infera/infera/kvd/kvdtest"
)

// evictionRun sends prompt P, then two other prompts that evict it from a
// 16-block GPU cache, then P again, and returns P's second answer's
// cached_tokens with the deltas of the model metrics over that request.
func evictionRun(t *testing.T, ts *testSim, waitStored func()) (cached int, prefilled, ttft float64) {
	t.Helper()
	prompt := func(c byte) string { return strings.Repeat(string(c), 161) } // 10 full blocks + 1 token
	ask := func(p string) int {
		m := ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 1}, p))
		return int(m["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64))
	}
	if c := ask(prompt('a')); c != 0 {
		t.Fatalf("cold prompt: cached %d", c)
	}
	ask(prompt('b'))
	ask(prompt('c'))
	if waitStored != nil {
		waitStored()
	}
	// The counters are published when the scheduler goes idle, just
	// after an answer.
	settled := func(n float64) map[string]*dto {
		var m map[string]*dto
		testkit.Eventually(t, "the requests' counters", func() bool {
			m = ts.metrics(t)
			return m["infera_sim_first_tokens_total"].value == n
		})
		return m
	}
	before := settled(3)
	cached = ask(prompt('a'))
	after := settled(4)
	d := func(name string) float64 { return after[name].value - before[name].value }
	return cached, d("infera_sim_prefill_computed_tokens_total"), d("infera_sim_model_ttft_seconds_total")
}

func kvdSimConfig(sock string) func(*config.Sim) {
	return func(c *config.Sim) {
		c.TimeScale = 0.01
		c.KVBlocks = 16
		c.MaxModelLen = 200
		c.KVD.Socket = sock
	}
}

func TestSimKVDSecondLevelCache(t *testing.T) {
	sock, st := kvdtest.Start(t, 64<<20)
	ts := startSim(t, kvdSimConfig(sock))
	cached, prefilled, ttft := evictionRun(t, ts, func() {
		// P's 10 full blocks (and then some of b's) went to kvd.
		testkit.Eventually(t, "evicted blocks stored in kvd", func() bool { return ts.gauge(t, "infera_sim_kvd_stored_blocks_total") >= 10 })
	})
	if cached != 160 || prefilled != 1 {
		t.Fatalf("with kvd: cached %d prefilled %v, want 160 loaded and 1 computed", cached, prefilled)
	}
	m := ts.metrics(t)
	if m["infera_sim_kvd_hit_blocks_total"].value != 10 || m["infera_sim_kvd_errors_total"].value != 0 {
		t.Fatalf("kvd hits %v errors %v", m["infera_sim_kvd_hit_blocks_total"].value, m["infera_sim_kvd_errors_total"].value)
	}
	if c := st.Counters(); c.Hits < 10 {
		t.Fatalf("kvd counted %d hits", c.Hits)
	}

	// The same run without kvd recomputes the whole prompt.
	base := startSim(t, kvdSimConfig(""))
	bcached, bprefilled, bttft := evictionRun(t, base, nil)
	if bcached != 0 || bprefilled != 161 {
		t.Fatalf("without kvd: cached %d prefilled %v", bcached, bprefilled)
	}
	// Modelled: 5ms + 1 token + 10 loads at 0.1ms, against 5ms + 161 tokens at 10k/s.
	if !(ttft < bttft) || ttft < 0.005 || bttft < 0.02 {
		t.Fatalf("modelled TTFT with kvd %vs, without %vs", ttft, bttft)
	}
	t.Logf("modelled TTFT after eviction: %.4fs with kvd, %.4fs without (%.2fx)", ttft, bttft, bttft/ttft)
}

func TestSimKVDKeysMatchBlockKeys(t *testing.T) {
	sock, _ := kvdtest.Start(t, 64<<20)
	ts := startSim(t, kvdSimConfig(sock))
	evictionRun(t, ts, func() {
		testkit.Eventually(t, "stored", func() bool { return ts.gauge(t, "infera_sim_kvd_stored_blocks_total") >= 10 })
	})
	_, body := ts.post(t, "/tokenize", `{"model":"sim-model","prompt":"`+strings.Repeat("a", 161)+`"}`)
	var tok struct{ Tokens []uint32 }
	if err := json.Unmarshal(body, &tok); err != nil {
		t.Fatal(err)
	}
	keys := BlockKeys(tok.Tokens, 16)
	cl, err := kvd.Dial(t.Context(), sock, kvd.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	present, err := cl.Exists(kvd.Namespace{Model: "sim-model", CompatKey: "tp0of1_pp0of1"}, keys, nil)
	if err != nil || len(present) != 10 {
		t.Fatalf("exists %v %v", present, err)
	}
	for i, p := range present {
		if !p {
			t.Fatalf("block %d (%x) not in kvd under the sim's namespace", i, keys[i])
		}
	}
}

func TestSimKVDDownRecomputes(t *testing.T) {
	ts := startSim(t, kvdSimConfig(filepath.Join(t.TempDir(), "none.sock")))
	cached, prefilled, _ := evictionRun(t, ts, nil)
	if cached != 0 || prefilled != 161 {
		t.Fatalf("kvd down: cached %d prefilled %v", cached, prefilled)
	}
	if ts.gauge(t, "infera_sim_kvd_errors_total") < 1 {
		t.Fatal("no kvd error counted")
	}
}

// TestKVDFetchAlloc: the scheduler's kvd lookup allocates nothing once its
// buffers have grown.
func TestKVDFetchAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	sock, _ := kvdtest.Start(t, 64<<20)
	cfg := config.DefaultSim()
	cfg.KVD.Socket, cfg.KVD.BlockBytes = sock, 4096
	tier := newKVDTier(&cfg, "sim-model", zerolog.Nop())
	tier.start()
	defer tier.close()
	hashes := []uint64{11, 12, 13, 14, 15, 16, 17, 18}
	for _, h := range hashes {
		tier.blockRemoved(h)
	}
	tier.flush()
	testkit.Eventually(t, "stored", func() bool { return tier.stored.Load() == uint64(len(hashes)) })
	if n := tier.fetch(hashes); n != len(hashes) {
		t.Fatalf("fetched %d of %d", n, len(hashes))
	}
	if n := tier.fetch([]uint64{11, 99, 13}); n != 1 {
		t.Fatalf("a miss ends the prefix: %d", n)
	}
	if a := testing.AllocsPerRun(200, func() { tier.fetch(hashes) }); a != 0 {
		t.Fatalf("fetch allocates %v per call", a)
	}
}

// TestSimKVDWriteThrough: with --kvd-write-through a prompt's blocks are in
// kvd as soon as it is answered, with nothing evicted.
func TestSimKVDWriteThrough(t *testing.T) {
	sock, _ := kvdtest.Start(t, 64<<20)
	ts := startSim(t, func(c *config.Sim) {
		kvdSimConfig(sock)(c)
		c.KVBlocks = 64
		c.KVD.WriteThrough = true
	})
	p := strings.Repeat("w", 161)
	ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 1}, p))
	_, body := ts.post(t, "/tokenize", `{"model":"sim-model","prompt":"`+p+`"}`)
	var tok struct{ Tokens []uint32 }
	if err := json.Unmarshal(body, &tok); err != nil {
		t.Fatal(err)
	}
	keys := BlockKeys(tok.Tokens, 16)
	cl, err := kvd.Dial(t.Context(), sock, kvd.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	testkit.Eventually(t, "the prompt's 10 blocks written through to kvd", func() bool {
		present, err := cl.Exists(kvd.Namespace{Model: "sim-model", CompatKey: "tp0of1_pp0of1"}, keys, nil)
		return err == nil && len(present) == 10 && !slices.Contains(present, false)
	})
}
