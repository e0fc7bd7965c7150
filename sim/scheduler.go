package sim

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Sequence end states, stored in seq.done.
const (
	seqRunning  uint32 = iota
	seqFinished        // every token generated; the handler owns the seq again
	seqShutdown        // the scheduler stopped first; the seq is abandoned
)

// seq is one request inside the engine. A handler fills the first group of
// fields, then hands the seq to the scheduler with a submit message; from
// then on the scheduler owns the scheduler fields, and the handler only
// reads the atomics and waits on notify. Ownership comes back to the
// handler when done is seqFinished; a handler that gives up early sends an
// abort message instead and never touches the seq again (the scheduler
// recycles it).
type seq struct {
	// Set by the handler before submit.
	tokens    []uint32 // prompt followed by every output token
	hashes    []uint64 // chained hashes of the full blocks of tokens
	promptLen int
	maxTokens int
	stream    bool // wake the handler per token, not only at the end
	// remote: the prompt's KV came from a prefill (PD decode, pd.go); it
	// is loaded, not computed, so it costs no prefill time.
	remote bool
	// kvParams is the kv_transfer_params of the answer (a vLLM prefill's
	// hand-off); nil: null.
	kvParams []byte
	// logTTFT: write the request's line to --model-ttft-log at its first
	// token (set on a first choice only, so n > 1 choices are one line);
	// requestID is its X-Request-Id.
	logTTFT   bool
	requestID []byte

	// Scheduler-owned.
	blocks    []int32
	computed  int  // tokens whose KV is in the cache
	committed int  // blocks whose hash is registered
	reserve   int  // blocks promised to the sequence but not allocated yet
	gen       int  // output tokens sampled
	stepFill  int  // prefill tokens scheduled in the current step
	stepDec   bool // decode scheduled in the current step
	queued    bool // in the waiting queue
	running   bool // in the running batch
	// kvd as a second-level cache (kvd.go): blocks kvdFrom..kvdUpTo-1
	// were fetched from kvd when the sequence was first matched; kvdLoad
	// of them are still to be loaded (stepLoad tokens in this step).
	kvdChecked       bool
	kvdFrom, kvdUpTo int
	kvdLoad          int
	stepLoad         int
	arrived          int64 // the model clock when it was submitted
	admitted         int64 // the model clock when it entered the batch

	// Shared.
	generated atomic.Int32 // output tokens the handler may send
	cached    atomic.Int32 // prompt tokens served from the prefix cache
	done      atomic.Uint32
	notify    chan struct{} // capacity 1; a wake-up, not a count
	own       chan struct{} // q's own notify; a choice of n > 1 borrows its first choice's

	// Handler scratch, reused across requests.
	text    []byte
	out     []byte
	outEnds []int32 // HF tokenizer: end of output token i in out; empty for bytes
	scratch []byte
	// tool: the raw name of the tool a triggered tool call calls (see
	// ToolTrigger); empty: a text answer.
	tool []byte
	// A stop sequence matched (stop.go): the answer's text is out[:visible]
	// and stopRaw is the matched string's raw JSON content; visible is -1
	// and stopRaw empty when none did (finish_reason length).
	visible int
	stopRaw []byte
	// more: choices 1..n-1 of a request with n > 1 (choices.go), each a
	// sequence of its own; only the first choice holds them.
	more []*seq
}

var seqPool = sync.Pool{New: func() any {
	ch := make(chan struct{}, 1)
	return &seq{notify: ch, own: ch}
}}

