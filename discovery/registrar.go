package discovery

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/infera/infera/internal/logpace"
)

// ErrRevoked is returned by Register after Revoke: a deregistered worker
// must not come back under the same registrar.
var ErrRevoked = errors.New("registration revoked")

// Registrar defaults (DESIGN §4).
const (
	DefaultLeaseTTL          = 10 * time.Second
	DefaultKeepAliveInterval = 3 * time.Second
)

// RegistrarOptions tunes the lease. Zero values take the defaults.
type RegistrarOptions struct {
	// TTL of the lease, rounded up to whole seconds (etcd's unit); it is how
	// long a dead host's record stays visible. Default 10s.
	TTL time.Duration
	// KeepAliveInterval between keepalives; kept below TTL/2 so that one
	// lost keepalive does not expire the lease. Default 3s.
	KeepAliveInterval time.Duration
}

type leaseState int

const (
	leaseOK          leaseState = iota
	leaseUnreachable            // keepalives fail; the lease may still be alive
	leaseLost                   // the lease is gone or presumed gone; must re-register
)

// Registrar keeps one worker record in etcd under a lease. Register writes
// it, Run keeps the lease alive and re-registers after the lease is lost,
// SetStatus rewrites it, Revoke removes it at once. All methods may be called
// concurrently with Run. The same lease logic keeps a kvd's record
// (KVDRegistrar).
type Registrar struct {
	cli        *clientv3.Client
	key        string
	what       string // "worker record" or "kvd record", for logs
	ttl        time.Duration
	ttlSeconds int64
	interval   time.Duration
	rpcTimeout time.Duration
	// tryTimeout bounds the first try of each etcd call (see try).
	tryTimeout time.Duration
	log        zerolog.Logger
	stalls     stallLog

	mu  sync.Mutex
	rec Record
	// encode returns the value to write; called with mu held. For a
	// worker it encodes rec, whose status SetStatus changes.
	encode  func() ([]byte, error)
	lease   clientv3.LeaseID // 0: none granted yet
	stale   bool             // lease lost or presumed lost: grant a new one
	needPut bool             // the record under lease is not (known to be) current
	revoked bool
	lastOK  time.Time // last time etcd confirmed the lease
	state   leaseState

	revokedCh chan struct{} // closed by Revoke so that Run ends at once
}

// NewRegistrar returns a registrar for rec under prefix+rec.WorkerID. The
// record is validated by Register.
func NewRegistrar(cli *clientv3.Client, prefix string, rec Record, opts RegistrarOptions, log zerolog.Logger) *Registrar {
	r := newRegistrar(cli, prefix+rec.WorkerID, "worker record", opts, log.With().Str("component", "discovery_registrar").Str("worker_id", rec.WorkerID).Logger())
	r.rec = rec
	r.encode = func() ([]byte, error) { return r.rec.Encode() }
	return r
}

// newRegistrar holds the lease logic both records share; the caller sets
// encode (and rec for a worker).
func newRegistrar(cli *clientv3.Client, key, what string, opts RegistrarOptions, log zerolog.Logger) *Registrar {
	ttl := opts.TTL
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	secs := int64(math.Ceil(ttl.Seconds()))
	ttl = time.Duration(secs) * time.Second
	interval := opts.KeepAliveInterval
	if interval <= 0 {
		interval = DefaultKeepAliveInterval
	}
	if interval > ttl/2 {
		interval = ttl / 3
	}
	return &Registrar{
		cli:        cli,
		key:        key,
		what:       what,
		ttl:        ttl,
		ttlSeconds: secs,
		interval:   interval,
		// A keepalive that has not answered within one interval is treated
		// as failed so that retries start while the lease still has time.
		rpcTimeout: max(interval, 500*time.Millisecond),
		tryTimeout: tryTimeoutFor(ttl),
		log:        log,
		revokedCh:  make(chan struct{}),
	}
}

