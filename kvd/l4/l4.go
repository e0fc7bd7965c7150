package l4

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/kvd"
)

// Sentinel errors.
var (
	// ErrNotFound: neither the tier below nor the remote store holds the
	// key (an unreachable store and a failed checksum also read as not
	// found).
	ErrNotFound = errors.New("l4: not found")
	// ErrConfig: invalid Options.
	ErrConfig = errors.New("l4: invalid options")
	// ErrRemoteMiss is what a Remote's Get returns for an absent key.
	ErrRemoteMiss = errors.New("l4: remote miss")
)

// Op is one queued write to the remote store: Val nil deletes Key.
type Op struct {
	Key string
	Val []byte
}

// Remote is the shared store a Tier writes behind and reads through:
// Redis/Valkey (redis.go) or Mooncake Store (mooncake.go).
type Remote interface {
	// Name is the store's name in logs ("redis", "mooncake").
	Name() string
	// Ping answers nil while the store is reachable.
	Ping(ctx context.Context) error
	// Write applies a batch of writes and deletes (with the tier's TTL
	// where the store has TTLs).
	Write(ctx context.Context, batch []Op, ttl time.Duration) error
	// Get returns the value under key, or ErrRemoteMiss.
	Get(ctx context.Context, key string) ([]byte, error)
	// Exists reports whether key is stored.
	Exists(ctx context.Context, key string) (bool, error)
	// Outage reports whether err means the store is unreachable (rather
	// than a miss or a refused command).
	Outage(err error) bool
	Close() error
}

// Options configure a Tier.
type Options struct {
	// URLs are redis:// or rediss:// URLs (user:password@, /db); one is a
	// standalone server, several are one cluster's seed nodes.
	URLs []string
	// Prefix starts every Redis key.
	Prefix string
	// TTL of the entries written (0 = none).
	TTL time.Duration
	// Queue bounds pending write-behinds; Batch is the most commands in
	// one pipeline.
	Queue int
	Batch int
	// Timeout bounds one read on a miss below (and the health probe).
	Timeout time.Duration
	// MaxValueBytes: larger values are not written to the remote store
	// (0 = no limit).
	MaxValueBytes int64
	// Below is the optional L3 tier (nil: L4 sits right below RAM);
	// BelowNotFound is its miss error.
	Below         kvd.LongStore
	BelowNotFound error
	Log           zerolog.Logger
}

// Stats are the tier's counters.
type Stats struct {
	Up                                         bool
	Writes, WritesDropped, WriteErrors         int64
	Hits, Misses, ChecksumFailures, Promotions int64
	Outages                                    int64
}

// Tier is the L4 tier over a Remote; it implements kvd.LongStore.
type Tier struct {
	opt    Options
	remote Remote
	log    zerolog.Logger
	q      chan Op
	promQ  chan [2][]byte
	stop   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool

	up                                        atomic.Bool
	writes, dropped, writeErrs                atomic.Int64
	hits, misses, badSums, promotions, outage atomic.Int64
}

