package router

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/openai"
	"github.com/infera/infera/tokenizer"
)

// fakeClock is a settable clock for the recent-miss charge.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }
func newFakeClock() *fakeClock               { c := &fakeClock{}; c.ns.Store(1e18); return c }
func kvRecord(i int, mod func(*discovery.Record)) discovery.Record {
	id := "127.0.0.1:" + strconv.Itoa(20000+i)
	r := discovery.Record{WorkerID: id, URL: "http://" + id, ModelName: "m", Engine: "sim",
		DisaggMode: discovery.DisaggMixed, DPSize: 1, RequestTransport: "http", Status: discovery.StatusActive}
	if mod != nil {
		mod(&r)
	}
	return r
}

// kvEnv is a router with a kv-aware policy over fake workers that are never
// dialled: tests call Pick and Release directly.
type kvEnv struct {
	t     *testing.T
	p     *KVAware
	r     *Router
	clock *fakeClock
}

func newKVEnv(t *testing.T, cfg KVAwareConfig, recs ...discovery.Record) *kvEnv {
	t.Helper()
	clock := newFakeClock()
	if cfg.Now == nil {
		cfg.Now = clock.now
	}
	p, err := NewKVAware(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	r, err := New(DefaultConfig(), p, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: recs})
	return &kvEnv{t: t, p: p, r: r, clock: clock}
}

// blocksConfig is kvConfig with the block cost named (--kv-cost blocks): the
// tests that use it are of that cost's terms and share bounds, whatever
// serve's default cost is.
func blocksConfig(set func(*KVAwareConfig)) KVAwareConfig {
	return costConfig(KVCostBlocks, set)
}

// costConfig is kvConfig with the cost mode named; set may be nil.
func costConfig(cost string, set func(*KVAwareConfig)) KVAwareConfig {
	return kvConfig(func(c *KVAwareConfig) {
		c.Cost = cost
		if set != nil {
			set(c)
		}
	})
}

// eachCost runs a test of what both cost modes share once per mode, as the
// subtest cost=<mode>.
func eachCost(t *testing.T, test func(t *testing.T, cost string)) {
	for _, cost := range []string{KVCostBlocks, KVCostTTFT} {
		t.Run("cost="+cost, func(t *testing.T) { test(t, cost) })
	}
}

func (e *kvEnv) cands() *Candidates { return e.r.view.Load().models["m"] }

// pick runs the policy on body (a chat body when it has "messages").
func (e *kvEnv) pick(body string) Ticket {
	e.t.Helper()
	var req openai.Request
	if err := openai.Scan([]byte(body), &req); err != nil {
		e.t.Fatalf("scan %s: %v", body, err)
	}
	rt := RouteCompletions
	if !req.Messages.Empty() {
		rt = RouteChatCompletions
	}
	tk, err := e.p.Pick(&PickInput{Route: rt, Body: []byte(body), Request: &req, RequestID: []byte("test-request")}, e.cands())
	if err != nil || tk.Worker == nil {
		e.t.Fatalf("pick: %v", err)
	}
	return tk
}

// serial picks and releases at once, returning the worker id.
func (e *kvEnv) serial(body string) string {
	tk := e.pick(body)
	e.p.Release(tk, Result{Status: 200})
	return tk.Worker.id
}

// makePrecise gives every target of the fleet an index handle in precise
// mode, as a confirmed event stream would.
func (e *kvEnv) makePrecise() {
	e.t.Helper()
	for _, kw := range e.p.workers {
		for _, t := range *kw.targets.Load() {
			h, err := e.p.idx.Register(t.key, t.bs)
			if err != nil {
				e.t.Fatal(err)
			}
			h.SetMode(kvcache.ModePrecise)
			t.idx = h
		}
	}
}