// Register writes the record under a fresh lease. Call it once the engine is
// ready. It is bounded by the TTL, and each etcd call in it by a short try
// that is repeated on another member when the one it went to does not
// answer (see try); if Register fails, Run keeps trying.
func (r *Registrar) Register(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.revoked {
		return ErrRevoked
	}
	if _, err := r.encode(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.ttl)
	defer cancel()
	if err := r.registerLocked(ctx); err != nil {
		return fmt.Errorf("register %s: %w", r.key, err)
	}
	r.log.Debug().Int64("lease_id", int64(r.lease)).Dur("ttl", r.ttl).Msg(r.what + " written")
	return nil
}

// Run keeps the lease alive with one KeepAliveOnce every interval. When the
// lease is gone (expired, revoked by someone else) or etcd was unreachable
// for longer than the TTL, it grants a new lease and writes the record again;
// while etcd is down it retries with backoff. State changes are logged once.
// Run returns nil when ctx is done (it does not revoke) or after Revoke.
// If Register was not called or failed, Run registers. Call it once.
func (r *Registrar) Run(ctx context.Context) error {
	bo := backoff{min: 200 * time.Millisecond, max: r.interval}
	timer := time.NewTimer(r.firstDelay())
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.revokedCh:
			return nil
		case <-timer.C:
		}
		next, done := r.step(ctx, &bo)
		if done {
			return nil
		}
		timer.Reset(next)
	}
}

func (r *Registrar) firstDelay() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lease == 0 || r.stale || r.needPut {
		return 0
	}
	return r.interval
}

// step does one keepalive or one repair and returns the delay before the next.
func (r *Registrar) step(ctx context.Context, bo *backoff) (time.Duration, bool) {
	r.mu.Lock()
	if r.revoked {
		r.mu.Unlock()
		return 0, true
	}
	if r.lease == 0 || r.stale || r.needPut {
		// Repairs hold the lock so that SetStatus and Revoke see either the
		// old lease or the new one with the record written, never a mix.
		defer r.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, r.rpcTimeout)
		err := r.repairLocked(rctx)
		cancel()
		if err != nil {
			switch {
			case ctx.Err() != nil:
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				r.markLostLocked("lease not found")
			default:
				r.failedLocked(err)
			}
			return bo.next(), false
		}
		bo.reset()
		return r.interval, false
	}
	id := r.lease
	r.mu.Unlock()

	// The keepalive itself runs unlocked: SetStatus must not wait behind a
	// keepalive to an unreachable etcd.
	kctx, cancel := context.WithTimeout(ctx, r.rpcTimeout)
	err := r.try(kctx, "lease keepalive", func(ctx context.Context) error {
		_, err := r.cli.KeepAliveOnce(ctx, id)
		return err
	})
	cancel()

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.revoked || r.lease != id {
		// Revoke or a re-registration happened meanwhile; look again.
		return 0, r.revoked
	}
	switch {
	case err == nil:
		r.lastOK = time.Now()
		if r.state != leaseOK {
			r.log.Info().Int64("lease_id", int64(id)).Msg("etcd reachable again, lease kept")
			r.state = leaseOK
		}
		bo.reset()
		return r.interval, false
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		r.markLostLocked("lease not found")
		return 0, false
	case ctx.Err() != nil:
		return 0, false
	default:
		r.failedLocked(err)
		return bo.next(), false
	}
}

// failedLocked records a failed etcd call: the first failure of a streak is
// logged, and once etcd has not confirmed the lease for a whole TTL the lease
// is presumed lost (other members may well have expired it; a new lease and
// a fresh put are right either way).
func (r *Registrar) failedLocked(err error) {
	if r.stale {
		return
	}
	if r.lease != 0 && time.Since(r.lastOK) > r.ttl {
		r.markLostLocked("etcd unreachable for longer than the lease TTL")
		return
	}
	if r.state == leaseOK {
		r.log.Warn().Err(err).Int64("lease_id", int64(r.lease)).Msg("etcd unreachable, retrying")
		r.state = leaseUnreachable
	}
}

