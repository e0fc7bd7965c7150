package discovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// listTimeout bounds one list of the prefix, so that an unreachable etcd
	// shows up as a logged failure and a retry rather than a silent hang.
	listTimeout = 10 * time.Second
	// stableWatch is how long a watch must have run for the next failure to
	// be treated as isolated (backoff restarts from its minimum).
	stableWatch = 30 * time.Second
	// defaultProbeInterval paces the liveness probe that runs beside a
	// watch: a watch on a dead etcd just waits (the client reconnects
	// quietly), so without a probe an outage would go unnoticed and unlogged.
	defaultProbeInterval = 2 * time.Second
	// probeFailures is how many failed probes in a row end a session as
	// an outage (see probe).
	probeFailures = 2
	// defaultStallInterval paces the watchdog of a session's own watch
	// stream (see watchdog): a stream that answers nothing for one to two
	// intervals is given up and the watch resumed on another member.
	defaultStallInterval = time.Second
)

var (
	errWatchClosed   = errors.New("watch channel closed")
	errWatchCanceled = errors.New("watch canceled by server")
	// errWatchStalled: the member that holds the watch stopped answering
	// on it (see watchdog); not an outage, the other members may be fine.
	errWatchStalled    = errors.New("etcd watch stream stalled")
	errEtcdUnreachable = errors.New("etcd unreachable")
	// errStoreReset: the watch reached an etcd whose store is behind the
	// revision the view reflects, or another cluster: its history is not
	// the one the view was built from, so only a re-list is exact.
	errStoreReset = errors.New("etcd store reset")
)

// watcherHooks let tests act at the points where the watcher's correctness
// matters (between list and watch, before a re-list, before a watch
// resumes). Nil in production.
type watcherHooks struct {
	beforeList   func(n int)            // n counts lists from 1
	afterList    func(n int, rev int64) // runs before the watch from rev+1 starts
	beforeResume func(rev int64)        // runs before a watch resumes from rev+1 without a list
}

// registryView is what a watchLoop keeps current: the worker fleet
// (Watcher) or the kvd registry (KVDWatcher). Its methods run on the
// loop's Run goroutine.
type registryView interface {
	// rebuild replaces the view with the listed keys (n counts lists from 1).
	rebuild(kvs []*mvccpb.KeyValue, rev int64, n int)
	// apply applies one watch response.
	apply(events []*clientv3.Event, rev int64)
	// nextExpiry and expireHeld drive held removals (Watcher.SetOutageGrace).
	nextExpiry() (time.Time, bool)
	expireHeld(now time.Time)
	// holdRemovals opens (true) or closes (false) the window in which
	// deletes are held as after a re-list (Watcher.SetOutageGrace).
	holdRemovals(open bool, now time.Time)
	// size is the number of entries, for logs.
	size() int
}

// watchLoop lists one prefix at revision R and watches from R+1. When the
// watch breaks it resumes from the last revision it applied + 1, on
// whichever etcd member answers, so that every event — deletes included —
// arrives once and in order; only a compacted revision (or a store that is
// behind the view, or another cluster) makes it list again and have its
// view rebuilt from scratch, so an entry deleted while the watch was down
// cannot survive as a phantom. The worker fleet and the kvd registry share
// it.
type watchLoop struct {
	cli    *clientv3.Client
	prefix string
	log    zerolog.Logger
	view   registryView
	// what names the view in logs ("fleet", "kvd registry"); countField
	// is the log field of its size ("workers", "kvds"); invalidMsg is the
	// message that reports an invalid record.
	what, countField, invalidMsg string

	// invalid maps the key of each invalid record to the mod revision that
	// was reported, so each bad value is logged once, not on every re-list.
	// Its view keeps it; owned by the Run goroutine.
	invalid map[string]int64

	synced   chan struct{}
	syncOnce sync.Once
	lists    atomic.Int64
	sessions atomic.Int64

	mu      sync.Mutex
	current clientv3.Watcher // watch stream of the running session

	// probeInterval paces the liveness probe (and bounds each probe);
	// listTimeout bounds one list; stallInterval paces the watch stream's
	// watchdog. Fields so tests can change them.
	probeInterval time.Duration
	listTimeout   time.Duration
	stallInterval time.Duration
	// outage is set from the first failure to reach etcd until etcd
	// answers again (a list, or a resumed watch), so an outage is logged
	// once when it starts and once when it ends. Owned by the Run goroutine.
	outage bool

	// The etcd position of the view, owned by the Run goroutine: rev is the
	// last revision applied (0: a list is needed), term the highest raft
	// term and cluster the cluster id etcd's answers carried.
	rev     int64
	term    uint64
	cluster uint64
	// An interruption of the watch: cut is set from the session's end
	// until the watch is back, cutTerm is the term known when it began,
	// and lostQuorum is set when, meanwhile, a linearizable read (the
	// probe or a list) failed. holdTerm is the term at which a hold window
	// opened (0: none open); a higher term closes it (see resumed).
	cut        bool
	cutTerm    uint64
	lostQuorum bool
	holdTerm   uint64

	hooks watcherHooks
}