// store indexes the full blocks of tokens for worker id, as its engine's
// BlockStored event would.
func (e *kvEnv) store(id string, tokens []uint32) {
	e.t.Helper()
	t := (*e.p.workers[id].targets.Load())[0]
	n := len(tokens) / 16
	engine := make([]uint64, n)
	for i := range engine {
		engine[i] = uint64(1000*len(e.p.workers)) + uint64(i) + uint64(len(tokens))<<20
	}
	b := kvcache.Batch{Events: []kvcache.Event{{Type: kvcache.EventBlockStored, Hashes: engine, Tokens: tokens[:n*16], BlockSize: 16}}}
	// Blocks already held (a chat header another prompt stored) refresh.
	if res := e.p.idx.Apply(t.idx, &b); res.Stored+res.Refreshed != n {
		e.t.Fatalf("stored %d and refreshed %d of %d blocks", res.Stored, res.Refreshed, n)
	}
}

func chat(content string) string {
	return `{"model":"m","messages":[{"role":"user","content":"` + content + `"}]}`
}

func chatTokens(t *testing.T, content string) []uint32 {
	t.Helper()
	s, err := tokenizer.Bytes{}.RenderChat([]byte(`[{"role":"user","content":"` + content + `"}]`))
	if err != nil {
		t.Fatal(err)
	}
	return tokenizer.Bytes{}.Encode(s)
}

func fleet(n int) []discovery.Record {
	recs := make([]discovery.Record, n)
	for i := range recs {
		recs[i] = kvRecord(i, nil)
	}
	return recs
}

// unique is n bytes of text that differ from the first byte for each i.
func unique(i, n int) string {
	s := "<" + strconv.Itoa(i) + ">"
	return strings.Repeat(s, n/len(s)+1)[:n]
}

func TestKVBlocksColdRequestsSpread(t *testing.T) {
	for _, spec := range []string{TokenizerBytes, TokenizerNone} {
		t.Run("tokenizer="+spec, func(t *testing.T) {
			e := newKVEnv(t, blocksConfig(func(c *KVAwareConfig) { c.TokenizerSpec = spec }), fleet(4)...)
			counts := map[string]int{}
			for i := range 40 {
				counts[e.serial(chat(unique(i, 300)))]++
			}
			if len(counts) != 4 {
				t.Fatalf("cold requests went to %d workers: %v", len(counts), counts)
			}
			for id, n := range counts {
				if n < 8 || n > 12 {
					t.Fatalf("worker %s got %d of 40 cold requests: %v", id, n, counts)
				}
			}
		})
	}
}

func TestKVBlocksTiesRotate(t *testing.T) {
	// Prompts shorter than a block cost the same everywhere: the scan
	// start rotates, so the picks go round the fleet.
	e := newKVEnv(t, blocksConfig(func(c *KVAwareConfig) { c.TokenizerSpec = TokenizerBytes }), fleet(3)...)
	var got []string
	for range 6 {
		got = append(got, e.serial(`{"model":"m","prompt":"hi"}`))
	}
	for i := range 3 {
		if got[i] == got[(i+1)%3] || got[i] != got[i+3] {
			t.Fatalf("ties did not rotate: %v", got)
		}
	}
}

func TestKVBlocksWarmPrefixGoesToHolder(t *testing.T) {
	// Without provisional hits, so that every request's hits are the
	// stored prefix alone (the repeats' own tails would count otherwise).
	e := newKVEnv(t, blocksConfig(func(c *KVAwareConfig) { c.TokenizerSpec, c.ProvisionalTTL = TokenizerBytes, 0 }), fleet(4)...)
	e.makePrecise()
	long := unique(7, 800)
	holder := kvRecord(2, nil).WorkerID
	e.store(holder, chatTokens(t, long))
	// The same conversation continued: its prefix is cached on worker 2.
	for range 5 {
		if got := e.serial(chat(long + " and more")); got != holder {
			t.Fatalf("warm request went to %s, want the holder %s", got, holder)
		}
	}
	m := gather(t, e.r, "infera_router_kv_hit_blocks")
	// The shared prefix: the chat header and the long content.
	if h := m.GetHistogram(); h.GetSampleCount() != 5 || h.GetSampleSum() != 5*float64((len("<|im_start|>user\n")+len(long))/16) {
		t.Fatalf("hit histogram %v", h)
	}
	// A cold request does not follow it there: the holder carries the
	// recent misses' charge... and equal costs rotate.
	cold := map[string]bool{}
	for i := range 8 {
		cold[e.serial(chat(unique(100+i, 300)))] = true
	}
	if len(cold) < 3 {
		t.Fatalf("cold requests piled onto %v", cold)
	}
}