func (r *Registrar) markLostLocked(reason string) {
	r.stale = true
	if r.state != leaseLost {
		r.log.Warn().Int64("lease_id", int64(r.lease)).Str("reason", reason).Msg("etcd lease lost, re-registering")
		r.state = leaseLost
	}
}

// repairLocked brings etcd back to "record current under a live lease".
func (r *Registrar) repairLocked(ctx context.Context) error {
	if r.lease != 0 && !r.stale {
		// Only the put is missing (e.g. SetStatus failed while etcd was away).
		if err := r.putLocked(ctx); err != nil {
			return err
		}
	} else if err := r.registerLocked(ctx); err != nil {
		return err
	}
	if r.state != leaseOK {
		r.log.Info().Int64("lease_id", int64(r.lease)).Msg(r.what + " re-registered")
		r.state = leaseOK
	}
	return nil
}

// registerLocked grants a new lease and writes the record under it. The old
// lease, if any, is revoked only after the record moved to the new one, so
// the record never disappears on the way.
func (r *Registrar) registerLocked(ctx context.Context) error {
	old := r.lease
	// A try that timed out may still have granted a lease on a slow
	// member; unused, it expires after one TTL.
	var g *clientv3.LeaseGrantResponse
	err := r.try(ctx, "lease grant", func(ctx context.Context) (err error) {
		g, err = r.cli.Grant(ctx, r.ttlSeconds)
		return err
	})
	if err != nil {
		return fmt.Errorf("grant lease: %w", err)
	}
	r.lease = clientv3.LeaseID(g.ID)
	r.stale = false
	r.needPut = true
	r.lastOK = time.Now()
	if err := r.putLocked(ctx); err != nil {
		return err
	}
	if old != 0 && old != r.lease {
		// Best effort: a lease that still exists would only expire later.
		_ = r.try(ctx, "lease revoke", func(ctx context.Context) error {
			_, err := r.cli.Revoke(ctx, old)
			return err
		})
	}
	return nil
}

func (r *Registrar) putLocked(ctx context.Context) error {
	value, err := r.encode()
	if err != nil {
		return err
	}
	r.needPut = true
	err = r.try(ctx, "put", func(ctx context.Context) error {
		_, err := r.cli.Put(ctx, r.key, string(value), clientv3.WithLease(r.lease))
		return err
	})
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			r.stale = true
		}
		return fmt.Errorf("put %s: %w", r.key, err)
	}
	r.needPut = false
	r.lastOK = time.Now()
	return nil
}

// SetStatus rewrites the record with a new status under the current lease.
// If etcd cannot take it now, the status is kept and Run writes it once etcd
// is back (the error is still returned so the caller can log it).
func (r *Registrar) SetStatus(ctx context.Context, st Status) error {
	if st != StatusActive && st != StatusDraining {
		return fmt.Errorf("%w: status %q: want active or draining", ErrInvalidRecord, clip(string(st)))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rec.Status = st
	if r.revoked || r.lease == 0 || r.stale {
		// Nothing live to rewrite; a (re-)registration will carry st.
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.ttl)
	defer cancel()
	if err := r.putLocked(ctx); err != nil {
		return fmt.Errorf("set status %s: %w", st, err)
	}
	return nil
}

// Revoke revokes the lease, which deletes the record at once, and stops Run
// from registering again.
func (r *Registrar) Revoke(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.revoked {
		r.revoked = true
		close(r.revokedCh)
	}
	id := r.lease
	r.lease = 0
	if id == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.ttl)
	defer cancel()
	err := r.try(ctx, "lease revoke", func(ctx context.Context) error {
		_, err := r.cli.Revoke(ctx, id)
		return err
	})
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke lease %x of %s: %w", int64(id), r.key, err)
	}
	return nil
}