func getSeq() *seq {
	q := seqPool.Get().(*seq)
	if q.notify != q.own { // it was a choice of n > 1 (choices.go)
		q.notify = q.own
	}
	clear(q.more)
	q.more = q.more[:0]
	select { // a wake-up left over from the previous request
	case <-q.notify:
	default:
	}
	q.tokens, q.hashes, q.blocks, q.outEnds = q.tokens[:0], q.hashes[:0], q.blocks[:0], q.outEnds[:0]
	q.promptLen, q.maxTokens, q.stream = 0, 0, false
	q.tool, q.visible, q.stopRaw = q.tool[:0], -1, q.stopRaw[:0]
	q.remote, q.kvParams = false, nil
	q.logTTFT, q.requestID = false, q.requestID[:0]
	q.computed, q.committed, q.reserve, q.gen = 0, 0, 0, 0
	q.stepFill, q.stepDec, q.queued, q.running = 0, false, false, false
	q.kvdChecked, q.kvdFrom, q.kvdUpTo, q.kvdLoad, q.stepLoad, q.arrived, q.admitted = false, 0, 0, 0, 0, 0, 0
	q.generated.Store(0)
	q.cached.Store(0)
	q.done.Store(seqRunning)
	return q
}

func putSeq(q *seq) {
	// Drop buffers a huge request grew, so the pool does not pin them.
	const maxKeep = 1 << 16
	if cap(q.tokens) > maxKeep || cap(q.text) > 4*maxKeep {
		return
	}
	seqPool.Put(q)
}

func (q *seq) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// msg is what handlers send to the scheduler: a new sequence, or an abort.
type msg struct {
	q     *seq
	abort bool
}

// timing is the step-time model, in nanoseconds of wall time (time scale
// already applied).
type timing struct {
	overhead     float64 // per step
	perPrefill   float64 // per uncached prompt token
	perDecodeSeq float64 // per sequence that decodes in the step
	perKVDBlock  float64 // per block loaded from kvd (kvd.go)
	scale        float64 // --time-scale, to report model time unscaled
}

func (t timing) step(prefillTokens, decodeSeqs int) time.Duration {
	// Clamp before converting: an absurd --time-scale must not overflow
	// into a negative duration (which would mean no sleep at all).
	return time.Duration(min(t.overhead+float64(prefillTokens)*t.perPrefill+float64(decodeSeqs)*t.perDecodeSeq, float64(time.Hour)))
}

// idleTTFTNs is the step model's time to first token for q alone on an
// idle engine: its uncached prompt (at least the one token every prefill
// computes) prefilled a step budget at a time, no decode beside it, kvd
// loads not counted. The floor of q's TTFT once its cache hits are given.
func (sc *scheduler) idleTTFTNs(q *seq) int64 {
	n := max(q.promptLen-int(q.cached.Load()), 1)
	var d time.Duration
	for n > 0 {
		c := min(n, max(sc.maxBatched, 1))
		d += sc.timing.step(c, 0)
		n -= c
	}
	return int64(d)
}

// maxLag bounds how far the step clock may fall behind the wall clock
// before it stops catching up (after a GC pause or a descheduled process).
const maxLag = 20 * time.Millisecond

// scheduler is the engine: one goroutine owns the waiting queue, the
// running batch and the prefix cache, and runs continuous-batching steps.
// Everything it publishes for /metrics goes through atomics.
type scheduler struct {
	in      chan msg
	resetc  chan chan struct{}
	stopped chan struct{}

	cache      *prefixCache
	blockSize  int
	maxSeqs    int
	maxBatched int
	timing     timing
	instant    bool          // time scale 0: run each sequence to the end on admission
	events     *kvEvents     // nil when KV events are off
	kvd        *kvdTier      // nil without --kvd-socket
	ttftLog    *modelTTFTLog // nil without --model-ttft-log
	// The model clock: the sum of the simulated steps' durations; stepNs
	// is the planned step's, which ends at the wall time stepEnd.
	modelNs, stepNs int64
	stepEnd         time.Time

	waiting  []*seq
	whead    int
	running  []*seq
	reserved int // blocks promised to running sequences, not yet allocated

	// Counters, owned by the scheduler goroutine and published after each
	// round of work.
	queries, hits, promptTokens, genTokens, success uint64
	// prefilled: prompt tokens computed (not cache hits, not loaded);
	// ttftNs and firsts: the model-clock time from submission to first
	// token, summed over the sequences that got one.
	prefilled, ttftNs, firsts uint64

	pub struct {
		running, waiting, cached                        atomic.Int64
		usageBits                                       atomic.Uint64
		queries, hits, promptTokens, genTokens, success atomic.Uint64
		prefilled, ttftNs, firsts                       atomic.Uint64
	}
}