func newWatchLoop(cli *clientv3.Client, prefix string, log zerolog.Logger, what, countField, invalidMsg string, view registryView) watchLoop {
	return watchLoop{cli: cli, prefix: prefix, log: log, view: view, what: what, countField: countField,
		invalidMsg: invalidMsg, invalid: make(map[string]int64),
		synced: make(chan struct{}), probeInterval: defaultProbeInterval, listTimeout: listTimeout,
		stallInterval: defaultStallInterval}
}

// Synced is closed once the first list has been published, so a server can
// wait for a real view before it answers "no worker".
func (w *watchLoop) Synced() <-chan struct{} { return w.synced }

func (w *watchLoop) markSynced() { w.syncOnce.Do(func() { close(w.synced) }) }

// Watcher keeps an immutable view of the worker records under one prefix
// (watchLoop): a worker deleted while the watch was down cannot survive as
// a phantom.
type Watcher struct {
	watchLoop
	onChange func(*Snapshot)

	snap atomic.Pointer[Snapshot]

	// foreign holds the keys under the prefix that cannot be worker records
	// (a '/' after the prefix, like Infera's planner/decision), each logged
	// once at debug level and otherwise skipped. Owned by the Run goroutine.
	foreign map[string]struct{}

	// grace holds removals after a re-list or an etcd outage (see
	// SetOutageGrace); held maps each held worker id to when it is removed
	// after all, and recovered is when the window in which deletes are
	// held opened (zero: none open). Owned by the Run goroutine.
	grace     time.Duration
	held      map[string]time.Time
	recovered time.Time
}

// SetOutageGrace makes the watcher hold, for d, each removal that etcd
// itself may have caused: after an etcd outage longer than the lease TTL
// every worker's lease may have expired, and dropping them all until they
// re-register would leave the router with no worker for a moment. Held are
// the workers missing from a re-list (a compacted revision) and the
// deletes within d after one, and the deletes within d after a watch
// resumes from an outage in which etcd could not serve a linearizable read
// (a list, or two probes in a row: one slow read is not an outage) and kept
// its leader (same raft term). A newer term ends the window: a new
// leader renews every lease when it takes office, so the removals it makes
// are real. A worker whose record said it was leaving (draining, dead:
// `infera worker` writes draining before it revokes its lease) is never
// held. A held worker stays in the view; a new record for it ends the
// hold, and one that does not re-appear within d is removed then. A watch
// that resumes after a member died, or after a leader change, applies
// every delete at once. 0 (the default) removes at once. Call before Run.
func (w *Watcher) SetOutageGrace(d time.Duration) { w.grace = d }