// magic starts every value kvd writes to Redis; a CRC-32C of the payload
// follows it.
const (
	magic      = "IKV1"
	headerSize = len(magic) + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Open connects to Redis (Options.URLs; an unreachable Redis is an
// outage, not an error: the tier starts down and recovers when Redis
// answers).
func Open(opt Options) (*Tier, error) {
	r, err := openRedis(opt.URLs)
	if err != nil {
		return nil, err
	}
	return OpenRemote(opt, r)
}

// OpenRemote starts a tier over remote, which it owns from then on (Close
// closes it).
func OpenRemote(opt Options, remote Remote) (*Tier, error) {
	if opt.Queue <= 0 {
		opt.Queue = 4096
	}
	if opt.Batch <= 0 {
		opt.Batch = 64
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 50 * time.Millisecond
	}
	t := &Tier{opt: opt, remote: remote, log: opt.Log, q: make(chan Op, opt.Queue), promQ: make(chan [2][]byte, 256), stop: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := remote.Ping(ctx)
	cancel()
	t.up.Store(true)
	if err != nil {
		t.markDown(err)
	} else {
		t.log.Info().Str("remote", remote.Name()).Msg("l4 " + remote.Name() + " reachable")
	}
	t.wg.Add(3)
	go t.writer()
	go t.promoter()
	go t.prober()
	return t, nil
}

// redisKey is prefix + model + ":" + compat_key + ":" + hex(key), with
// ':' and '%' in the names percent-escaped so namespaces cannot collide.
func (t *Tier) redisKey(composite []byte) (string, bool) {
	model, compat, key, ok := kvd.SplitComposite(composite)
	if !ok {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(t.opt.Prefix) + len(model) + len(compat) + 2*len(key) + 2)
	b.WriteString(t.opt.Prefix)
	escape(&b, model)
	b.WriteByte(':')
	escape(&b, compat)
	b.WriteByte(':')
	b.WriteString(hex.EncodeToString(key))
	return b.String(), true
}

func escape(b *strings.Builder, s []byte) {
	const digits = "0123456789ABCDEF"
	for _, c := range s {
		if c == ':' || c == '%' {
			b.WriteByte('%')
			b.WriteByte(digits[c>>4])
			b.WriteByte(digits[c&15])
			continue
		}
		b.WriteByte(c)
	}
}

// RedisKey is the Redis key a kvd entry is stored under (tests, tools).
func (t *Tier) RedisKey(model, compat, key []byte) string {
	k, _ := t.redisKey(kvd.Composite(nil, model, compat, key))
	return k
}

func frame(value []byte) []byte {
	b := make([]byte, headerSize+len(value))
	copy(b, magic)
	binary.LittleEndian.PutUint32(b[len(magic):], crc32.Checksum(value, castagnoli))
	copy(b[headerSize:], value)
	return b
}

// unframe checks a value read from Redis; ok is false for a foreign or
// corrupted value.
func unframe(b []byte) ([]byte, bool) {
	if len(b) < headerSize || string(b[:len(magic)]) != magic {
		return nil, false
	}
	p := b[headerSize:]
	return p, binary.LittleEndian.Uint32(b[len(magic):]) == crc32.Checksum(p, castagnoli)
}

func (t *Tier) markDown(err error) {
	if t.up.CompareAndSwap(true, false) {
		t.outage.Add(1)
		t.log.Warn().Err(err).Str("remote", t.remote.Name()).Msg("l4 " + t.remote.Name() + " unreachable: serving from L2/L3, dropping L4 writes until it answers")
	}
}

// prober pings a down store until it answers.
func (t *Tier) prober() {
	defer t.wg.Done()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		if t.up.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(t.opt.Timeout, 200*time.Millisecond))
		err := t.remote.Ping(ctx)
		cancel()
		if err == nil && t.up.CompareAndSwap(false, true) {
			t.log.Info().Str("remote", t.remote.Name()).Msg("l4 " + t.remote.Name() + " reachable again")
		}
	}
}

// enqueue never blocks: a full queue or a down store drops the write.
func (t *Tier) enqueue(o Op) {
	if t.closed.Load() || !t.up.Load() {
		t.dropped.Add(1)
		return
	}
	select {
	case t.q <- o:
	default:
		t.dropped.Add(1)
	}
}

// writer pipelines queued writes and deletes in batches.
func (t *Tier) writer() {
	defer t.wg.Done()
	batch := make([]Op, 0, t.opt.Batch)
	for {
		var o Op
		select {
		case o = <-t.q:
		case <-t.stop:
			// Drain what is queued, then stop.
			for {
				select {
				case o = <-t.q:
					batch = append(batch, o)
					if len(batch) == cap(batch) {
						t.flush(batch)
						batch = batch[:0]
					}
				default:
					t.flush(batch)
					return
				}
			}
		}
		batch = append(batch[:0], o)
	fill:
		for len(batch) < cap(batch) {
			select {
			case o = <-t.q:
				batch = append(batch, o)
			default:
				break fill
			}
		}
		t.flush(batch)
		clear(batch)
	}
}

func (t *Tier) flush(batch []Op) {
	if len(batch) == 0 {
		return
	}
	if !t.up.Load() {
		t.dropped.Add(int64(len(batch)))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.remote.Write(ctx, batch, t.opt.TTL); err != nil {
		t.writeErrs.Add(int64(len(batch)))
		if t.remote.Outage(err) {
			t.markDown(err)
		}
		return
	}
	t.writes.Add(int64(len(batch)))
}

// promoter copies L4 hits into the tier below, off the read path.
func (t *Tier) promoter() {
	defer t.wg.Done()
	for {
		select {
		case <-t.stop:
			return
		case kv := <-t.promQ:
			if err := t.opt.Below.Put(kv[0], kv[1]); err == nil {
				t.promotions.Add(1)
			}
		}
	}
}

// Put writes to the tier below (synchronously, as the store expects of
// L3) and queues the write to Redis.
func (t *Tier) Put(key, value []byte) error {
	if t.opt.Below != nil {
		if err := t.opt.Below.Put(key, value); err != nil {
			return err
		}
	}
	rk, ok := t.redisKey(key)
	if !ok || (t.opt.MaxValueBytes > 0 && int64(len(value)) > t.opt.MaxValueBytes) {
		return nil
	}
	t.enqueue(Op{Key: rk, Val: frame(value)})
	return nil
}

// Get reads the tier below, then Redis within Options.Timeout; a Redis
// hit with a good checksum is queued for promotion below and returned.
func (t *Tier) Get(key, dst []byte) ([]byte, error) {
	if t.opt.Below != nil {
		v, err := t.opt.Below.Get(key, dst)
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, t.opt.BelowNotFound) {
			t.log.Debug().Err(err).Msg("l3 read failed; trying l4")
		}
		dst = v
	}
	rk, ok := t.redisKey(key)
	if !ok || !t.up.Load() {
		t.misses.Add(1)
		return dst, ErrNotFound
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.opt.Timeout)
	b, err := t.remote.Get(ctx, rk)
	cancel()
	if err != nil {
		if !errors.Is(err, ErrRemoteMiss) && t.remote.Outage(err) && !errors.Is(err, context.DeadlineExceeded) {
			t.markDown(err)
		}
		t.misses.Add(1)
		return dst, ErrNotFound
	}
	p, ok := unframe(b)
	if !ok {
		t.badSums.Add(1)
		t.misses.Add(1)
		t.enqueue(Op{Key: rk}) // a corrupt copy is deleted
		return dst, ErrNotFound
	}
	t.hits.Add(1)
	if t.opt.Below != nil {
		select {
		case t.promQ <- [2][]byte{append([]byte(nil), key...), p}:
		default:
		}
	}
	return append(dst[:0], p...), nil
}

// Exists asks the tier below, then Redis (without promoting).
func (t *Tier) Exists(key []byte) bool {
	if t.opt.Below != nil && t.opt.Below.Exists(key) {
		return true
	}
	rk, ok := t.redisKey(key)
	if !ok || !t.up.Load() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.opt.Timeout)
	ok, err := t.remote.Exists(ctx, rk)
	cancel()
	if err != nil && t.remote.Outage(err) && !errors.Is(err, context.DeadlineExceeded) {
		t.markDown(err)
	}
	return err == nil && ok
}