func TestKVActiveBlocksCountSharedPrefixOnce(t *testing.T) {
	eachCost(t, func(t *testing.T, cost string) {
		e := newKVEnv(t, costConfig(cost, func(c *KVAwareConfig) { c.TokenizerSpec = TokenizerBytes }), fleet(1)...)
		shared := unique(1, 320)
		a := e.pick(chat(shared + unique(2, 160)))
		b := e.pick(chat(shared + unique(3, 160)))
		tg := a.State.(*kvTicket).target
		if b.State.(*kvTicket).target != tg {
			t.Fatal("one worker, two targets")
		}
		na, nb := len(a.State.(*kvTicket).hashes), len(b.State.(*kvTicket).hashes)
		common := 0
		for common < min(na, nb) && a.State.(*kvTicket).hashes[common] == b.State.(*kvTicket).hashes[common] {
			common++
		}
		if common < 320/16 {
			t.Fatalf("only %d common blocks", common)
		}
		if got, want := tg.active.Len(), na+nb-common; got != want {
			t.Fatalf("active blocks %d, want %d (%d + %d - %d shared)", got, want, na, nb, common)
		}
		e.p.Release(a, Result{})
		if got := tg.active.Len(); got != nb {
			t.Fatalf("after one release: %d active, want %d", got, nb)
		}
		e.p.Release(b, Result{})
		if got := tg.active.Len(); got != 0 {
			t.Fatalf("after both releases: %d active", got)
		}
	})
}

func TestKVBlocksActiveBlocksSpreadConcurrentLoad(t *testing.T) {
	// Requests in flight weigh on their worker: with nothing cached, a
	// second concurrent request goes elsewhere.
	e := newKVEnv(t, blocksConfig(func(c *KVAwareConfig) { c.TokenizerSpec = TokenizerBytes; c.RecentHalfLife = 0 }), fleet(2)...)
	a := e.pick(chat(unique(1, 400)))
	b := e.pick(chat(unique(2, 400)))
	if a.Worker == b.Worker {
		t.Fatalf("two concurrent cold requests on %s", a.Worker.id)
	}
}

func TestKVBlocksRecentChargeDecays(t *testing.T) {
	e := newKVEnv(t, blocksConfig(func(c *KVAwareConfig) { c.TokenizerSpec = TokenizerBytes; c.RecentHalfLife = time.Second }), fleet(1)...)
	tk := e.pick(chat(unique(1, 480)))
	kt := tk.State.(*kvTicket)
	tg, blocks := kt.target, float64(len(kt.hashes))
	e.p.Release(tk, Result{})
	now := e.clock.now().UnixNano()
	charge := blocks * 0.5 // the default RecentWeight
	if got := e.p.decayed(tg.recent, tg.recentAt, now); got != charge {
		t.Fatalf("recent charge %v, want half the %v missed blocks", got, blocks)
	}
	e.clock.advance(time.Second)
	now = e.clock.now().UnixNano()
	if got := e.p.decayed(tg.recent, tg.recentAt, now); math.Abs(got-charge/2) > 1e-9 {
		t.Fatalf("after one half-life %v, want %v", got, charge/2)
	}
	e.clock.advance(9 * time.Second)
	if got := e.p.decayed(tg.recent, tg.recentAt, e.clock.now().UnixNano()); got > blocks/1000 {
		t.Fatalf("after ten half-lives %v", got)
	}
}