// NewWatcher returns a watcher of prefix. onChange (optional) is called on
// the Run goroutine after each new snapshot is published; it must return
// quickly because it delays the next update.
func NewWatcher(cli *clientv3.Client, prefix string, log zerolog.Logger, onChange func(*Snapshot)) *Watcher {
	w := &Watcher{
		onChange: onChange,
		foreign:  make(map[string]struct{}),
		held:     make(map[string]time.Time),
	}
	w.watchLoop = newWatchLoop(cli, prefix, log.With().Str("component", "discovery_watcher").Str("prefix", prefix).Logger(), "fleet", "workers", "ignoring invalid worker record", w)
	w.snap.Store(&Snapshot{})
	return w
}

// Snapshot returns the latest published view; never nil (empty before the
// first list).
func (w *Watcher) Snapshot() *Snapshot { return w.snap.Load() }

// Run lists and watches until ctx is done, then returns nil. Failures never
// end it: a broken watch resumes at once (then with a short backoff), and
// while etcd is away it retries with a capped, jittered backoff.
// Call it once, from one goroutine.
func (w *watchLoop) Run(ctx context.Context) error {
	slow := backoff{min: 100 * time.Millisecond, max: 5 * time.Second}
	// A watch that broke while etcd answers (a member died, an election)
	// is resumed quickly: the next member may take it at once.
	fast := backoff{min: 10 * time.Millisecond, max: 250 * time.Millisecond}
	for {
		watched, err := w.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if !w.cut {
			w.cut, w.cutTerm = true, w.term
		}
		delay := fast.next
		switch {
		case watched < 0 || errors.Is(err, errEtcdUnreachable):
			// etcd cannot serve a read: say so once per outage; the server
			// keeps routing on the snapshot it has. A failed list returns
			// at once and backs off; a session that ended by its probe
			// waited a probe interval already, and resumes quickly once
			// a member answers (after an election, say).
			w.lostQuorum = true
			if watched < 0 {
				delay = slow.next
			}
			if !w.outage {
				w.outage = true
				w.log.Warn().Err(err).Int(w.countField, w.view.size()).
					Msg("etcd unreachable: keeping the last " + w.what + " snapshot and retrying")
			} else {
				w.log.Debug().Err(err).Msg("etcd still unreachable")
			}
		case errors.Is(err, rpctypes.ErrCompacted):
			w.rev = 0
			w.log.Info().Err(err).Msg("etcd watch compacted, re-listing")
		case errors.Is(err, errStoreReset):
			w.rev = 0
			w.log.Warn().Err(err).Msg("etcd store is not the one watched, re-listing")
		default:
			w.log.Info().Err(err).Int64("revision", w.rev).Msg("etcd watch interrupted, resuming")
		}
		if watched >= stableWatch {
			slow.reset()
			fast.reset()
		}
		if !sleepCtx(ctx, delay()) {
			return nil
		}
	}
}