func newScheduler(c *prefixCache, maxSeqs, maxBatched int, t timing, instant bool, events *kvEvents) *scheduler {
	return &scheduler{
		events:     events,
		in:         make(chan msg, 4096),
		resetc:     make(chan chan struct{}),
		stopped:    make(chan struct{}),
		cache:      c,
		blockSize:  c.blockSize,
		maxSeqs:    maxSeqs,
		maxBatched: maxBatched,
		timing:     t,
		instant:    instant,
	}
}

// submit hands q to the scheduler; false when it has stopped.
func (sc *scheduler) submit(q *seq) bool {
	select {
	case <-sc.stopped:
		return false
	default:
	}
	select {
	case sc.in <- msg{q: q}:
		return true
	case <-sc.stopped:
		return false
	}
}

// abort gives q back to the scheduler before it finished. The caller must
// not touch q afterwards.
func (sc *scheduler) abort(q *seq) {
	select {
	case sc.in <- msg{q: q, abort: true}:
	case <-sc.stopped:
	}
}

// wait blocks until q finished or the scheduler stopped and returns q's end
// state (seqShutdown when the scheduler stopped first).
func (sc *scheduler) wait(q *seq) uint32 {
	for {
		if d := q.done.Load(); d != seqRunning {
			return d
		}
		select {
		case <-q.notify:
		case <-sc.stopped:
			if d := q.done.Load(); d != seqRunning {
				return d
			}
			return seqShutdown
		}
	}
}

// waitOr is wait that also returns, with seqRunning, when gone is closed
// first (the handler's client left; it must abort q).
func (sc *scheduler) waitOr(q *seq, gone <-chan struct{}) uint32 {
	for {
		if d := q.done.Load(); d != seqRunning {
			return d
		}
		select {
		case <-q.notify:
		case <-gone:
			if d := q.done.Load(); d != seqRunning {
				return d
			}
			return seqRunning
		case <-sc.stopped:
			if d := q.done.Load(); d != seqRunning {
				return d
			}
			return seqShutdown
		}
	}
}

// resetPrefixCache clears the cache on the scheduler goroutine.
func (sc *scheduler) resetPrefixCache(ctx context.Context) bool {
	reply := make(chan struct{})
	select {
	case sc.resetc <- reply:
	case <-sc.stopped:
		return false
	case <-ctx.Done():
		return false
	}
	select {
	case <-reply:
		return true
	case <-sc.stopped:
		return false
	}
}

func (sc *scheduler) run(ctx context.Context) {
	defer sc.shutdown()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var clock time.Time // end of the last simulated step
	for {
		if len(sc.running) == 0 && sc.numWaiting() == 0 {
			sc.publish()
			select {
			case <-ctx.Done():
				return
			case m := <-sc.in:
				sc.handle(m)
			case r := <-sc.resetc:
				sc.cache.reset()
				close(r)
			}
			sc.drain()
			clock = time.Time{}
			continue
		}
		sc.drain()
		sc.admit()
		d, busy := sc.plan()
		sc.publish()
		if !busy {
			// Nothing can run (cannot happen while every admitted
			// sequence holds its whole reservation); avoid spinning.
			clock = time.Time{}
			if !sc.sleep(ctx, timer, time.Millisecond) {
				return
			}
			continue
		}
		now := time.Now()
		if clock.IsZero() || now.Sub(clock) > maxLag {
			clock = now
		}
		clock = clock.Add(d)
		sc.stepEnd = clock
		if !sc.sleep(ctx, timer, clock.Sub(now)) {
			return
		}
		sc.apply()
	}
}

// sleep waits d while serving messages; false when ctx ended.
func (sc *scheduler) sleep(ctx context.Context, timer *time.Timer, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer.Reset(d)
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case m := <-sc.in:
			sc.handle(m)
		case r := <-sc.resetc:
			sc.cache.reset()
			close(r)
		case <-timer.C:
			return true
		}
	}
}