func TestKVBlocksSerialSharedPrefixSpreadsThenSticks(t *testing.T) {
	// Serial requests sharing a long system prompt: the first holder
	// takes the next ones while its recent misses are small, and the
	// charge moves traffic on instead of piling everything onto it. With
	// overlap weight 1: at the serve default (4) the saved prefill
	// outweighs the charge and the holder keeps them all.
	e := newKVEnv(t, blocksConfig(func(c *KVAwareConfig) {
		c.TokenizerSpec = TokenizerBytes
		c.OverlapWeight, c.PrefillOverlapWeight, c.DecodeOverlapWeight = 1, 1, 1
	}), fleet(4)...)
	sys := unique(9, 640)
	counts := map[string]int{}
	for i := range 60 {
		counts[e.serial(chat(sys+unique(i, 64)))]++
		e.clock.advance(100 * time.Millisecond)
	}
	t.Logf("serial shared-prefix picks: %v", counts)
	if len(counts) < 2 {
		t.Fatalf("all serial requests on one worker: %v", counts)
	}
	for id, n := range counts {
		if n > 45 {
			t.Fatalf("%s took %d of 60: %v", id, n, counts)
		}
	}
}

func TestKVApproximateModeAndGauge(t *testing.T) {
	eachCost(t, func(t *testing.T, cost string) {
		e := newKVEnv(t, costConfig(cost, func(c *KVAwareConfig) { c.TokenizerSpec = TokenizerBytes }), fleet(3)...)
		// No event streams: every worker approximate, placements recorded.
		id := e.serial(chat(unique(5, 640)))
		for range 3 {
			if got := e.serial(chat(unique(5, 640) + "tail")); got != id {
				t.Fatalf("approximate placement not followed: %s then %s", id, got)
			}
		}
		for _, r := range fleet(3) {
			if v := gaugeValue(t, e.r, "infera_router_worker_approximate", r.WorkerID); v != 1 {
				t.Fatalf("%s approximate gauge %v, want 1", r.WorkerID, v)
			}
		}
		v, err := e.p.CacheView(id, 0, false)
		if err != nil || v.Precise || v.BlockCount == 0 || v.BlockCount != v.PlacementBlocks {
			t.Fatalf("cache view %+v, %v", v, err)
		}
		e.makePrecise()
		for _, r := range fleet(3) {
			if v := gaugeValue(t, e.r, "infera_router_worker_approximate", r.WorkerID); v != 0 {
				t.Fatalf("%s approximate gauge %v after its stream is confirmed", r.WorkerID, v)
			}
		}
		// Without a tokenizer every worker stays approximate.
		e2 := newKVEnv(t, costConfig(cost, nil), fleet(1)...)
		e2.makePrecise()
		if v := gaugeValue(t, e2.r, "infera_router_worker_approximate", kvRecord(0, nil).WorkerID); v != 1 {
			t.Fatalf("no tokenizer: gauge %v, want 1", v)
		}
	})
}

func TestKVTokenArrayPromptWithoutTokenizer(t *testing.T) {
	eachCost(t, func(t *testing.T, cost string) {
		e := newKVEnv(t, costConfig(cost, nil), fleet(2)...)
		e.makePrecise()
		toks := make([]uint32, 64)
		var sb strings.Builder
		for i := range toks {
			toks[i] = uint32(1000 + i)
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(strconv.Itoa(1000 + i))
		}
		holder := kvRecord(1, nil).WorkerID
		e.store(holder, toks)
		tk := e.pick(`{"model":"m","prompt":[` + sb.String() + `,5,6]}`)
		if tk.Worker.id != holder {
			t.Fatalf("token prompt went to %s, want %s", tk.Worker.id, holder)
		}
		if got := len(tk.State.(*kvTicket).hashes); got != 4 {
			t.Fatalf("%d blocks, want 4", got)
		}
	})
}