// session lists when the view needs it (first, or after a compaction),
// then watches from the view's revision + 1. It returns how long the watch
// ran (-1 when the list failed) and why it ended.
func (w *watchLoop) session(ctx context.Context) (time.Duration, error) {
	w.sessions.Add(1)
	if w.rev == 0 {
		if err := w.list(ctx); err != nil {
			return -1, err
		}
	} else if w.hooks.beforeResume != nil {
		w.hooks.beforeResume(w.rev)
	}
	from := w.rev + 1

	// A watcher of our own per session: closing it tears down exactly this
	// session's stream and goroutines, whatever else shares the client.
	wc := clientv3.NewWatcher(w.cli)
	w.mu.Lock()
	w.current = wc
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.current = nil
		w.mu.Unlock()
		_ = wc.Close() // only reports the context error that ended the session
	}()

	// WithRequireLeader makes a member that lost its leader (partitioned)
	// cancel the watch instead of silently serving nothing new, and
	// refuse a new one, so the watch goes to a member with a leader.
	// A failed probe also cancels the watch: clientv3's Watch waits until
	// a member has created it, which no member does while etcd is away.
	// So does the watchdog, when the member that holds the stream stops
	// answering on it.
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	// failed carries the first error of the probe or of the watchdog
	// (errEtcdUnreachable, or errWatchStalled: see watchdog).
	failed := make(chan error, 2)
	var heard stallClock
	var guards sync.WaitGroup
	guards.Add(2)
	go func() {
		defer guards.Done()
		if err := w.probe(wctx); err != nil {
			failed <- fmt.Errorf("%w: %w", errEtcdUnreachable, err)
			wcancel()
		}
	}()
	go func() {
		defer guards.Done()
		if err := w.watchdog(wctx, wc, &heard); err != nil {
			failed <- err
			wcancel()
		}
	}()
	defer func() {
		wcancel()
		guards.Wait()
	}()
	// ended says why the session ends: the probe's or the watchdog's
	// failure when there was one (it cancels the watch, which then ends
	// too), else err.
	ended := func(err error) error {
		select {
		case ferr := <-failed:
			return ferr
		default:
			return err
		}
	}
	start := time.Now()
	ch := wc.Watch(wctx, w.prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithCreatedNotify())
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	for {
		var expire <-chan time.Time
		if next, ok := w.view.nextExpiry(); ok {
			expiry.Reset(time.Until(next))
			expire = expiry.C
		}
		select {
		case <-expire:
			w.view.expireHeld(time.Now())
			continue
		case wr, ok := <-ch:
			if !ok {
				return time.Since(start), ended(errWatchClosed)
			}
			heard.answered(time.Now(), wr.Created)
			if err := wr.Err(); err != nil {
				return time.Since(start), ended(fmt.Errorf("watch %s from revision %d: %w", w.prefix, from, err))
			}
			if wr.Canceled {
				return time.Since(start), ended(errWatchCanceled)
			}
			if err := w.position(&wr); err != nil {
				return time.Since(start), err
			}
			if wr.Created {
				if wr.Header.Revision < w.rev {
					// The member is behind the view: it lags in applying,
					// or its store is not the one the view was built from.
					if err := w.checkNotBehind(ctx); err != nil {
						return time.Since(start), err
					}
				}
				if w.cut {
					w.resumed(wr.Header.RaftTerm)
				}
				continue
			}
			if len(wr.Events) > 0 {
				w.view.apply(wr.Events, wr.Header.Revision)
				// Not the header's revision: a watch catching up sends
				// batches stamped with the store's revision while more
				// events follow.
				w.rev = wr.Events[len(wr.Events)-1].Kv.ModRevision
			} else if wr.IsProgressNotify() {
				w.rev = max(w.rev, wr.Header.Revision)
			}
		case err := <-failed:
			return time.Since(start), err
		}
	}
}

// list reads the whole prefix and has the view rebuilt from it.
func (w *watchLoop) list(ctx context.Context) error {
	n := int(w.lists.Add(1))
	if w.hooks.beforeList != nil {
		w.hooks.beforeList(n)
	}
	lctx, cancel := context.WithTimeout(ctx, w.listTimeout)
	resp, err := w.cli.Get(lctx, w.prefix, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return fmt.Errorf("list %s: %w", w.prefix, err)
	}
	rev := resp.Header.Revision
	w.view.expireHeld(time.Now())
	w.view.rebuild(resp.Kvs, rev, n)
	w.rev, w.cluster, w.term = rev, resp.Header.ClusterId, max(w.term, resp.Header.RaftTerm)
	w.holdTerm = 0
	if n > 1 {
		// A re-list: what it lacks may be etcd's own doing (Watcher
		// holds it); the window it opened closes on a newer term.
		w.holdTerm = w.term
	}
	w.cut, w.lostQuorum = false, false
	if w.outage {
		w.outage = false
		w.log.Info().Int64("revision", rev).Int(w.countField, w.view.size()).
			Msg("etcd reachable again: " + w.what + " view re-listed")
	}
	if w.hooks.afterList != nil {
		w.hooks.afterList(n, rev)
	}
	return nil
}