// intoStep is how far into the running step the model clock is now: a
// request that arrives while a step runs waits for the next one, as in
// vLLM, but its time to first token counts from when it came, not from the
// step's start (which put up to a whole step of time before it arrived
// into its TTFT: a 2,048-token prefill step is 104 ms at 20,000 tokens/s).
func (sc *scheduler) intoStep() int64 {
	if sc.stepNs <= 0 || sc.stepEnd.IsZero() {
		return 0
	}
	return min(sc.stepNs, max(0, sc.stepNs-int64(time.Until(sc.stepEnd))))
}

// drain handles queued messages without blocking.
func (sc *scheduler) drain() {
	for range cap(sc.in) {
		select {
		case m := <-sc.in:
			sc.handle(m)
		default:
			return
		}
	}
}

func (sc *scheduler) handle(m msg) {
	q := m.q
	if m.abort {
		sc.remove(q)
		putSeq(q)
		return
	}
	if sc.instant {
		sc.runInstant(q)
		return
	}
	q.queued = true
	q.arrived = sc.modelNs + sc.intoStep()
	sc.waiting = append(sc.waiting, q)
}

// remove takes an aborted sequence out of the queue or the batch and frees
// its blocks.
func (sc *scheduler) remove(q *seq) {
	switch {
	case q.queued:
		q.queued = false
		for i := sc.whead; i < len(sc.waiting); i++ {
			if sc.waiting[i] == q {
				copy(sc.waiting[i:], sc.waiting[i+1:])
				sc.waiting[len(sc.waiting)-1] = nil
				sc.waiting = sc.waiting[:len(sc.waiting)-1]
				break
			}
		}
	case q.running:
		q.running = false
		for i, r := range sc.running {
			if r == q {
				copy(sc.running[i:], sc.running[i+1:])
				sc.running[len(sc.running)-1] = nil
				sc.running = sc.running[:len(sc.running)-1]
				break
			}
		}
		sc.free(q)
	}
}

func (sc *scheduler) numWaiting() int { return len(sc.waiting) - sc.whead }

// admit moves waiting sequences into the batch in arrival order while there
// is room in the batch and in the cache (head-of-line blocking, as vLLM).
func (sc *scheduler) admit() {
	for len(sc.running) < sc.maxSeqs && sc.numWaiting() > 0 {
		q := sc.waiting[sc.whead]
		if !sc.reserve(q) {
			break
		}
		sc.waiting[sc.whead] = nil
		sc.whead++
		q.queued, q.running = false, true
		q.admitted = sc.modelNs
		sc.running = append(sc.running, q)
	}
	if sc.whead > 0 && sc.whead*2 >= len(sc.waiting) {
		n := copy(sc.waiting, sc.waiting[sc.whead:])
		clear(sc.waiting[n:])
		sc.waiting = sc.waiting[:n]
		sc.whead = 0
	}
}

// blocksFor is how many blocks a sequence needs in total: KV for the prompt
// and every output token but the last, which is sampled and never fed back.
func (sc *scheduler) blocksFor(q *seq) int {
	return (q.promptLen + q.maxTokens - 1 + sc.blockSize - 1) / sc.blockSize
}

// reserve matches q's prompt against the cache and, if the rest of its
// blocks can be promised, takes the matched blocks and the promise. At
// least one prompt token is always computed, so a fully cached prompt
// still has a prefill step (as vLLM recomputes the last token).
func (sc *scheduler) reserve(q *seq) bool {
	c := sc.cache
	maxMatch := (q.promptLen - 1) / sc.blockSize
	matched, fromFree := 0, 0
	for matched < maxMatch {
		id, ok := c.lookup(q.hashes[matched])
		if !ok {
			break
		}
		if c.blocks[id].ref == 0 {
			fromFree++
		}
		matched++
	}
	loaded := sc.kvdMatch(q, matched, maxMatch)
	fresh := sc.blocksFor(q) - matched
	if fromFree+fresh > c.freeLen-sc.reserved {
		return false
	}
	for i := range matched {
		id, _ := c.lookup(q.hashes[i])
		c.acquire(id)
		q.blocks = append(q.blocks, id)
	}
	q.reserve = fresh
	sc.reserved += fresh
	q.computed = matched * sc.blockSize
	q.committed = matched
	q.kvdLoad = loaded
	q.cached.Store(int32(q.computed + loaded*sc.blockSize))
	sc.queries += uint64(q.promptLen)
	sc.hits += uint64(q.computed)
	sc.promptTokens += uint64(q.promptLen)
	return true
}