func TestKVDataParallelTargets(t *testing.T) {
	eachCost(t, func(t *testing.T, cost string) {
		e := newKVEnv(t, costConfig(cost, func(c *KVAwareConfig) { c.TokenizerSpec = TokenizerBytes }),
			kvRecord(0, func(r *discovery.Record) { r.DPSize = 2 }),
			kvRecord(1, func(r *discovery.Record) { one := 1; r.DPRank = &one; r.DPSize = 2 }))
		seen := map[string]bool{}
		for i := range 6 {
			tk := e.pick(chat(unique(i, 200)))
			key := tk.Worker.id + "/" + strconv.Itoa(tk.DPRank) + "/" + strconv.FormatBool(tk.PinRank)
			seen[key] = true
		}
		w0, w1 := kvRecord(0, nil).WorkerID, kvRecord(1, nil).WorkerID
		want := []string{w0 + "/0/true", w0 + "/1/true", w1 + "/1/false"}
		for _, k := range want {
			if !seen[k] {
				t.Fatalf("targets picked %v, want %v", seen, want)
			}
		}
		if len(seen) != 3 {
			t.Fatalf("targets picked %v", seen)
		}
		if _, err := e.p.CacheView(w0, 1, true); err != nil {
			t.Fatal(err)
		}
		if _, err := e.p.CacheView(w0, 2, true); err == nil {
			t.Fatal("rank 2 of a dp_size 2 worker has a view")
		}
		if v, _ := e.p.CacheView(w0, 0, false); !v.AllRanks {
			t.Fatalf("view without rank %+v, want all ranks", v)
		}
	})
}

func TestKVMultimodalAffinity(t *testing.T) {
	eachCost(t, func(t *testing.T, cost string) {
		e := newKVEnv(t, costConfig(cost, func(c *KVAwareConfig) { c.TokenizerSpec = TokenizerBytes }), fleet(4)...)
		img := func(url, text string) string {
			return `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + text +
				`"},{"type":"image_url","image_url":{"url":"` + url + `"}}]}]}`
		}
		first := e.serial(img("https://img/cat.png", "what is this?"))
		for i := range 4 {
			if got := e.serial(img("https://img/cat.png", "and now "+strconv.Itoa(i))); got != first {
				t.Fatalf("same image went to %s, then %s", first, got)
			}
		}
		others := map[string]bool{}
		for i := range 8 {
			others[e.serial(img("https://img/"+strconv.Itoa(i)+".png", "what is this?"))] = true
		}
		if len(others) < 3 {
			t.Fatalf("different images all on %v", others)
		}
		if c := counterValue(t, e.r, "infera_router_kv_picks_total", "images"); c != 13 {
			t.Fatalf("image picks %v, want 13", c)
		}
	})
}

func TestKVRecordUpdateRebuildsTargets(t *testing.T) {
	eachCost(t, func(t *testing.T, cost string) {
		e := newKVEnv(t, costConfig(cost, func(c *KVAwareConfig) { c.TokenizerSpec = TokenizerBytes }), fleet(1)...)
		kw := e.p.workers[kvRecord(0, nil).WorkerID]
		before := *kw.targets.Load()
		e.r.UpdateFleet(&discovery.Snapshot{Revision: 2, Workers: fleet(1)})
		if (*kw.targets.Load())[0] != before[0] {
			t.Fatal("unchanged record rebuilt the targets")
		}
		e.r.UpdateFleet(&discovery.Snapshot{Revision: 3, Workers: []discovery.Record{
			kvRecord(0, func(r *discovery.Record) { bs := 32; r.KVBlockSize = &bs; r.DPSize = 2 })}})
		after := *kw.targets.Load()
		if len(after) != 2 || after[0].bs != 32 || !after[1].pin {
			t.Fatalf("targets after the update: %d, bs %d", len(after), after[0].bs)
		}
		e.r.UpdateFleet(&discovery.Snapshot{Revision: 4})
		if _, err := e.p.CacheView(kvRecord(0, nil).WorkerID, 0, false); err == nil {
			t.Fatal("removed worker still has a cache view")
		}
	})
}