// Bounds of a registrar's first try of an etcd call: a tenth of the TTL,
// at least minTry (an answer from a loaded etcd takes hundreds of ms) and
// at most maxTry (a stopped member costs no more than that).
const (
	minTry = 500 * time.Millisecond
	maxTry = 2 * time.Second
)

func tryTimeoutFor(ttl time.Duration) time.Duration { return min(max(ttl/10, minTry), maxTry) }

// try runs one etcd call (op: grant, put, keepalive, revoke; each is
// repeatable: a repeated grant at worst leaves an unused lease to expire)
// under ctx, each try bounded by tryTimeout and then twice the last. A
// member that stops answering without closing its connection (a stopped
// process, a hung host, a dead link) holds a call sent to it until gRPC
// keepalive gives the connection up (~15 s), while the client's round
// robin sends the next call to the next member: so a try that times out
// is repeated at once, and lands elsewhere. The growing bound keeps a
// slow but live etcd answering: only the first tries are short. Other
// errors are returned as they are (the client retries the ones that
// allow it).
func (r *Registrar) try(ctx context.Context, op string, call func(context.Context) error) error {
	bound := r.tryTimeout
	for {
		tctx, cancel := context.WithTimeout(ctx, bound)
		tctx, member := withMemberNote(tctx)
		err := call(tctx)
		timedOut := err != nil && tctx.Err() != nil
		cancel()
		if !timedOut || ctx.Err() != nil {
			return err
		}
		r.stalls.note(r.log, op, memberOf(member), bound, err)
		bound *= 2
	}
}

// stallLogEvery is how often a registrar logs an etcd call that timed out
// on a member; the ones between are counted in the next line.
const stallLogEvery = 30 * time.Second

// stallLog rate-limits the warning that names a member that did not answer
// (a stopped member gets a third of the calls until gRPC drops it).
type stallLog struct{ pace logpace.Pacer }

func (s *stallLog) note(log zerolog.Logger, op, member string, bound time.Duration, err error) {
	if member == "" {
		// The call reached no member: etcd is unreachable as a whole,
		// which the registrar's own state logs report.
		return
	}
	ok, n := s.pace.Allow(stallLogEvery)
	if !ok {
		return
	}
	log.Warn().Err(err).Str("etcd_member", member).Str("op", op).Float64("timeout_seconds", bound.Seconds()).
		Int64("not_logged_since_last", n).Msg("etcd member did not answer in time, retrying on another")
}

// Record returns the record as last written or to be written.
func (r *Registrar) Record() Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec
}

// KVDRegistrar keeps one kvd's record in etcd under a lease, with the
// worker registrar's lease logic (keepalive, re-registration after a lost
// lease, backoff while etcd is away). The record does not change while
// registered.
type KVDRegistrar struct{ r *Registrar }

// NewKVDRegistrar returns a registrar for rec under prefix+rec.Peer. The
// record is validated by Register.
func NewKVDRegistrar(cli *clientv3.Client, prefix string, rec KVDRecord, opts RegistrarOptions, log zerolog.Logger) *KVDRegistrar {
	r := newRegistrar(cli, prefix+bracketHostPort(rec.Peer), "kvd record", opts,
		log.With().Str("component", "discovery_registrar").Str("kvd_peer", rec.Peer).Logger())
	r.encode = rec.Encode
	return &KVDRegistrar{r: r}
}

// Register writes the record under a fresh lease (see Registrar.Register).
func (k *KVDRegistrar) Register(ctx context.Context) error { return k.r.Register(ctx) }

// Run keeps the lease alive until ctx ends or Revoke (see Registrar.Run).
func (k *KVDRegistrar) Run(ctx context.Context) error { return k.r.Run(ctx) }

// Revoke removes the record at once and stops Run.
func (k *KVDRegistrar) Revoke(ctx context.Context) error { return k.r.Revoke(ctx) }
