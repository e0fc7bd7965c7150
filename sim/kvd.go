package sim

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/kvd"
)

// kvd as the simulator's second-level cache (--kvd-socket). A block the GPU
// prefix cache evicts is stored in kvd (batched, off the scheduler
// goroutine); a prompt whose prefix the GPU cache misses asks kvd for the
// blocks that follow its GPU hit (one batch_get on the scheduler goroutine,
// as vLLM's connector looks up external blocks when it schedules), and
// the leading blocks found are loaded, at --kvd-load-ms-per-block each,
// instead of being recomputed at --prefill-tokens-per-s. They count as
// cached tokens of the answer, as vLLM counts a connector's hits.
//
// Keys are the sim's chained block hashes, 8 bytes big-endian (BlockKeys),
// under (served model name, --kvd-compat-key); a stored value is
// --kvd-block-bytes long and starts with its own key, which a load checks
// (a value that does not is a miss). kvd being down or slow never stalls
// the engine for more than --kvd-timeout: the blocks are recomputed and
// kvd is dialed again after kvdRedial.

// kvdRedial is how long a failed kvd connection stays given up.
const kvdRedial = time.Second

// kvdWriteQueue bounds the eviction batches waiting for the writer.
const kvdWriteQueue = 64

// BlockKeys returns the kvd keys of the full blocks of tokens, as the
// simulator names them: its chained block hashes, 8 bytes big-endian (the
// block_hashes of POST /v1/cache/prewarm are their hex).
func BlockKeys(tokens []uint32, blockSize int) [][]byte {
	hashes, _ := appendBlockHashes(nil, tokens, blockSize, nil)
	keys := make([][]byte, len(hashes))
	for i, h := range hashes {
		keys[i] = binary.BigEndian.AppendUint64(nil, h)
	}
	return keys
}

type kvdTier struct {
	socket     string
	ns         kvd.Namespace
	set        kvd.SetOptions
	timeout    time.Duration
	blockBytes int
	// writeThrough: blocks are stored when cached, not when evicted.
	writeThrough bool
	log          zerolog.Logger

	// Scheduler goroutine: the get connection and its scratch.
	get     *kvd.Client
	getDown time.Time // not dialed again before
	keys    [][]byte
	keyBuf  []byte
	res     kvd.BatchResult
	evicted []uint64 // this round's evictions, handed to the writer by flush

	wq    chan []uint64
	spare chan []uint64
	stop  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once

	hitBlocks, missBlocks, stored, dropped, errs atomic.Uint64
}

func newKVDTier(cfg *config.Sim, name string, log zerolog.Logger) *kvdTier {
	return &kvdTier{
		socket:       cfg.KVD.Socket,
		ns:           kvd.Namespace{Model: name, CompatKey: cfg.KVD.CompatKey},
		set:          kvd.SetOptions{Retention: cfg.KVD.Retention},
		timeout:      cfg.KVD.Timeout,
		blockBytes:   cfg.KVD.BlockBytes,
		writeThrough: cfg.KVD.WriteThrough,
		log:          log.With().Str("component", "sim_kvd").Str("socket", cfg.KVD.Socket).Logger(),
		wq:           make(chan []uint64, kvdWriteQueue),
		spare:        make(chan []uint64, kvdWriteQueue+1),
		stop:         make(chan struct{}),
	}
}

// start runs the writer.
func (t *kvdTier) start() {
	t.wg.Add(1)
	go t.writer()
}

// close stops the writer and drops the connections; the scheduler must
// have stopped.
func (t *kvdTier) close() {
	t.once.Do(func() {
		close(t.stop)
		t.wg.Wait()
		if t.get != nil {
			_ = t.get.Close()
			t.get = nil
		}
	})
}

func (t *kvdTier) dial() (*kvd.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
	defer cancel()
	return kvd.Dial(ctx, t.socket, kvd.ClientOptions{ClientID: "infera-sim", SharedArena: true, Timeout: t.timeout})
}