// position checks that a watch response comes from the cluster the view
// was built from and follows its leader term: a term above the one at which
// a hold window opened closes it.
func (w *watchLoop) position(wr *clientv3.WatchResponse) error {
	h := wr.Header
	if w.cluster != 0 && h.ClusterId != 0 && h.ClusterId != w.cluster {
		return fmt.Errorf("%w: cluster %x, the view is of cluster %x", errStoreReset, h.ClusterId, w.cluster)
	}
	if h.RaftTerm > w.term {
		w.term = h.RaftTerm
	}
	if w.holdTerm != 0 && w.term > w.holdTerm {
		w.holdTerm = 0
		w.view.holdRemovals(false, time.Now())
		w.log.Info().Uint64("raft_term", w.term).
			Msg("a new etcd leader took office (it renews every lease): removals apply at once again")
	}
	return nil
}

// checkNotBehind confirms, by a linearizable read (served once the member
// has applied all the leader committed), that etcd's revision is not below
// the view's: a store that went back (restored, or wiped and started
// again) would otherwise hold a watch from the view's revision + 1 silent
// until it caught up. errStoreReset says it went back.
func (w *watchLoop) checkNotBehind(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, w.listTimeout)
	resp, err := w.cli.Get(lctx, w.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return fmt.Errorf("%w: %w", errEtcdUnreachable, err)
	}
	if resp.Header.Revision < w.rev {
		return fmt.Errorf("%w: revision %d, the view is at revision %d", errStoreReset, resp.Header.Revision, w.rev)
	}
	return nil
}

// resumed runs when a watch is back after an interruption, at the first
// answer of the member that took it (term is that member's raft term).
// Deletes that follow are applied at once unless etcd itself may have
// caused them: the watcher lost quorum during the interruption (probeFailures
// probes in a row, or a list, failed) and the leader kept its term, i.e. a leader that could not
// be reached or was stalled may have expired the leases whose keepalives
// it missed. Then they are held as after a re-list, until a newer term.
func (w *watchLoop) resumed(term uint64) {
	hold := w.lostQuorum && term <= w.cutTerm
	ev := w.log.Info()
	if !w.outage {
		ev = w.log.Debug()
	}
	msg := "etcd watch resumed"
	if w.outage {
		msg = "etcd reachable again: " + w.what + " watch resumed"
	}
	ev.Int64("revision", w.rev).Uint64("raft_term", term).Bool("removals_held", hold).
		Int(w.countField, w.view.size()).Msg(msg)
	if hold {
		w.holdTerm = max(term, 1)
		w.view.holdRemovals(true, time.Now())
	}
	w.cut, w.lostQuorum, w.outage = false, false, false
}

// probe reads one key count (a linearizable read, so it needs a quorum)
// every probeInterval until ctx ends, each bounded by probeInterval, and
// returns the failure that ends it (nil when ctx ended). Owned by one
// session.
//
// One failed read is not an outage: a loaded etcd can answer one read late
// (issue 37). The probe logs it and reads again at once; only probeFailures
// failures in a row end the session, and with them the watch that may
// resume holding removals (see resumed). A stall that can expire a lease
// must outlast the workers' TTL less their keepalive interval (7 s by
// default); the probe notices any stall longer than probeFailures+1
// intervals (6 s by default), so a stall it misses expires nothing.
func (w *watchLoop) probe(ctx context.Context) error {
	t := time.NewTimer(w.probeInterval)
	defer t.Stop()
	failed := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, w.probeInterval)
		_, err := w.cli.Get(pctx, w.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			failed = 0
			t.Reset(w.probeInterval)
			continue
		}
		if failed++; failed >= probeFailures {
			return err
		}
		w.log.Info().Err(err).Int("failures", failed).
			Msg("etcd probe failed: reading again before calling it an outage")
		t.Reset(0)
	}
}

// stallClock is what a session's loop tells its watchdog about the watch
// stream: when it last answered anything, and when the watch was created
// (0: not yet). Unix nanoseconds.
type stallClock struct {
	answeredAt, createdAt atomic.Int64
}

