package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/kvnats"
	"github.com/infera/infera/natsx"
	"github.com/infera/infera/tokenizer"
)

// ErrKVConfig wraps invalid kv-aware settings.
var ErrKVConfig = errors.New("router: invalid kv-aware configuration")

// Tokenizer modes of KVAwareConfig.TokenizerSpec besides a directory.
const (
	TokenizerNone   = ""       // no tokenizer: approximate routing on text
	TokenizerBytes  = "bytes"  // one token per byte (tests, simulators)
	TokenizerEngine = "engine" // ask a worker's POST /tokenize per request
)

// KVAwareConfig configures the kv-aware policy. Start from
// DefaultKVAwareConfig (the flag defaults of `infera serve`) and override
// fields: a zero means zero (no weight, no recent charge), and NewKVAware
// rejects a zero where none makes sense (a timeout, a bound).
type KVAwareConfig struct {
	// TokenizerSpec is --tokenizer: a Hugging Face tokenizer directory,
	// "bytes", "engine", or "" (none: every worker approximate).
	TokenizerSpec string
	// Tokenizer, when set, is used instead of opening TokenizerSpec.
	Tokenizer tokenizer.Tokenizer
	// EngineTokenizeTimeout bounds one POST /tokenize in engine mode.
	// EngineIdleConnTimeout closes its idle connections (below the
	// engines' keep-alive).
	EngineTokenizeTimeout time.Duration
	EngineIdleConnTimeout time.Duration

	// OverlapWeight is w in the cost w×(blocks−hits) + active + recent:
	// how many blocks of load one block of prefill saved is worth.
	OverlapWeight float64
	// PrefillOverlapWeight and DecodeOverlapWeight are the weights of the
	// prefill and decode legs of disaggregated serving (the PD path);
	// DefaultKVAwareConfig sets them to OverlapWeight.
	PrefillOverlapWeight float64
	DecodeOverlapWeight  float64

	// DefaultBlockSize hashes workers whose record has no kv_block_size
	// (until their events reveal it).
	DefaultBlockSize int
	// IndexMaxBlocks bounds the event-fed prefix index (all workers).
	IndexMaxBlocks int
	// ApproxTTL and ApproxMaxBlocks bound the router's own placement
	// records (per worker and DP rank) used in approximate mode.
	ApproxTTL       time.Duration
	ApproxMaxBlocks int
	// RecentHalfLife is the half-life of the recent-miss charge; 0
	// disables the charge.
	RecentHalfLife time.Duration
	// RecentWeight is the charge per missed block, added when the request
	// ends (while it runs, its blocks count as active). Below the overlap
	// weight, so that a conversation's next turn still prefers
	// the worker that just prefilled its previous one.
	RecentWeight float64
	// MaxShare bounds where cold requests (no target holds a quarter of
	// the prompt) go: not to a target whose recent picks (halving every 10 s)
	// exceed MaxShare × fair + 1, unless every target's do. 0 disables
	// the bound. With Cost KVCostTTFT cold requests are held to
	// MaxShareWarm instead, and balanced below it by the deficit
	// (kvestimate.go).
	MaxShare float64
	// MaxShareWarm is the same bound for warm requests; 0 disables it.
	MaxShareWarm float64

	// ProvisionalTTL and ProvisionalMaxBlocks bound the provisional hits
	// of precisely routed workers: the blocks of a prompt just placed on a
	// worker count as cached there for ProvisionalTTL (the event-latency
	// window: the engine's BlockStored is tens of ms behind the placement),
	// at most ProvisionalMaxBlocks per worker and rank. Once the events
	// land the index says the same thing; a contradicting removal ends
	// the window at the TTL at the latest. 0 disables them.
	ProvisionalTTL       time.Duration
	ProvisionalMaxBlocks int

	// CoalesceWait (Cost KVCostTTFT) is the longest a pick holds a request
	// whose prompt prefix a request in flight on its target is still
	// prefilling, waiting for that request's first token (kvcoalesce.go);
	// 0 sends it at once.
	CoalesceWait time.Duration

	// Divergence tunes the divergence alarm (kvdivergence.go; Window 0:
	// kvcache.DefaultDivergenceConfig); DivergenceOff turns it off.
	Divergence    kvcache.DivergenceConfig
	DivergenceOff bool

	// Cost is the cost mode, KVCostBlocks ("" too) or KVCostTTFT
	// (kvestimate.go; the MaxShare bounds, overlap weights and recent
	// charge do not apply there).
	Cost string

	// EventsListen, when set, is the tcp://HOST:PORT SUB socket the policy
	// binds for publishers that connect (--kv-events-listen): workers
	// whose record advertises no event endpoint are followed there, under
	// the topic kvcache.WorkerTopic(worker id).
	EventsListen string

	// Subscriber tunes the KV-event streams.
	Subscriber kvcache.SubscriberConfig

	// EventTransport is "zmq" (default: subscribe to each engine) or
	// "nats": follow each worker's events on the INFERA_KV_EVENTS
	// JetStream stream its worker relays them to (kvnats.Feed), through
	// the server NATS names.
	EventTransport string
	NATS           natsx.Config

	// PeerHints directs kvd-to-kvd pulls (peerhint.go): PeerSecret is the
	// kvds' --peer-secret, PeerWait the longest wait for a pull before the
	// request goes on.
	PeerHints  bool
	PeerSecret string
	PeerWait   time.Duration

	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

func (c KVAwareConfig) validate() (KVAwareConfig, error) {
	if c.Now == nil {
		c.Now = time.Now
	}
	switch {
	case !(c.OverlapWeight >= 0) || !(c.PrefillOverlapWeight >= 0) || !(c.DecodeOverlapWeight >= 0) || !(c.RecentWeight >= 0) || !(c.MaxShare >= 0) || !(c.MaxShareWarm >= 0),
		!finite(c.OverlapWeight) || !finite(c.PrefillOverlapWeight) || !finite(c.DecodeOverlapWeight) || !finite(c.RecentWeight) || !finite(c.MaxShare) || !finite(c.MaxShareWarm):
		return c, fmt.Errorf("%w: weights must be finite and not negative", ErrKVConfig)
	case c.DefaultBlockSize < 1 || c.DefaultBlockSize > discovery.MaxKVBlockSize:
		return c, fmt.Errorf("%w: block size %d", ErrKVConfig, c.DefaultBlockSize)
	case c.IndexMaxBlocks < 1 || c.ApproxMaxBlocks < 1:
		return c, fmt.Errorf("%w: block bounds must be positive", ErrKVConfig)
	case c.ProvisionalTTL < 0 || c.ProvisionalMaxBlocks < 0:
		return c, fmt.Errorf("%w: provisional hit bounds must not be negative", ErrKVConfig)
	case c.CoalesceWait < 0:
		return c, fmt.Errorf("%w: coalesce wait %s", ErrKVConfig, c.CoalesceWait)
	case c.ApproxTTL <= 0:
		return c, fmt.Errorf("%w: approximate ttl %s", ErrKVConfig, c.ApproxTTL)
	case c.RecentHalfLife < 0:
		return c, fmt.Errorf("%w: recent half-life %s", ErrKVConfig, c.RecentHalfLife)
	case c.EngineTokenizeTimeout <= 0 || c.EngineIdleConnTimeout <= 0:
		return c, fmt.Errorf("%w: engine tokenize timeouts must be positive", ErrKVConfig)
	case c.Cost != "" && c.Cost != KVCostBlocks && c.Cost != KVCostTTFT:
		return c, fmt.Errorf("%w: cost %q", ErrKVConfig, c.Cost)
	}
	if c.Cost == "" {
		c.Cost = KVCostBlocks
	}
	return c, nil
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// KVAware is the kv-aware policy (DESIGN §5): it sends each request to the
// worker (and data-parallel rank) with the lowest
//
//	cost = w × (blocks − hits) + active_blocks + recent
//
// where blocks are the prompt's full KV blocks, hits the longest prefix the
// worker holds (cached per its KV events, or being prefilled for a request in
// flight there), active_blocks the distinct prompt blocks the worker would
// hold in flight with this request added (blocks shared by requests count
// once), and recent a charge of RecentWeight per block its finished requests
// had to prefill, halving every RecentHalfLife, so that serial requests
// that share only a short prefix (a system prompt, a chat template's
// header) do not all follow its first holder. A cold request (no worker
// holds a quarter of it) skips workers whose recent share of picks is above
// MaxShare × fair (unless all are), so that load-ranked picks do not pile
// cold traffic onto one worker. Equal costs go
// to the model's rotating cursor, never always to the first worker.
//
// A worker is routed precisely when a tokenizer is configured and its event
// stream is confirmed; otherwise (no stream, a stream joining or resyncing,
// no tokenizer) approximately: the policy matches against the hashes of the
// prompts it sent there itself (kvcache.Placements), and exports
// infera_router_worker_approximate so that the fallback is never silent.
// Without tokens (no tokenizer) those hashes are of fixed-size chunks of the
// raw messages/prompt JSON. Multimodal requests are keyed by their image
// references instead of text.
//
// KVAware owns a prefix index and a KV-event subscriber with one goroutine
// per followed stream; Close stops them.
type KVAware struct {
	cfg    KVAwareConfig
	tok    tokenizer.Tokenizer // nil: none or engine
	chat   tokenizer.ChatAppender
	engine bool
	log    zerolog.Logger

	idx *kvcache.Index
	sub *kvcache.Subscriber
	// feed and nc: --kv-event-transport nats (nil otherwise).
	feed *kvnats.Feed
	nc   *nats.Conn
	// listenAddr is the bound --kv-events-listen endpoint ("" when none).
	listenAddr string

	mu      sync.Mutex // guards workers; Attach/Detach/Update, views, scrapes
	workers map[string]*kvWorker

	m kvMetrics

	lastTokWarn atomic.Int64 // unix ns of the last tokenization warning

	ttft bool // Cost == KVCostTTFT
	// seq counts the picks (--kv-cost ttft): the clock of the deficit's
	// decay (kvestimate.go).
	seq atomic.Int64

	peer *peerHints          // nil unless PeerHints
	div  *kvcache.Divergence // the divergence alarm (kvdivergence.go); nil: off
}

// kvWorker is a Worker's PolicyState.
type kvWorker struct {
	w         *Worker
	shape     kvShape                     // guarded by KVAware.mu
	targets   atomic.Pointer[[]*kvTarget] // replaced whole on a shape change
	tokClient *fasthttp.HostClient        // engine mode: its /tokenize
}

// kvShape is what of a record decides a worker's targets and streams.
type kvShape struct {
	endpoint, replay string
	blockSize        int // from the record; 0 = unknown
	rank             int // dp_rank of a single-rank record, else -1
	dpSize           int
}

// kvTarget is one routing target: a worker, or one rank of a worker whose
// engine multiplexes dp_size ranks behind one endpoint.
type kvTarget struct {
	worker *Worker
	key    kvcache.Key
	pin    bool // send X-Data-Parallel-Rank: key.DPRank
	bs     int  // block size from the record or the default
	idx    *kvcache.Worker
	place  *kvcache.Placements
	// keep holds the placements of prompts their client marked as worth
	// keeping (retention long: prompt_cache_retention, Anthropic
	// cache_control), for keepTTL: the engines were told to keep them.
	keep *kvcache.Placements
	prov *kvcache.Placements // provisional hits (precise mode); nil when disabled
	// used stamps each block with the target's intake clock when a request
	// using it ends (--kv-cost ttft, kvestimate.go "Eviction"); nil otherwise.
	used *kvcache.Placements

	mu       sync.RWMutex
	active   blockCounts // in-flight prompt blocks → requests holding them
	recent   float64     // miss charge as of recentAt
	recentAt int64
	picks    float64 // picks as of picksAt, halving every shareHalfLife
	picksAt  int64
	est      ttftModel // --kv-cost ttft (kvestimate.go)

	// Picks' prompt blocks and the blocks the target was expected to hold
	// (the fleet snapshot's per-worker predicted hit ratio).
	promptBlocks, hitBlocks atomic.Uint64
}

// blockSize is the size the target's hashes use: the one its events
// reported once known, else the record's or the default.
func (t *kvTarget) blockSize() int {
	if t.idx != nil {
		if bs := t.idx.BlockSize(); bs > 0 {
			return bs
		}
	}
	return t.bs
}

// precise reports whether the target's index can be trusted.
func (t *kvTarget) precise() bool { return t.idx != nil && !t.idx.Approximate() }

// keepTTL is how long the approximate view remembers a prompt marked as
// worth keeping (at least ApproxTTL): an hour, Anthropic's longest
// cache_control TTL and Infera's "1h" retention.
const keepTTL = time.Hour

// NewKVAware builds the policy, opening its tokenizer.
func NewKVAware(cfg KVAwareConfig, log zerolog.Logger) (*KVAware, error) {
	cfg, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	p := &KVAware{cfg: cfg, log: log.With().Str("component", "kv-aware").Logger(), workers: make(map[string]*kvWorker),
		ttft: cfg.Cost == KVCostTTFT}
	switch {
	case cfg.Tokenizer != nil:
		p.tok = cfg.Tokenizer
	case cfg.TokenizerSpec == TokenizerNone:
	case cfg.TokenizerSpec == TokenizerEngine:
		p.engine = true
	default:
		t, err := tokenizer.Open(cfg.TokenizerSpec)
		if err != nil {
			return nil, fmt.Errorf("open tokenizer %q: %w", cfg.TokenizerSpec, err)
		}
		p.tok = t
	}
	if ca, ok := p.tok.(tokenizer.ChatAppender); ok {
		p.chat = ca
	}
	p.idx = kvcache.NewIndex(kvcache.IndexConfig{MaxBlocks: cfg.IndexMaxBlocks})
	p.sub, err = kvcache.NewSubscriber(p.idx, cfg.Subscriber, p.log)
	if err != nil {
		return nil, fmt.Errorf("kv events subscriber: %w", err)
	}
	if cfg.EventTransport == config.KVEventTransportNATS {
		if err := p.startFeed(); err != nil {
			p.sub.Close()
			return nil, err
		}
	}
	if cfg.EventsListen != "" {
		addr, err := p.sub.Listen(cfg.EventsListen)
		if err != nil {
			p.sub.Close()
			p.closeFeed()
			return nil, err
		}
		p.listenAddr = addr
	}
	p.m = newKVMetrics()
	if cfg.PeerHints {
		p.peer = newPeerHints(cfg.PeerSecret, cfg.PeerWait, p.log)
	}
	if dc, err := divergenceConfig(cfg); err != nil {
		p.sub.Close()
		p.closeFeed()
		return nil, fmt.Errorf("%w: %w", ErrKVConfig, err)
	} else if dc != nil {
		p.div, _ = kvcache.NewDivergence(*dc)
	}
	tok := "none"
	switch {
	case p.tok != nil:
		tok = p.tok.Name()
	case p.engine:
		tok = TokenizerEngine
	}
	p.log.Info().Str("tokenizer", tok).Float64("overlap_weight", cfg.OverlapWeight).
		Int("index_max_blocks", cfg.IndexMaxBlocks).Dur("recent_half_life", cfg.RecentHalfLife).
		Msg("kv-aware routing ready")
	if tok == "none" {
		p.log.Warn().Msg("no --tokenizer: every worker is routed approximately on request text")
	}
	if hf, ok := p.tok.(*tokenizer.HF); ok && !hf.HasChatTemplate() {
		p.log.Warn().Str("tokenizer", tok).Msg("tokenizer has no chat template: chat requests are routed approximately on their text")
	}
	return p, nil
}

// Name implements Policy.
func (p *KVAware) Name() string { return PolicyKVAware }

// Close stops every KV-event stream and waits for their goroutines.
func (p *KVAware) Close() error {
	if p.peer != nil {
		p.peer.h.Close()
	}
	p.sub.Close()
	p.closeFeed()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, kw := range p.workers {
		if kw.tokClient != nil {
			kw.tokClient.CloseIdleConnections()
		}
	}
	return nil
}

// natsStartTimeout bounds connecting to NATS and opening the stream and
// bucket at start-up.
const natsStartTimeout = 15 * time.Second

// startFeed connects to NATS and opens the KV-event feed: a server that is
// down or refuses us is a start-up error.
func (p *KVAware) startFeed() error {
	ctx, cancel := context.WithTimeout(context.Background(), natsStartTimeout)
	defer cancel()
	cfg := p.cfg.NATS
	if cfg.Name == "" {
		cfg.Name = "infera-serve"
	}
	nc, err := natsx.Connect(ctx, cfg, p.log)
	if err != nil {
		return fmt.Errorf("kv events over nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err == nil {
		p.feed, err = kvnats.NewFeed(ctx, p.idx, js, p.log)
	}
	if err != nil {
		nc.Close()
		return fmt.Errorf("kv events over nats: %w", err)
	}
	p.nc = nc
	p.log.Info().Str("nats_server", natsx.Redacted(natsx.ResolveURL(cfg.URL))).Msg("kv events over nats")
	return nil
}

func (p *KVAware) closeFeed() {
	if p.feed != nil {
		p.feed.Close()
	}
	if p.nc != nil {
		p.nc.Close()
	}
}

// EventsListenEndpoint returns the bound --kv-events-listen endpoint, "" when
// the policy does not listen.
func (p *KVAware) EventsListenEndpoint() string { return p.listenAddr }

// Index returns the prefix index the event streams feed.
func (p *KVAware) Index() *kvcache.Index { return p.idx }

// OverlapWeights returns the mixed, prefill and decode overlap weights.
func (p *KVAware) OverlapWeights() (mixed, prefill, decode float64) {
	return p.cfg.OverlapWeight, p.cfg.PrefillOverlapWeight, p.cfg.DecodeOverlapWeight
}

// hasTokens reports whether text prompts can be tokenized at all.
func (p *KVAware) hasTokens() bool { return p.tok != nil || p.engine }

func shapeOf(rec *discovery.Record) kvShape {
	s := kvShape{rank: -1, dpSize: rec.EffectiveDPSize()}
	if rec.KVEventsEndpoint != nil {
		s.endpoint = *rec.KVEventsEndpoint
	}
	s.replay = replayEndpoint(rec)
	if rec.KVBlockSize != nil {
		s.blockSize = *rec.KVBlockSize
	}
	if rec.DPRank != nil {
		s.rank = *rec.DPRank
	}
	return s
}

// Attach implements FleetAware.
func (p *KVAware) Attach(w *Worker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kw := &kvWorker{w: w, shape: shapeOf(w.Record())}
	if p.engine {
		kw.tokClient = p.newTokenizeClient(w)
	}
	p.buildTargets(kw)
	w.PolicyState = kw
	p.workers[w.id] = kw
	if p.ttft {
		w.stall.setFirstTokenHook(kw)
	}
}

// Update implements RecordAware: a changed event endpoint, block size or DP
// layout rebuilds the worker's targets (requests in flight release against
// the old ones).
func (p *KVAware) Update(w *Worker) {
	kw, ok := w.PolicyState.(*kvWorker)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := shapeOf(w.Record())
	if s == kw.shape {
		// The cache size its engine reports (kv_capacity_blocks, which
		// the worker reads once the engine is up) needs no new
		// subscription.
		kw.reportCapacity()
		return
	}
	p.log.Info().Str("worker_id", w.id).Msg("kv layout of worker changed; resubscribing")
	p.dropTargets(kw)
	kw.shape = s
	p.buildTargets(kw)
}

// Detach implements FleetAware: the worker's streams stop and its index
// state goes.
func (p *KVAware) Detach(w *Worker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kw, ok := p.workers[w.id]
	if !ok || kw.w != w {
		return
	}
	delete(p.workers, w.id)
	w.stall.setFirstTokenHook(nil)
	p.dropTargets(kw)
	if kw.tokClient != nil {
		kw.tokClient.CloseIdleConnections()
	}
	p.m.approxGauge.DeleteLabelValues(w.id)
	if p.div != nil {
		p.div.Forget(w.id)
	}
}

// buildTargets creates kw's targets for kw.shape and starts their streams.
func (p *KVAware) buildTargets(kw *kvWorker) {
	s := kw.shape
	bs := s.blockSize
	if bs <= 0 {
		bs = p.cfg.DefaultBlockSize
	}
	type plan struct {
		rank int
		pin  bool
		ep   string
		rep  string
	}
	var plans []plan
	switch {
	case s.rank >= 0:
		// One rank of a data-parallel deployment with its own endpoint:
		// it publishes on the advertised endpoint and needs no pinning.
		plans = []plan{{rank: s.rank, ep: s.endpoint, rep: s.replay}}
	case s.dpSize > 1:
		for r := range s.dpSize {
			pl := plan{rank: r, pin: true}
			if s.endpoint != "" {
				pl.ep = p.rankEndpoint(kw.w.id, s.endpoint, r)
				if s.replay != "" {
					pl.rep = p.rankEndpoint(kw.w.id, s.replay, r)
				}
			}
			plans = append(plans, pl)
		}
	default:
		plans = []plan{{rank: 0, ep: s.endpoint, rep: s.replay}}
	}
	ts := make([]*kvTarget, 0, len(plans))
	for _, pl := range plans {
		t := &kvTarget{
			worker: kw.w,
			key:    kvcache.Key{Worker: kw.w.id, DPRank: pl.rank},
			pin:    pl.pin,
			bs:     bs,
			place:  kvcache.NewPlacements(p.cfg.ApproxMaxBlocks, int64(p.cfg.ApproxTTL)),
			keep:   kvcache.NewPlacements(p.cfg.ApproxMaxBlocks, int64(max(p.cfg.ApproxTTL, keepTTL))),
		}
		t.est.init()
		if p.ttft {
			t.used = kvcache.NewPlacements(usedMaxBlocks, 0)
		}
		if p.cfg.ProvisionalTTL > 0 && p.cfg.ProvisionalMaxBlocks > 0 {
			t.prov = kvcache.NewPlacements(p.cfg.ProvisionalMaxBlocks, int64(p.cfg.ProvisionalTTL))
		}
		if p.feed != nil {
			// Over NATS a worker whose record advertises an event
			// publisher relays its events: a multiplexed rank on its own
			// subject rank, any other worker on rank 0.
			srank := 0
			if pl.pin {
				srank = pl.rank
			}
			if pl.ep == "" {
				ts = append(ts, t)
				continue
			}
			if h, err := p.feed.Add(t.key, srank, s.blockSize); err != nil {
				p.log.Warn().Str("worker_id", kw.w.id).Int("dp_rank", pl.rank).Err(err).
					Msg("cannot follow kv events over nats; worker routed approximately")
			} else {
				t.idx = h
			}
			ts = append(ts, t)
			continue
		}
		src := kvcache.Source{Key: t.key, Endpoint: pl.ep, ReplayEndpoint: pl.rep, BlockSize: s.blockSize}
		if pl.ep == "" && p.listenAddr != "" && pl.rank == 0 && !pl.pin {
			// Its engine may publish through the listener.
			src.Listen, pl.ep = true, p.listenAddr
		}
		if pl.ep != "" {
			h, err := p.sub.Add(src)
			if err != nil {
				p.log.Warn().Str("worker_id", kw.w.id).Int("dp_rank", pl.rank).Str("endpoint", pl.ep).Err(err).
					Msg("cannot follow kv events; worker routed approximately")
			} else {
				t.idx = h
			}
		}
		ts = append(ts, t)
	}
	kw.targets.Store(&ts)
	kw.reportCapacity()
}

// reportCapacity gives kw's indexed targets the cache size its record
// reports (kv_capacity_blocks; 0 leaves them as they are).
func (kw *kvWorker) reportCapacity() {
	blocks := kw.w.Record().KVCapacityBlocks
	for _, t := range *kw.targets.Load() {
		if t.idx != nil {
			t.idx.ReportCapacity(blocks)
		}
	}
}

func (p *KVAware) rankEndpoint(id, ep string, rank int) string {
	out, err := kvcache.RankEndpoint(ep, rank)
	if err != nil {
		p.log.Warn().Str("worker_id", id).Int("dp_rank", rank).Str("endpoint", ep).Err(err).Msg("no kv events endpoint for rank")
		return ""
	}
	return out
}

func (p *KVAware) dropTargets(kw *kvWorker) {
	ts := kw.targets.Load()
	if ts == nil {
		return
	}
	for _, t := range *ts {
		switch {
		case t.idx == nil:
		case p.feed != nil:
			p.feed.Remove(t.key)
		default:
			p.sub.Remove(t.key)
		}
	}
}

// approximate reports whether any target of kw is routed approximately.
func (p *KVAware) approximate(kw *kvWorker) bool {
	if !p.hasTokens() {
		return true
	}
	for _, t := range *kw.targets.Load() {
		if !t.precise() {
			return true
		}
	}
	return false
}

// CacheView implements CacheViewer.
func (p *KVAware) CacheView(workerID string, dpRank int, hasRank bool) (CacheView, error) {
	p.mu.Lock()
	kw, ok := p.workers[workerID]
	p.mu.Unlock()
	if !ok {
		return CacheView{}, fmt.Errorf("cache view of %q: %w", workerID, ErrUnknownWorker)
	}
	ts := *kw.targets.Load()
	v := CacheView{WorkerID: workerID, Precise: p.hasTokens()}
	switch {
	case hasRank:
		v.DPRank = dpRank
	case len(ts) == 1:
		v.DPRank = ts[0].key.DPRank
	default:
		v.AllRanks = true
	}
	found := false
	for _, t := range ts {
		if hasRank && t.key.DPRank != dpRank {
			continue
		}
		found = true
		v.PromptBlocks += t.promptBlocks.Load()
		v.HitBlocks += t.hitBlocks.Load()
		pl := t.place.Len()
		v.PlacementBlocks += pl
		if t.idx != nil {
			v.BlockCount += t.idx.Blocks()
		} else {
			v.BlockCount += pl
		}
		if !t.precise() {
			v.Precise = false
		}
	}
	if !found {
		return CacheView{}, fmt.Errorf("cache view of %q rank %d: %w", workerID, dpRank, ErrUnknownRank)
	}
	return v, nil
}

// Release implements Policy: the request's blocks leave its target's
// in-flight set.
func (p *KVAware) Release(t Ticket, res Result) {
	kt, ok := t.State.(*kvTicket)
	if !ok {
		return
	}
	tg := kt.target
	now := p.cfg.Now().UnixNano()
	tg.mu.Lock()
	tg.active.RemoveAll(kt.hashes)
	stamp := int64(-1)
	if p.ttft {
		if res.Err == nil && res.Status == http.StatusOK {
			tg.est.noteEnd(kt, time.Now().UnixNano())
		}
		tg.est.leave(kt)
		if kt.promptTokens > 0 {
			// The blocks go back to the engine's LRU now: their last use.
			tg.est.useLive(kt.hashes, p.seq.Load())
			stamp = int64(tg.est.intake * usedScale)
		}
	}
	if p.cfg.RecentHalfLife > 0 && kt.miss > 0 {
		tg.recent = p.decayed(tg.recent, tg.recentAt, now) + p.cfg.RecentWeight*float64(kt.miss)
		tg.recentAt = now
	}
	tg.mu.Unlock()
	if stamp >= 0 && tg.used != nil {
		tg.used.Record(kt.hashes, stamp)
	}
	if kt.touch > 0 {
		p.idx.Touch(tg.idx, kt.hashes[:kt.touch])
	}
	kt.target = nil
	kt.hashes = kt.hashes[:0]
	if cap(kt.hashes) > maxRetainTokens/16 {
		kt.hashes = nil
	}
	ticketPool.Put(kt)
}

// kvTicket is a pick's private state: the blocks charged to the target
// and how many of them it had to prefill.
type kvTicket struct {
	target *kvTarget
	hashes []uint64
	miss   int
	touch  int // leading hashes to Touch in the index at release: the cached prefix relied on
	// The divergence alarm's prediction (kvdivergence.go): cached prompt
	// tokens on target, the prompt's tokens (0: not keyed by tokens).
	predTokens, promptTokens int64

	// --kv-cost ttft (kvestimate.go), guarded by target.mu.
	uncached float64 // uncached prompt tokens
	work     float64 // queued prompt tokens at the pick, uncached included
	dec      int     // sequences decoding at the pick
	wall     int64   // unix ns of the pick: its TTFT counts from here (firstToken)
	slot     int     // index in target.est.flight; -1 when not there
	first    bool    // past its first token
	firstAt  int64   // unix ns of its first token
	out      float64 // max_tokens (0 when not given): output room the engine keeps
	stream   bool    // a stream: its first token is seen (firstToken)
	pred     float64 // estimated TTFT at the pick, seconds
	wait     float64 // of it, the estimated wait for room in the cache
	// firstCh is closed at its first token or release; made when a
	// follower waits for its prefill (kvcoalesce.go).
	firstCh chan struct{}
}

var ticketPool = sync.Pool{New: func() any { return new(kvTicket) }}

// decayed returns a recent-miss charge set at `at` as seen at now.
func (p *KVAware) decayed(v float64, at, now int64) float64 {
	return decayedFor(v, at, now, p.cfg.RecentHalfLife)
}

// decayedFor returns v set at `at`, halving every halfLife, as seen at now.
func decayedFor(v float64, at, now int64, halfLife time.Duration) float64 {
	if v == 0 || halfLife <= 0 {
		return v
	}
	if dt := now - at; dt > 0 {
		v *= math.Exp2(-float64(dt) / float64(halfLife))
	}
	return v
}

// replayEndpoint returns the record's kv_events_replay_endpoint.
func replayEndpoint(rec *discovery.Record) string {
	if rec.KVEventsReplayEndpoint != nil {
		return *rec.KVEventsReplayEndpoint
	}
	return ""
}