// fetch loads the blocks of hashes from kvd, in order, and returns how
// many leading ones it got. A request that fails on a connection used
// before (the daemon restarted since) is tried once more on a new one.
// Scheduler goroutine.
func (t *kvdTier) fetch(hashes []uint64) int {
	if len(hashes) == 0 {
		return 0
	}
	t.keyBuf = t.keyBuf[:0]
	for _, h := range hashes {
		t.keyBuf = binary.BigEndian.AppendUint64(t.keyBuf, h)
	}
	t.keys = t.keys[:0]
	for i := range hashes {
		t.keys = append(t.keys, t.keyBuf[i*8:i*8+8])
	}
	for {
		reused := t.get != nil
		if !reused {
			if time.Now().Before(t.getDown) {
				return 0
			}
			cl, err := t.dial()
			if err != nil {
				t.fail("kvd get connection", err)
				return 0
			}
			t.get = cl
		}
		err := t.get.BatchGetInto(t.ns, t.keys, &t.res)
		if err == nil {
			break
		}
		_ = t.get.Close()
		t.get = nil
		if !reused {
			t.fail("kvd batch_get", err)
			return 0
		}
	}
	n := 0
	for n < len(hashes) && t.res.Found[n] && len(t.res.Values[n]) == t.blockBytes &&
		binary.BigEndian.Uint64(t.res.Values[n]) == hashes[n] {
		n++
	}
	t.hitBlocks.Add(uint64(n))
	t.missBlocks.Add(uint64(len(hashes) - n))
	return n
}

func (t *kvdTier) fail(what string, err error) {
	t.errs.Add(1)
	t.getDown = time.Now().Add(kvdRedial)
	t.log.Warn().Err(err).Float64("retry_in_seconds", kvdRedial.Seconds()).Msg(what + " failed, recomputing")
}

// The eviction observer (cacheObserver), on the scheduler goroutine: a
// block goes to the writer when evicted, or with --kvd-write-through when
// cached (t.evicted holds either).
func (t *kvdTier) blockStored(hash, _ uint64, _ []uint32) {
	if t.writeThrough {
		t.evicted = append(t.evicted, hash)
	}
}

func (t *kvdTier) blockRemoved(hash uint64) {
	if !t.writeThrough {
		t.evicted = append(t.evicted, hash)
	}
}

func (t *kvdTier) allCleared() {}

// flush hands the round's evictions to the writer; a full queue drops
// them (counted). Scheduler goroutine.
func (t *kvdTier) flush() {
	if len(t.evicted) == 0 {
		return
	}
	select {
	case t.wq <- t.evicted:
		select {
		case b := <-t.spare:
			t.evicted = b[:0]
		default:
			t.evicted = nil
		}
	default:
		t.dropped.Add(uint64(len(t.evicted)))
		t.evicted = t.evicted[:0]
	}
}

// writer stores evicted blocks in kvd.
func (t *kvdTier) writer() {
	defer t.wg.Done()
	var (
		cl     *kvd.Client
		down   time.Time
		keys   [][]byte
		values [][]byte
		buf    []byte
		res    kvd.BatchSetResult
	)
	defer func() {
		if cl != nil {
			_ = cl.Close()
		}
	}()
	for {
		var batch []uint64
		select {
		case <-t.stop:
			return
		case batch = <-t.wq:
		}
		fresh := false
		if cl == nil && time.Now().After(down) {
			var err error
			fresh = true
			if cl, err = t.dial(); err != nil {
				cl = nil
				down = time.Now().Add(kvdRedial)
				t.errs.Add(1)
				t.log.Warn().Err(err).Msg("kvd set connection failed, evicted blocks dropped")
			}
		}
		if cl == nil {
			t.dropped.Add(uint64(len(batch)))
			t.recycle(batch)
			continue
		}
		n := len(batch)
		if need := n * (8 + t.blockBytes); cap(buf) < need {
			buf = make([]byte, need)
		}
		buf = buf[:n*(8+t.blockBytes)]
		keys, values = keys[:0], values[:0]
		for i, h := range batch {
			k := buf[i*8 : i*8+8]
			binary.BigEndian.PutUint64(k, h)
			keys = append(keys, k)
			v := buf[n*8+i*t.blockBytes : n*8+(i+1)*t.blockBytes]
			// The value names its block; the rest is filler.
			binary.BigEndian.PutUint64(v, h)
			values = append(values, v)
		}
		err := t.store(cl, keys, values, &res)
		if err != nil && !fresh {
			// A connection used before: the daemon may have restarted
			// since. Once more on a new one.
			_ = cl.Close()
			if cl, err = t.dial(); err == nil {
				err = t.store(cl, keys, values, &res)
			} else {
				cl = nil
			}
		}
		if err != nil {
			if cl != nil {
				_ = cl.Close()
			}
			cl = nil
			down = time.Now().Add(kvdRedial)
			t.errs.Add(1)
			t.dropped.Add(uint64(n))
			t.log.Warn().Err(err).Int("blocks", n).Msg("kvd batch_set failed, evicted blocks dropped")
		} else {
			ok := 0
			for _, a := range res.Accepted {
				if a {
					ok++
				}
			}
			t.stored.Add(uint64(ok))
			t.dropped.Add(uint64(n - ok))
		}
		t.recycle(batch)
	}
}

