package router

import (
	"bytes"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infera/infera/kvcache"
)

// The divergence alarm: per worker, what the kv-aware policy
// predicted the engine would find cached for a request, and the prompt's
// token count as the router tokenized it, against what the engine reports
// in the answer's usage (prompt_tokens, prompt_tokens_details.cached_tokens:
// vLLM with --enable-prompt-tokens-details, SGLang with
// --enable-cache-report, the simulator always). kvcache.Divergence keeps the
// window and the verdict; a divergent worker raises a gauge, one warning
// (rate-limited) naming the worker and the likely cause, and shows on the
// fleet page.
//
// The request path's share: the ticket remembers the prediction (commit),
// a stream's usage chunk is noticed as its events pass (usageTap, only when
// the request asked for usage and was keyed by tokens), and finish hands
// the usage to the policy (noteUsage). Nothing of it allocates.

// divergenceTokens returns what the ticket of a pick remembers: the cached
// prompt tokens predicted on target best and the prompt's token count (0, 0
// for a request not keyed by tokens: no tokenizer, images).
func divergenceTokens(sc *kvScratch, kind keyKind, best int) (predicted, prompt int64) {
	if kind != keyTokens {
		return 0, 0
	}
	bs := sc.sets[sc.setOf[best]].bs
	return int64(sc.hits[best]) * int64(bs), int64(len(sc.tokens))
}

// usageTap notices the usage of a streamed answer as its events pass
// (eventPump.step), when want is set (wantUsage).
type usageTap struct {
	want, seen     bool
	prompt, cached int64 // cached < 0: the engine reported no cached tokens
	completion     int64 // < 0: the engine reported no completion tokens
}

// note looks for a usage object in one SSE event.
func (u *usageTap) note(ev []byte) {
	if !u.want {
		return
	}
	if prompt, cached, completion, ok := parseUsage(ev); ok {
		u.seen, u.prompt, u.cached, u.completion = true, prompt, cached, completion
	}
}

// wantUsage says whether the relayed attempt's stream is worth tapping: a
// token-keyed kv-aware pick of a request that asked for usage, not PD.
func (rel *relay) wantUsage() bool {
	if !rel.scan.IncludeUsage || rel.pd != nil {
		return false
	}
	kt, ok := rel.att.ticket.State.(*kvTicket)
	return ok && kt.promptTokens > 0
}

// noteUsage hands a finished request's engine usage to the kv-aware
// policy's divergence detector (finish calls it before the attempt ends).
func (r *Router) noteUsage(rel *relay, o outcome) {
	if o != outcomeOK || rel.pd != nil {
		return
	}
	kt, ok := rel.att.ticket.State.(*kvTicket)
	if !ok || kt.promptTokens <= 0 || kt.target == nil {
		return
	}
	p, ok := r.routePolicy(rel.route).(*KVAware)
	if !ok || (p.div == nil && !p.ttft) {
		return
	}
	var prompt, cached, completion int64
	switch {
	case rel.scan.Stream:
		u := &rel.pump.usage
		if !u.seen {
			return
		}
		prompt, cached, completion = u.prompt, u.cached, u.completion
	case rel.dialect.response == nil && rel.ctx != nil:
		// The engine's own answer (a translated one no longer is).
		if prompt, cached, completion, ok = parseUsage(answerBody(&rel.ctx.Response)); !ok {
			return
		}
	default:
		return
	}
	p.observeUsage(kt, prompt, cached, completion)
}

// observeUsage records one answered request of kt's worker (cached and
// completion < 0: not reported).
func (p *KVAware) observeUsage(kt *kvTicket, prompt, cached, completion int64) {
	if p.ttft && completion >= 0 {
		p.noteOutput(kt, completion)
	}
	if p.ttft && cached >= 0 {
		p.noteIntake(kt, cached)
		if e := p.log.Debug(); e.Enabled() && len(kt.hashes) >= minWarmBlocks {
			e.Uint64("prompt_key", kt.hashes[minWarmBlocks-1]).Int("blocks", len(kt.hashes)).
				Str("worker_id", kt.target.worker.id).Int64("predicted_tokens", kt.predTokens).
				Int64("cached_tokens", cached).Int64("prompt_tokens", prompt).Msg("kv answer")
		}
	}
	if p.div == nil {
		return
	}
	s := kvcache.DivergenceSample{RouterPrompt: kt.promptTokens, EnginePrompt: prompt, NoCached: cached < 0}
	if cached >= 0 {
		// Without the engine's count the cached-token rule learns nothing.
		s.Predicted, s.Reported = kt.predTokens, cached
	}
	w := kt.target.worker
	st := p.div.ObserveSample(w.id, s, p.cfg.Now())
	if !st.Warn {
		return
	}
	p.m.divWarnings.Inc()
	p.log.Warn().Str("worker_id", w.id).Str("cause", st.Cause.String()).
		Int64("predicted_cached_tokens", st.Predicted).Int64("reported_cached_tokens", st.Reported).
		Int("requests", st.Requests).Int("prompts_counted", st.Counted).Int("prompts_differing", st.Differing).
		Int64("router_prompt_tokens", st.LastDiffering.RouterPrompt).Int64("engine_prompt_tokens", st.LastDiffering.EnginePrompt).
		Str("likely_cause", divergenceHint(st)).
		Msg("kv divergence: the engine's prompt cache disagrees with the router's prediction")
}