// Delete removes the key below and queues its deletion in Redis.
func (t *Tier) Delete(key []byte) error {
	var err error
	if t.opt.Below != nil {
		err = t.opt.Below.Delete(key)
	}
	if rk, ok := t.redisKey(key); ok {
		t.enqueue(Op{Key: rk})
	}
	return err
}

// Clear clears the tier below only: Redis is shared with other hosts,
// whose entries are not this daemon's to drop (TTLs age them out).
func (t *Tier) Clear() error {
	if t.opt.Below != nil {
		return t.opt.Below.Clear()
	}
	return nil
}

// Len and UsedBytes describe the tier below (Redis is shared).
func (t *Tier) Len() int {
	if t.opt.Below != nil {
		return t.opt.Below.Len()
	}
	return 0
}

// UsedBytes: see Len.
func (t *Tier) UsedBytes() int64 {
	if t.opt.Below != nil {
		return t.opt.Below.UsedBytes()
	}
	return 0
}

// Close writes what is queued (while Redis answers), stops the workers
// and closes the client; the tier below is its owner's to close.
func (t *Tier) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	close(t.stop)
	t.wg.Wait()
	return t.remote.Close()
}

// Stats returns the counters.
func (t *Tier) Stats() Stats {
	return Stats{Up: t.up.Load(), Writes: t.writes.Load(), WritesDropped: t.dropped.Load(), WriteErrors: t.writeErrs.Load(),
		Hits: t.hits.Load(), Misses: t.misses.Load(), ChecksumFailures: t.badSums.Load(), Promotions: t.promotions.Load(), Outages: t.outage.Load()}
}

// Up reports whether the store answered last time it was asked.
func (t *Tier) Up() bool { return t.up.Load() }