func (t *kvdTier) store(cl *kvd.Client, keys, values [][]byte, res *kvd.BatchSetResult) error {
	if cl.HasArena() {
		return cl.BatchSetZeroCopy(t.ns, keys, values, t.set, res)
	}
	var err error
	res.Accepted, _, err = cl.BatchSet(t.ns, keys, values, t.set)
	return err
}

func (t *kvdTier) recycle(b []uint64) {
	select {
	case t.spare <- b[:0]:
	default:
	}
}

// appendKVDMetrics adds the tier's counters to /metrics.
func (s *Server) appendKVDMetrics(b []byte) []byte {
	t := s.kvd
	if t == nil {
		return b
	}
	b = s.appendMetric(b, "infera_sim_kvd_hit_blocks_total", "counter",
		"Prompt blocks the GPU cache missed and kvd supplied (loaded instead of recomputed).", float64(t.hitBlocks.Load()))
	b = s.appendMetric(b, "infera_sim_kvd_miss_blocks_total", "counter",
		"Prompt blocks the GPU cache missed and kvd did not have.", float64(t.missBlocks.Load()))
	b = s.appendMetric(b, "infera_sim_kvd_stored_blocks_total", "counter",
		"Blocks evicted from the GPU cache and stored in kvd.", float64(t.stored.Load()))
	b = s.appendMetric(b, "infera_sim_kvd_dropped_blocks_total", "counter",
		"Evicted blocks not stored in kvd (queue full, refused, kvd down).", float64(t.dropped.Load()))
	b = s.appendMetric(b, "infera_sim_kvd_errors_total", "counter",
		"Failed kvd connections and requests.", float64(t.errs.Load()))
	return b
}

// kvdMatch returns how many prompt blocks after the GPU cache's matched
// ones kvd supplies (at most up to maxMatch). kvd is asked once per
// sequence, when it is first matched; a sequence that waits for room and
// then matches fewer GPU blocks than then recomputes the difference.
func (sc *scheduler) kvdMatch(q *seq, matched, maxMatch int) int {
	if sc.kvd == nil || q.remote {
		return 0
	}
	if !q.kvdChecked {
		q.kvdChecked = true
		q.kvdFrom = matched
		q.kvdUpTo = matched
		if matched < maxMatch {
			q.kvdUpTo += sc.kvd.fetch(q.hashes[matched:maxMatch])
		}
	}
	if matched < q.kvdFrom {
		return 0
	}
	return max(0, q.kvdUpTo-matched)
}

// load is the modelled time of loading blocks from kvd.
func (t timing) load(blocks int) time.Duration {
	return time.Duration(min(float64(blocks)*t.perKVDBlock, float64(time.Hour)))
}

// appendModelMetrics adds the timing model's own view: prompt tokens
// actually computed, and the modelled time to first token (model clock,
// without --time-scale), which wall-clock noise does not touch.
func (s *Server) appendModelMetrics(b []byte) []byte {
	p := &s.sched.pub
	b = s.appendMetric(b, "infera_sim_prefill_computed_tokens_total", "counter",
		"Prompt tokens computed by prefill (neither GPU cache hits nor loaded from kvd).", float64(p.prefilled.Load()))
	ttft := 0.0
	if sc := s.sched.timing.scale; sc > 0 {
		ttft = float64(p.ttftNs.Load()) / 1e9 / sc
	}
	b = s.appendMetric(b, "infera_sim_model_ttft_seconds_total", "counter",
		"Modelled time from submission to first token (simulated steps, before --time-scale), summed over requests.", ttft)
	b = s.appendMetric(b, "infera_sim_first_tokens_total", "counter",
		"Requests that got their first token (the count of infera_sim_model_ttft_seconds_total).", float64(p.firsts.Load()))
	return b
}