func TestKVPickAllocs(t *testing.T) {
	eachCost(t, func(t *testing.T, cost string) {
		if raceEnabled {
			t.Skip("the race detector allocates")
		}
		e := newKVEnv(t, costConfig(cost, func(c *KVAwareConfig) { c.TokenizerSpec = TokenizerBytes }), fleet(8)...)
		body := chat(unique(3, 2000))
		var req openai.Request
		if err := openai.Scan([]byte(body), &req); err != nil {
			t.Fatal(err)
		}
		in := &PickInput{Route: RouteChatCompletions, Body: []byte(body), Request: &req}
		c := e.cands()
		run := func() {
			tk, err := e.p.Pick(in, c)
			if err != nil {
				t.Fatal(err)
			}
			e.p.Release(tk, Result{})
		}
		// Under MaxShare the picks go round the eight workers once the fleet
		// is busy, so each one's placements and remembered prompts warm up.
		for range 8 * 20 {
			run()
		}
		if n := testing.AllocsPerRun(200, run); n != 0 {
			t.Fatalf("approximate pick: %.1f allocs, want 0", n)
		}
		e.makePrecise()
		e.store(kvRecord(3, nil).WorkerID, chatTokens(t, unique(3, 2000)))
		// Likewise for the provisional hits.
		for range 8 * 20 {
			run()
		}
		if n := testing.AllocsPerRun(200, run); n != 0 {
			t.Fatalf("precise pick: %.1f allocs, want 0", n)
		}
	})
}