func (c *stallClock) answered(now time.Time, created bool) {
	c.answeredAt.Store(now.UnixNano())
	if created {
		c.createdAt.Store(now.UnixNano())
	}
}

// watchdog guards the session's watch stream (wc's, under ctx) against a
// member that stops answering without closing the connection: a process
// stopped or stalled, a host or a link that died. Such a watch gets no
// event and no error until gRPC keepalive gives the connection up (10 s
// and 5 s), and the probe does not notice (its reads go to every member in
// turn, so two in a row rarely both fail). Every stallInterval it asks the
// stream for a progress notification, which a live member answers at once
// (etcd 3.4+), and it returns errWatchStalled when that question got no
// answer at all by the next tick, or the watch was not created within two
// intervals (or errEtcdUnreachable when etcd cannot serve a read either,
// see stalled); the session then ends and the watch resumes on whichever
// member answers. The first request waits half an interval after the
// watch's creation: etcd servers before 3.4.24 and 3.5.8 answer one even
// while the watch still catches up, with a revision the catch-up has not
// reached. Returns nil when ctx ends.
func (w *watchLoop) watchdog(ctx context.Context, wc clientv3.Watcher, c *stallClock) error {
	t := time.NewTicker(w.stallInterval)
	defer t.Stop()
	// The question outstanding (first, the watch's creation) and when it
	// is overdue; a quarter interval of slack for the ticker's jitter.
	asked := time.Now()
	overdue := asked.Add(2*w.stallInterval - w.stallInterval/4)
	pending := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			if pending && c.answeredAt.Load() < asked.UnixNano() {
				if now.Before(overdue) {
					continue
				}
				return w.stalled(ctx, now.Sub(asked))
			}
			created := c.createdAt.Load()
			if pending = created != 0 && now.Sub(time.Unix(0, created)) >= w.stallInterval/2; !pending {
				continue
			}
			asked, overdue = now, now.Add(w.stallInterval-w.stallInterval/4)
		}
		rctx, cancel := context.WithTimeout(ctx, w.stallInterval)
		// An error means the stream is going away; the next tick decides.
		_ = wc.RequestProgress(rctx)
		cancel()
	}
}

// stalled decides what a silent watch stream (silent for silence) means:
// the member that holds it stopped answering (errWatchStalled), or etcd is
// away as a whole (errEtcdUnreachable), which is what the probe would find
// a few seconds later, and then the resumed watch may hold removals (see
// resumed). It reads as the probe does, probeFailures linearizable reads
// each bounded by probeInterval, but at once and side by side: the
// client sends them to different members, and one answer is enough to
// call it one member's stall. A member alone, frozen, answers none.
func (w *watchLoop) stalled(ctx context.Context, silence time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, w.probeInterval)
	errs := make(chan error, probeFailures)
	var reads sync.WaitGroup
	for range probeFailures {
		reads.Add(1)
		go func() {
			defer reads.Done()
			_, err := w.cli.Get(rctx, w.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			errs <- err
		}()
	}
	var err error
	for range probeFailures {
		if err = <-errs; err == nil {
			break
		}
	}
	cancel() // the other read, if one answered
	reads.Wait()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("%w: the watch stream was silent for %v and %d reads failed: %w",
			errEtcdUnreachable, silence.Round(time.Millisecond), probeFailures, err)
	}
	return fmt.Errorf("%w: no answer on it for %v", errWatchStalled, silence.Round(time.Millisecond))
}