// compute marks tokens up to n as computed: it allocates the blocks they
// need from the reservation and registers every block that became full.
func (sc *scheduler) compute(q *seq, n int) {
	c := sc.cache
	for len(q.blocks)*sc.blockSize < n {
		q.blocks = append(q.blocks, c.allocate())
		q.reserve--
		sc.reserved--
	}
	q.computed = n
	for full := n / sc.blockSize; q.committed < full; q.committed++ {
		i := q.committed
		if i > 0 {
			if _, ok := c.lookup(q.hashes[i-1]); !ok {
				sc.adopt(q, i-1)
			}
		}
		sc.commitBlock(q, i)
	}
}

func (sc *scheduler) commitBlock(q *seq, i int) {
	parent := rootHash
	if i > 0 {
		parent = q.hashes[i-1]
	}
	sc.cache.commit(q.blocks[i], q.hashes[i], parent, q.tokens[i*sc.blockSize:(i+1)*sc.blockSize])
}

// adopt registers q's own copies of its blocks up to j whose hashes are no
// longer cached, so that a block is never cached without its parent. That
// happens when the copy another sequence registered first was evicted while
// q held an identical anonymous one, or after /reset_prefix_cache while q
// ran. A KV-event consumer drops a stored block whose parent it does not
// know, so a parentless block would make the router's view of this engine
// differ from the cache; registering the chain keeps both equal.
func (sc *scheduler) adopt(q *seq, j int) {
	k := j
	for k > 0 {
		if _, ok := sc.cache.lookup(q.hashes[k-1]); ok {
			break
		}
		k--
	}
	for ; k <= j; k++ {
		sc.commitBlock(q, k)
	}
}

// free returns a sequence's blocks and unused reservation.
func (sc *scheduler) free(q *seq) {
	sc.cache.release(q.blocks)
	q.blocks = q.blocks[:0]
	sc.reserved -= q.reserve
	q.reserve = 0
}

// finish ends a sequence that generated all its tokens and hands it back to
// its handler.
func (sc *scheduler) finish(q *seq) {
	q.running = false
	sc.free(q)
	sc.success++
	// The handler may recycle q as soon as done is set, and the next
	// request resets q.notify: read it first.
	notify := q.notify
	q.done.Store(seqFinished)
	select {
	case notify <- struct{}{}:
	default:
	}
}

// runInstant is the zero-latency path: with no time to simulate, a sequence
// is admitted, prefilled and decoded to the end at once. The cache still
// sees every block stored and released, so cached_tokens stay meaningful.
func (sc *scheduler) runInstant(q *seq) {
	if !sc.reserve(q) {
		// Only possible if a request exceeds the whole cache, which
		// validation rules out; fail it rather than wait forever.
		q.done.Store(seqShutdown)
		q.wake()
		return
	}
	sc.prefilled += uint64(q.promptLen - q.computed - q.kvdLoad*sc.blockSize)
	q.kvdLoad = 0
	sc.compute(q, q.promptLen+q.maxTokens-1)
	sc.firsts++
	if q.logTTFT && sc.ttftLog != nil {
		sc.ttftLog.record(q, 0, 0, 0, sc.modelNs)
	}
	q.gen = q.maxTokens
	sc.genTokens += uint64(q.maxTokens)
	q.generated.Store(int32(q.maxTokens))
	sc.finish(q)
}