// gather returns the one metric of family name.
func gather(t *testing.T, r *Router, name string) *dto.Metric {
	t.Helper()
	for _, mf := range gatherAll(t, r) {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0]
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

func gatherAll(t *testing.T, r *Router) []*dto.MetricFamily {
	t.Helper()
	mfs, err := r.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// gaugeValue returns the value of the series of name whose first label
// has value label.
func gaugeValue(t *testing.T, r *Router, name, label string) float64 {
	t.Helper()
	for _, mf := range gatherAll(t, r) {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() == label {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s}", name, label)
	return 0
}

// counterValue sums the series of name having a label of value label.
func counterValue(t *testing.T, r *Router, name, label string) float64 {
	t.Helper()
	var sum float64
	for _, mf := range gatherAll(t, r) {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

var _ prometheus.Collector = (*KVAware)(nil)

// TestKVBlocksOverlapWeightByRole: a prefill worker's misses weigh
// PrefillOverlapWeight and a decode worker's DecodeOverlapWeight, so cold
// requests (all blocks missing everywhere) go to the worker whose role
// counts misses least, every time; swapping the weights swaps the pick.
// (Prefill and decode workers are no candidates of the mixed path; the PD
// path offers them as here.)
func TestKVBlocksOverlapWeightByRole(t *testing.T) {
	role := func(m discovery.DisaggMode) func(*discovery.Record) {
		return func(r *discovery.Record) { r.DisaggMode = m }
	}
	prefill, decode := kvRecord(0, role(discovery.DisaggPrefill)), kvRecord(1, role(discovery.DisaggDecode))
	for _, c := range []struct {
		prefillW, decodeW float64
		want              string
	}{
		{10, 0, decode.WorkerID},
		{0, 10, prefill.WorkerID},
	} {
		e := newKVEnv(t, blocksConfig(func(k *KVAwareConfig) {
			k.TokenizerSpec = TokenizerBytes
			k.MaxShare = 0 // the weights alone decide
			k.OverlapWeight = 1
			k.PrefillOverlapWeight = c.prefillW
			k.DecodeOverlapWeight = c.decodeW
		}), prefill, decode)
		cands := &Candidates{Model: "m", Workers: []*Worker{e.r.workers[prefill.WorkerID], e.r.workers[decode.WorkerID]}, cursor: new(atomic.Uint64)}
		for i := range 6 {
			body := chat(unique(i, 400))
			var req openai.Request
			if err := openai.Scan([]byte(body), &req); err != nil {
				t.Fatal(err)
			}
			tk, err := e.p.Pick(&PickInput{Route: RouteChatCompletions, Body: []byte(body), Request: &req}, cands)
			if err != nil || tk.Worker == nil {
				t.Fatalf("pick: %v", err)
			}
			e.p.Release(tk, Result{Status: 200})
			if got := tk.Worker.id; got != c.want {
				t.Fatalf("weights prefill %v decode %v: cold request %d went to %s, want %s", c.prefillW, c.decodeW, i, got, c.want)
			}
		}
	}
}

// TestKVProvisionalHitBridgesEventLatency: a repeat of a prompt that arrives
// after the first one finished but before the engine's events land follows
// it to the worker that just prefilled it (a provisional hit), not to the
// least-charged worker; after the provisional TTL it is a cold prompt again.
func TestKVProvisionalHitBridgesEventLatency(t *testing.T) {
	eachCost(t, func(t *testing.T, cost string) {
		for _, ttl := range []time.Duration{0, 2 * time.Second} {
			t.Run("ttl="+ttl.String(), func(t *testing.T) {
				e := newKVEnv(t, costConfig(cost, func(c *KVAwareConfig) { c.TokenizerSpec, c.ProvisionalTTL = TokenizerBytes, ttl }), fleet(4)...)
				e.makePrecise()
				long := chat(unique(3, 2000))
				first := e.serial(long)
				e.clock.advance(20 * time.Millisecond)
				second := e.serial(long)
				if (second == first) != (ttl > 0) {
					t.Fatalf("provisional ttl %s: first %s, second %s", ttl, first, second)
				}
				if ttl == 0 {
					return
				}
				if v, err := e.p.CacheView(first, 0, false); err != nil || v.BlockCount != 0 {
					t.Fatalf("provisional hits must not show as indexed blocks: %+v %v", v, err)
				}
				e.clock.advance(ttl + time.Second)
				// Expired, and the worker carries the recent-miss charge of
				// the first prefill: a cold prompt goes elsewhere.
				if third := e.serial(long); third == first {
					t.Fatalf("after the provisional ttl the prompt still went to %s", third)
				}
			})
		}
	})
}

// TestKVBlocksMaxShareBoundsConcentration: one worker of four caches a prefix that
// is 20% of every request of a steady stream (100 requests/s). The prefill it
// saves outweighs the other terms (the recent-miss charge is off to isolate
// the bound), so without the share bound it takes them all; with it, these
// cold requests (no worker holds a quarter of them) keep the holder within
// MaxShare × fair (+1) of recent picks. A request the holder holds most of
// is not cold and keeps following its cache.
func TestKVBlocksMaxShareBoundsConcentration(t *testing.T) {
	for _, maxShare := range []float64{0, 1.1} {
		t.Run(fmt.Sprintf("max_share=%g", maxShare), func(t *testing.T) {
			e := newKVEnv(t, blocksConfig(func(c *KVAwareConfig) {
				c.TokenizerSpec, c.MaxShare, c.RecentWeight = TokenizerBytes, maxShare, 0
			}), fleet(4)...)
			e.makePrecise()
			prefix := unique(7, 640)
			holder := kvRecord(2, nil).WorkerID
			e.store(holder, chatTokens(t, prefix))
			counts := map[string]int{}
			const n = 400
			for i := range n {
				counts[e.serial(chat(prefix+unique(1000+i, 2560)))]++
				e.clock.advance(10 * time.Millisecond)
			}
			t.Logf("picks: %v", counts)
			if maxShare == 0 {
				if counts[holder] != n {
					t.Fatalf("without the bound the holder took %d of %d", counts[holder], n)
				}
				return
			}
			if share := float64(counts[holder]) / (n / 4.0); share > 1.2 {
				t.Fatalf("holder took %.2f× its fair share: %v", share, counts)
			}
			if len(counts) != 4 {
				t.Fatalf("the rest did not spread: %v", counts)
			}
			// Warm: the holder has most of this prompt (and, once the
			// others' provisional hits of the prefix have expired, alone).
			e.clock.advance(3 * time.Second)
			for i := range 10 {
				if got := e.serial(chat(prefix + unique(5000+i, 200))); got != holder {
					t.Fatalf("warm request %d went to %s, want the holder %s", i, got, holder)
				}
			}
		})
	}
}

// TestKVBlocksMaxShareWarmBoundsHotPrefix: one worker of four caches a prefix that
// is most of every request of a steady stream, so each request is warm and,
// without a warm bound, follows the holder. MaxShareWarm keeps the holder
// within about that many times its fair share of recent picks: the others
// take the overflow (and, once they hold the prefix too, share it).
func TestKVBlocksMaxShareWarmBoundsHotPrefix(t *testing.T) {
	for _, warm := range []float64{0, 1.15} {
		t.Run(fmt.Sprintf("max_share_warm=%g", warm), func(t *testing.T) {
			e := newKVEnv(t, blocksConfig(func(c *KVAwareConfig) {
				c.TokenizerSpec, c.MaxShareWarm, c.RecentWeight, c.ProvisionalTTL = TokenizerBytes, warm, 0, 0
			}), fleet(4)...)
			e.makePrecise()
			prefix := unique(7, 2560)
			holder := kvRecord(2, nil).WorkerID
			e.store(holder, chatTokens(t, prefix))
			counts := map[string]int{}
			const n = 400
			for i := range n {
				counts[e.serial(chat(prefix+unique(1000+i, 320)))]++
				e.clock.advance(10 * time.Millisecond)
			}
			t.Logf("picks: %v", counts)
			share := float64(counts[holder]) / (n / 4.0)
			if warm == 0 {
				if counts[holder] != n {
					t.Fatalf("without the warm bound the holder took %d of %d", counts[holder], n)
				}
				return
			}
			if share > 1.25 {
				t.Fatalf("holder took %.2f× its fair share: %v", share, counts)
			}
			if share < 1 {
				t.Fatalf("holder took %.2f× its fair share: the warm bound pushed it below fair: %v", share, counts)
			}
		})
	}
}

// TestKVTouchAtRelease: the cached prefix a pick relied on becomes the most
// recent in the index's LRU when its request ends (Release), not in the
// pick, which takes no index write lock.
func TestKVTouchAtRelease(t *testing.T) {
	eachCost(t, func(t *testing.T, cost string) {
		e := newKVEnv(t, costConfig(cost, func(c *KVAwareConfig) { c.TokenizerSpec = TokenizerBytes }), kvRecord(0, nil), kvRecord(1, nil))
		e.makePrecise()
		a := kvRecord(0, nil).WorkerID
		old := unique(1, 600)
		e.store(a, chatTokens(t, old))
		tg := e.target0(a)
		// A later prompt stored after it (sharing the chat header's block).
		recent := chatTokens(t, unique(2, 600))
		engine := make([]uint64, len(recent)/16)
		for i := range engine {
			engine[i] = 1<<40 + uint64(i)
		}
		e.p.idx.Apply(tg.idx, &kvcache.Batch{Events: []kvcache.Event{{Type: kvcache.EventBlockStored, Hashes: engine, Tokens: recent[:len(engine)*16], BlockSize: 16}}})
		first := func() uint64 { return e.p.idx.AppendHashes(nil, tg.idx)[0] }
		before := first()
		tk := e.pick(chat(old + " and then"))
		if tk.Worker.id != a {
			t.Fatalf("picked %s, not the holder %s", tk.Worker.id, a)
		}
		if got := first(); got != before {
			t.Fatalf("the pick touched the index: most recent %x, was %x", got, before)
		}
		root := tk.State.(*kvTicket).hashes[0]
		e.p.Release(tk, Result{Status: 200})
		if got := first(); got != root {
			t.Fatalf("after release the most recent block is %x, want the prefix's root %x", got, root)
		}
	})
}