// rebuild replaces the view with the listed records.
func (w *Watcher) rebuild(kvs []*mvccpb.KeyValue, rev int64, n int) {
	workers := make([]Record, 0, len(kvs))
	invalid := make(map[string]int64)
	foreign := make(map[string]struct{})
	for _, kv := range kvs {
		key := string(kv.Key)
		if w.isForeign(key) {
			w.skipForeign(key)
			foreign[key] = struct{}{}
			continue
		}
		rec, err := w.decode(key, kv.Value)
		if err != nil {
			w.reportInvalid(key, kv.ModRevision, err)
			invalid[key] = kv.ModRevision
			continue
		}
		workers = append(workers, rec)
	}
	// Forget reports of keys that are gone or valid now, so the map stays
	// bounded by the invalid records actually present.
	w.invalid = invalid
	w.foreign = foreign
	if n > 1 {
		workers = w.holdMissing(workers)
	}
	sortWorkers(workers)
	msg := "etcd fleet listed"
	if n > 1 {
		msg = "etcd fleet re-listed"
	}
	w.log.Info().Int64("revision", rev).Int("workers", len(workers)).Int("invalid", len(invalid)).Msg(msg)
	w.publish(&Snapshot{Revision: rev, Workers: workers})
}

// apply applies one watch response to a copy of the current view.
func (w *Watcher) apply(events []*clientv3.Event, rev int64) {
	cur := w.snap.Load()
	workers := slices.Clone(cur.Workers)
	changed := false
	for _, ev := range events {
		key := string(ev.Kv.Key)
		id := strings.TrimPrefix(key, w.prefix)
		if w.isForeign(key) {
			if ev.Type == clientv3.EventTypeDelete {
				delete(w.foreign, key)
			} else {
				w.skipForeign(key)
			}
			continue
		}
		if ev.Type == clientv3.EventTypeDelete {
			delete(w.invalid, key)
			if w.holdDelete(id, workers) {
				continue
			}
			workers, changed = remove(workers, id, changed)
			continue
		}
		rec, err := w.decode(key, ev.Kv.Value)
		if err != nil {
			w.reportInvalid(key, ev.Kv.ModRevision, err)
			w.invalid[key] = ev.Kv.ModRevision
			// The worker's last valid record no longer describes it.
			workers, changed = remove(workers, id, changed)
			continue
		}
		delete(w.invalid, key)
		w.unhold(rec.WorkerID)
		i, found := slices.BinarySearchFunc(workers, rec.WorkerID, func(r Record, id string) int {
			return strings.Compare(r.WorkerID, id)
		})
		if found {
			workers[i] = rec
		} else {
			workers = slices.Insert(workers, i, rec)
		}
		changed = true
	}
	if changed {
		w.publish(&Snapshot{Revision: rev, Workers: workers})
	}
}

func remove(workers []Record, id string, changed bool) ([]Record, bool) {
	i, found := slices.BinarySearchFunc(workers, id, func(r Record, id string) int {
		return strings.Compare(r.WorkerID, id)
	})
	if !found {
		return workers, changed
	}
	return slices.Delete(workers, i, i+1), true
}

func (w *Watcher) decode(key string, value []byte) (Record, error) {
	return decodeKeyed[Record](w.prefix, key, value, MaxRecordBytes, ErrInvalidRecord)
}

// isForeign reports whether key, under the prefix, names something other than
// a worker: worker ids are host:port and never contain '/', while Infera
// keeps other state below the prefix (its planner writes planner/decision).
func (w *Watcher) isForeign(key string) bool {
	return strings.IndexByte(key[min(len(w.prefix), len(key)):], '/') >= 0
}

// skipForeign logs a non-worker key once, at debug level.
func (w *Watcher) skipForeign(key string) {
	if _, seen := w.foreign[key]; seen {
		return
	}
	w.foreign[key] = struct{}{}
	w.log.Debug().Str("key", clip(key)).Msg("skipping non-worker key under the prefix")
}

// reportInvalid logs an invalid record unless it was reported at modRev
// already.
func (w *watchLoop) reportInvalid(key string, modRev int64, err error) {
	if w.invalid[key] == modRev {
		return
	}
	w.log.Warn().Str("key", clip(key)).Int64("mod_revision", modRev).Err(err).Msg(w.invalidMsg)
}

func (w *Watcher) size() int { return len(w.Snapshot().Workers) }

func (w *Watcher) publish(s *Snapshot) {
	w.snap.Store(s)
	w.markSynced()
	if w.onChange != nil {
		w.onChange(s)
	}
}