// divergenceHint explains a divergent worker's likely cause to the
// operator.
func divergenceHint(st kvcache.DivergenceStatus) string {
	switch {
	case st.Cause == kvcache.CausePromptTokens:
		return "tokenizer or chat-template mismatch: the engine counts most prompts' tokens differently from the router (check --tokenizer against the engine's model)"
	case st.Cause == kvcache.CauseCachedTokens && st.Counted > 0 && st.Differing == 0:
		return "the engine counts the prompts as the router does but finds far fewer cached prefixes than predicted: " +
			"a chat template rendering per-request content, or a KV cache too small for its working set (evicting before the router's view follows)"
	case st.Cause == kvcache.CauseCachedTokens:
		return "tokenizer or chat-template mismatch (the engine does not find the prefixes the router hashed), or a KV cache too small for its working set"
	}
	return ""
}

// divergenceViewer is the policy side of the fleet page's divergence.
type divergenceViewer interface {
	Divergence(workerID string) (kvcache.DivergenceStatus, bool)
}

// Divergence returns a worker's divergence state; false when nothing was
// observed for it (or the alarm is off).
func (p *KVAware) Divergence(workerID string) (kvcache.DivergenceStatus, bool) {
	if p.div == nil {
		return kvcache.DivergenceStatus{}, false
	}
	st := p.div.Status(workerID)
	return st, st.Requests > 0
}

// FleetDivergence is a worker's divergence alarm on the fleet page.
type FleetDivergence struct {
	Divergent bool   `json:"divergent"`
	Cause     string `json:"cause,omitempty"`
	Hint      string `json:"likely_cause,omitempty"`
	Requests  int    `json:"requests"`
	// Cached prompt tokens over the window: the router's prediction and
	// the engine's report.
	Predicted int64 `json:"predicted_cached_tokens"`
	Reported  int64 `json:"reported_cached_tokens"`
	// Requests whose prompt both counted, and of them those counted
	// differently.
	PromptsCounted   int `json:"prompts_counted"`
	PromptsDiffering int `json:"prompts_differing"`
}

// fleetDivergence fills a fleet page row from the policy's detector.
func fleetDivergence(dv divergenceViewer, fw *FleetWorker) {
	st, ok := dv.Divergence(fw.WorkerID)
	if !ok {
		return
	}
	fw.Divergence = &FleetDivergence{Divergent: st.Divergent, Cause: st.Cause.String(), Hint: divergenceHint(st),
		Requests: st.Requests, Predicted: st.Predicted, Reported: st.Reported, PromptsCounted: st.Counted, PromptsDiffering: st.Differing}
	if st.EnginePrompt > 0 {
		h := round3(float64(st.EngineCached) / float64(st.EnginePrompt))
		fw.HitRatioReported = &h
	}
}

// divergenceMetrics are the alarm's series.
type divergenceMetrics struct {
	divergent, cachedRatio, promptMismatch *prometheus.Desc
}

func newDivergenceMetrics() divergenceMetrics {
	l := []string{"worker_id"}
	return divergenceMetrics{
		divergent: prometheus.NewDesc("infera_router_kv_divergent",
			"1 while the engine's reported prompt cache disagrees with the kv-aware prediction over the last requests (likely a tokenizer or chat-template mismatch); see the warning log and /v1/admin/fleet.", l, nil),
		cachedRatio: prometheus.NewDesc("infera_router_kv_divergence_cached_ratio",
			"Engine-reported cached prompt tokens over the router's predicted ones, over the worker's last requests (1 when nothing was predicted).", l, nil),
		promptMismatch: prometheus.NewDesc("infera_router_kv_prompt_count_mismatch_ratio",
			"Share of the worker's last requests whose prompt token count (usage.prompt_tokens) differs from the router's.", l, nil),
	}
}

func (m *divergenceMetrics) describe(ch chan<- *prometheus.Desc) {
	ch <- m.divergent
	ch <- m.cachedRatio
	ch <- m.promptMismatch
}