// plan chooses the work of one step and returns its duration: one decode
// token for every sequence past prefill, then prefill chunks in admission
// order, all within the step's token budget.
func (sc *scheduler) plan() (time.Duration, bool) {
	budget := sc.maxBatched
	decodes, prefill, loaded, kvdBlocks := 0, 0, 0, 0
	for _, q := range sc.running {
		q.stepFill, q.stepDec = 0, false
		if q.gen > 0 && budget > 0 {
			q.stepDec = true
			budget--
			decodes++
		}
	}
	for _, q := range sc.running {
		if q.gen > 0 {
			continue
		}
		if q.kvdLoad > 0 {
			// Loaded from kvd: its own cost, no token budget.
			q.stepLoad = q.kvdLoad * sc.blockSize
			kvdBlocks += q.kvdLoad
			loaded++
		}
		if budget == 0 {
			continue
		}
		if q.remote {
			// Loaded from the prefill's transfer: no compute, no budget.
			q.stepFill = q.promptLen - q.computed
			loaded++
			continue
		}
		n := min(q.promptLen-q.computed-q.stepLoad, budget)
		q.stepFill = n
		budget -= n
		prefill += n
	}
	sc.prefilled += uint64(prefill)
	d := sc.timing.step(prefill, decodes) + sc.timing.load(kvdBlocks)
	sc.stepNs = int64(d)
	return d, decodes+prefill+loaded > 0
}

// apply makes the planned step's results visible. Sequences aborted during
// the step are no longer in the batch and are skipped.
func (sc *scheduler) apply() {
	kept := sc.running[:0]
	for _, q := range sc.running {
		progressed := false
		switch {
		case q.stepDec:
			sc.compute(q, q.promptLen+q.gen)
			q.gen++
			progressed = true
		case q.stepFill > 0 || q.stepLoad > 0:
			if q.stepLoad > 0 {
				q.kvdLoad = 0
			}
			sc.compute(q, q.computed+q.stepLoad+q.stepFill)
			if q.computed == q.promptLen {
				q.gen = 1 // the prefill step samples the first token
				progressed = true
				sc.firsts++
				at := sc.modelNs + sc.stepNs
				sc.ttftNs += uint64(at - q.arrived)
				if q.logTTFT && sc.ttftLog != nil {
					sc.ttftLog.record(q, at-q.arrived, q.admitted-q.arrived, sc.idleTTFTNs(q), at)
				}
			}
		}
		q.stepFill, q.stepDec, q.stepLoad = 0, false, 0
		if progressed {
			sc.genTokens++
			q.generated.Store(int32(q.gen))
			if q.gen == q.maxTokens {
				sc.finish(q)
				continue
			}
			if q.stream {
				q.wake()
			}
		}
		kept = append(kept, q)
	}
	clear(sc.running[len(kept):])
	sc.running = kept
	sc.modelNs += sc.stepNs
	sc.stepNs = 0
}

// publish ends a round of work: it sends the KV events the round caused as
// one batch and makes the counters visible. It runs before every wait, so
// no change to the cache waits longer than one simulated step to be
// published.
func (sc *scheduler) publish() {
	if sc.events != nil {
		sc.events.flush()
	}
	if sc.kvd != nil {
		sc.kvd.flush()
	}
	sc.pub.cached.Store(int64(len(sc.cache.index)))
	sc.pub.running.Store(int64(len(sc.running)))
	sc.pub.waiting.Store(int64(sc.numWaiting()))
	sc.pub.usageBits.Store(math.Float64bits(sc.cache.usage()))
	sc.pub.queries.Store(sc.queries)
	sc.pub.hits.Store(sc.hits)
	sc.pub.promptTokens.Store(sc.promptTokens)
	sc.pub.genTokens.Store(sc.genTokens)
	sc.pub.success.Store(sc.success)
	sc.pub.prefilled.Store(sc.prefilled)
	sc.pub.ttftNs.Store(sc.ttftNs)
	sc.pub.firsts.Store(sc.firsts)
}

// shutdown abandons every sequence still held, wakes its handler and marks
// the scheduler stopped.
func (sc *scheduler) shutdown() {
	for _, q := range sc.waiting[sc.whead:] {
		q.done.Store(seqShutdown)
		q.wake()
	}
	for _, q := range sc.running {
		q.done.Store(seqShutdown)
		q.wake()
	}
	sc.waiting, sc.running = nil, nil
	sc.publish()
	close(sc.stopped)
}