// closeWatch closes the running session's watch stream, which ends its
// watch channel exactly as a server-side cancel does. For tests.
func (w *watchLoop) closeWatch() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.current == nil {
		return false
	}
	_ = w.current.Close()
	return true
}

// holdMissing runs on a re-list: it starts the grace window and returns
// listed plus the workers of the current view the list lacks, each held
// until its grace ends (a worker already held keeps its deadline). Workers
// that are listed again are no longer held.
func (w *Watcher) holdMissing(listed []Record) []Record {
	if w.grace <= 0 {
		return listed
	}
	now := time.Now()
	w.recovered = now
	ids := make(map[string]struct{}, len(listed))
	for _, rec := range listed {
		ids[rec.WorkerID] = struct{}{}
		w.unhold(rec.WorkerID)
	}
	for _, rec := range w.Snapshot().Workers {
		if _, ok := ids[rec.WorkerID]; ok || leaving(&rec) {
			continue
		}
		if _, ok := w.held[rec.WorkerID]; !ok {
			w.held[rec.WorkerID] = now.Add(w.grace)
			w.log.Info().Str("worker_id", rec.WorkerID).Dur("grace", w.grace).
				Msg("worker missing from the re-list: kept while it may re-register")
		}
		listed = append(listed, rec)
	}
	return listed
}

// holdDelete decides on a delete event for id, given the view it applies
// to: within the grace window after a re-list or an outage a worker's
// removal is held (true: keep it in the view) unless its record said it
// was leaving (draining, dead: it deregistered on purpose); one already
// held stays held.
func (w *Watcher) holdDelete(id string, workers []Record) bool {
	if _, ok := w.held[id]; ok {
		return true
	}
	if w.grace <= 0 || w.recovered.IsZero() {
		return false
	}
	now := time.Now()
	if now.Sub(w.recovered) > w.grace {
		return false
	}
	i, found := slices.BinarySearchFunc(workers, id, func(r Record, id string) int {
		return strings.Compare(r.WorkerID, id)
	})
	if !found || leaving(&workers[i]) {
		return false
	}
	w.held[id] = now.Add(w.grace)
	w.log.Info().Str("worker_id", id).Dur("grace", w.grace).
		Msg("worker record deleted just after an etcd interruption: kept while it may re-register")
	return true
}

// holdRemovals opens or closes the window in which deletes are held (see
// SetOutageGrace); workers already held stay held.
func (w *Watcher) holdRemovals(open bool, now time.Time) {
	if !open {
		w.recovered = time.Time{}
		return
	}
	if w.grace > 0 {
		w.recovered = now
	}
}

// leaving reports whether a worker's record says it is going away on
// purpose (draining, dead): its removal is never held.
func leaving(r *Record) bool { return r.Status == StatusDraining || r.Status == StatusDead }

func (w *Watcher) unhold(id string) {
	if _, ok := w.held[id]; ok {
		delete(w.held, id)
		w.log.Info().Str("worker_id", id).Msg("held worker re-registered")
	}
}

// nextExpiry returns the earliest deadline of a held worker.
func (w *Watcher) nextExpiry() (time.Time, bool) {
	var next time.Time
	for _, d := range w.held {
		if next.IsZero() || d.Before(next) {
			next = d
		}
	}
	return next, !next.IsZero()
}

// expireHeld removes the held workers whose grace has ended by now.
func (w *Watcher) expireHeld(now time.Time) {
	cur := w.snap.Load()
	workers := cur.Workers
	changed := false
	for id, deadline := range w.held {
		if deadline.After(now) {
			continue
		}
		delete(w.held, id)
		if !changed {
			workers = slices.Clone(workers)
		}
		workers, changed = remove(workers, id, changed)
		w.log.Warn().Str("worker_id", id).Dur("grace", w.grace).
			Msg("held worker did not re-register within the grace: removed")
	}
	if changed {
		w.publish(&Snapshot{Revision: cur.Revision, Workers: workers})
	}
}