func (m *divergenceMetrics) collect(ch chan<- prometheus.Metric, d *kvcache.Divergence) {
	if d == nil {
		return
	}
	d.Each(func(w string, st kvcache.DivergenceStatus) {
		v := 0.0
		if st.Divergent {
			v = 1
		}
		mis := 0.0
		if st.Counted > 0 {
			mis = float64(st.Differing) / float64(st.Counted)
		}
		ch <- prometheus.MustNewConstMetric(m.divergent, prometheus.GaugeValue, v, w)
		ch <- prometheus.MustNewConstMetric(m.cachedRatio, prometheus.GaugeValue, st.Ratio(), w)
		ch <- prometheus.MustNewConstMetric(m.promptMismatch, prometheus.GaugeValue, mis, w)
	})
}

// The keys parseUsage searches for, each with the offset of the byte its
// search anchors on. bytes.Index anchors on a key's first byte, a quote,
// which starts every key and string: inside a usage object a false start
// at each (~10 before "cached_tokens"). A byte rarer there is found by one
// IndexByte: 'p' of "prompt_tokens" (the first key of a usage object), 'h'
// of "cached_tokens" (no other usage key has one). "usage" itself keeps
// bytes.Index (at 0): over a whole answer its quick switch to a wide
// compare after a few false starts costs less than IndexByte on any of
// its letters (callgrind, session 24: the 'g' cost 909 instructions
// against 791).
var (
	usageKey        = anchoredKey{[]byte(`"usage"`), 0}
	promptTokensKey = anchoredKey{[]byte(`"prompt_tokens"`), 1}
	cachedTokensKey = anchoredKey{[]byte(`"cached_tokens"`), 4}
	// 'l' of "completion_tokens": in a usage object only "total_tokens"
	// and the details' keys share it.
	completionTokensKey = anchoredKey{[]byte(`"completion_tokens"`), 5}
)

// anchoredKey is a quoted JSON key and the offset of the byte in it that
// indexKey looks for first (0: bytes.Index's own search).
type anchoredKey struct {
	key []byte
	at  int
}

// parseUsage finds the usage object of an OpenAI answer or stream chunk
// and returns its prompt_tokens, prompt_tokens_details.cached_tokens
// (cached -1 when absent or null) and completion_tokens (-1 when absent);
// ok is false without a usage object
// carrying prompt_tokens. JSON strings cannot hold these keys unescaped,
// so a byte search is exact.
func parseUsage(b []byte) (prompt, cached, completion int64, ok bool) {
	i := jsonKey(b, usageKey)
	if i < 0 {
		return 0, 0, 0, false
	}
	b = b[i:]
	if len(b) == 0 || b[0] != '{' {
		return 0, 0, 0, false // "usage":null
	}
	prompt, ok = jsonInt(b, promptTokensKey)
	if !ok {
		return 0, 0, 0, false
	}
	cached, found := jsonInt(b, cachedTokensKey)
	if !found {
		cached = -1
	}
	completion, found = jsonInt(b, completionTokensKey)
	if !found {
		completion = -1
	}
	return prompt, cached, completion, true
}

// jsonKey returns the index of the value after the first "key": in b
// (whitespace skipped), or -1.
func jsonKey(b []byte, k anchoredKey) int {
	off := 0
	for {
		i := indexKey(b[off:], k)
		if i < 0 {
			return -1
		}
		j := off + i + len(k.key)
		for j < len(b) && isJSONSpace(b[j]) {
			j++
		}
		if j < len(b) && b[j] == ':' {
			j++
			for j < len(b) && isJSONSpace(b[j]) {
				j++
			}
			return j
		}
		off = j
	}
}

// indexKey is bytes.Index(b, k.key): the first occurrence, found by its
// anchor byte (every occurrence has it at k.at) and then compared whole.
func indexKey(b []byte, k anchoredKey) int {
	if k.at == 0 {
		return bytes.Index(b, k.key)
	}
	c := k.key[k.at]
	for i := k.at; i < len(b); {
		j := bytes.IndexByte(b[i:], c)
		if j < 0 {
			return -1
		}
		s := i + j - k.at
		if s+len(k.key) > len(b) {
			return -1 // a later start does not fit either
		}
		if string(b[s:s+len(k.key)]) == string(k.key) {
			return s
		}
		i += j + 1
	}
	return -1
}

// jsonInt reads the non-negative integer value of the first "key" in b.
func jsonInt(b []byte, k anchoredKey) (int64, bool) {
	i := jsonKey(b, k)
	if i < 0 || i >= len(b) || b[i] < '0' || b[i] > '9' {
		return 0, false
	}
	var v int64
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if v > (1<<62)/10 {
			return 0, false
		}
		v = v*10 + int64(b[i]-'0')
	}
	return v, true
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// divergenceConfig is cfg's detector configuration: the default when
// unset (Window 0), nil when off.
func divergenceConfig(c KVAwareConfig) (*kvcache.DivergenceConfig, error) {
	if c.DivergenceOff {
		return nil, nil
	}
	dc := c.Divergence
	if dc.Window == 0 {
		dc = kvcache.DefaultDivergenceConfig()
	}
	if err := dc.Validate(); err != nil {
		return nil, err
	}
	return &dc, nil
}
