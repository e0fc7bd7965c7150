package engines

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/natsreq"
)

// ErrKeepAlive is wrapped when the registrar stops keeping the record alive
// on its own, which leaves the engine unreachable for the fleet.
var ErrKeepAlive = errors.New("worker keepalive stopped")

const (
	// etcdOpTimeout bounds the etcd calls of shutdown (status, revoke): the
	// worker must exit even when etcd is gone; the lease then expires.
	etcdOpTimeout = 3 * time.Second
	// drainPollInterval is how often the engine's load is read while draining.
	drainPollInterval = 200 * time.Millisecond
	// maxMetricsBytes bounds one /metrics body; vLLM's is some hundred KiB.
	maxMetricsBytes = 16 << 20
	// stopSlack is added to --stop-grace as the bound of the final stop, for
	// the SIGKILL and the reap after it.
	stopSlack = 5 * time.Second
	// registerRetryMax caps the pause between registration attempts.
	registerRetryMax = 5 * time.Second
	// blockSizeAttempts bounds how often the engine's block size is asked
	// for after readiness.
	blockSizeAttempts = 4
)

// worker is one run of `infera worker`: one engine, one record.
type worker struct {
	cfg     config.Worker
	base    zerolog.Logger // the caller's logger, for components with their own "component"
	log     zerolog.Logger
	adapter Adapter
	ep      Endpoint
	local   string // base URL the worker uses to reach the engine itself
	proc    *Process
	nc      *nats.Conn // --kv-event-transport nats; nil otherwise
}

// Run runs a worker until ctx is cancelled or the engine exits. It starts the
// engine, waits until it is healthy, registers it in etcd and keeps the
// lease alive. When ctx is cancelled (SIGTERM/SIGINT) it marks the record
// draining, waits until the engine is idle or --drain-timeout passes,
// deregisters, stops the engine and returns nil. When the engine exits on its
// own it deregisters at once and returns an error wrapping ErrExited.
func Run(ctx context.Context, cfg config.Worker, log zerolog.Logger) error {
	base := log
	log = base.With().Str("component", "worker").Str("engine", cfg.Engine).Logger()
	adapter, err := Lookup(cfg.Engine)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if cfg.Kube.Backend == config.DiscoveryKubernetes && cfg.AdvertiseHost == "" {
		// Under Kubernetes the Pod IP is what other Pods reach (downward API).
		cfg.AdvertiseHost = os.Getenv("POD_IP")
	}
	opts := Options{Bin: cfg.EngineBin, Python: cfg.Python, AdvertiseHost: cfg.AdvertiseHost, NoKVEvents: cfg.NoKVEvents,
		KVEventsRouter: cfg.KVEventsRouter, KVDSocket: cfg.KVDSocket}
	launch, err := PrepareLaunch(adapter, opts, cfg.EngineArgs)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	for _, w := range launch.Warnings {
		log.Warn().Msg(w)
	}
	if cfg.KVDSocket != "" {
		if err := ProbeKVD(ctx, cfg.KVDSocket); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		log.Info().Str("kvd_socket", cfg.KVDSocket).Msg("kvd answers; the engine is wired to it")
	}
	warnLoopbackAdvertise(log, launch.Endpoint.AdvertiseHost, cfg.Etcd.Endpoints)
	if isPD(launch.Endpoint.DisaggMode) {
		// Refused before the engine starts: a PD engine on TCP would load
		// for minutes only to serve ~100x slower.
		if err := checkPD(cfg, launch.Endpoint, log); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
	}

	var newKeeper func(discovery.Record) recordKeeper
	if cfg.Kube.Backend == config.DiscoveryKubernetes {
		nk, closeKube, err := kubeKeeper(&cfg, base)
		if err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		defer closeKube()
		newKeeper = nk
	} else {
		cli, err := discovery.NewClient(cfg.Etcd, base)
		if err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		defer func() {
			if err := cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
				log.Debug().Err(err).Msg("close etcd client")
			}
		}()
		newKeeper = func(rec discovery.Record) recordKeeper {
			return discovery.NewRegistrar(cli, cfg.Etcd.Prefix, rec,
				discovery.RegistrarOptions{TTL: cfg.LeaseTTL, KeepAliveInterval: cfg.KeepAliveInterval}, base)
		}
	}

	w := &worker{
		cfg:     cfg,
		base:    base,
		log:     log,
		adapter: adapter,
		ep:      launch.Endpoint,
		local:   "http://" + net.JoinHostPort(localHost(launch.Endpoint.Host), strconv.Itoa(launch.Endpoint.Port)),
	}
	if wantsKVRelay(cfg) || cfg.Requests.Transport == config.RequestTransportNATS {
		if err := w.connectNATS(ctx); err != nil {
			return err
		}
		defer w.nc.Close()
	}
	// An engine that a previous worker on this port left behind (it died
	// before the parent-death signal existed, or forked helpers that kept
	// the port) is killed if the pidfile proves it is ours; anything else
	// holding the port is named instead of letting the engine fail to bind.
	runtimeDir := cfg.RuntimeDir
	if runtimeDir == "" {
		runtimeDir = DefaultRuntimeDir()
	}
	pf := pidfilePath(runtimeDir, launch.Endpoint.Port)
	if err := pf.reclaim(log); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := checkPortFree(launch.Endpoint.Host, launch.Endpoint.Port); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	// Engine lines get their own component (Start adds engine and pid).
	w.proc, err = Start(launch.Command, base.With().Str("component", "engine").Logger())
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := pf.write(w.proc.PID()); err != nil {
		log.Warn().Err(err).Msg("no engine pidfile: a restarted worker cannot reclaim this engine's port")
	} else {
		defer pf.remove(w.proc.PID()) // after stopEngine (deferred later, runs first)
	}
	// Whatever happens below, the engine does not outlive the worker.
	defer w.stopEngine()
	return w.serve(ctx, newKeeper)
}

func (w *worker) serve(ctx context.Context, newKeeper func(discovery.Record) recordKeeper) error {
	if rank := followerRank(w.cfg.EngineArgs, os.LookupEnv); rank > 0 {
		return w.follow(ctx, rank)
	}
	if err := w.proc.WaitHealthy(ctx, w.local+"/health", w.cfg.HealthInterval, w.cfg.ReadyTimeout); err != nil {
		if ctx.Err() != nil && !errors.Is(err, ErrExited) {
			w.log.Info().Msg("stopped before the engine was ready")
			return nil
		}
		return fmt.Errorf("worker: %w", err)
	}
	w.log.Info().Str("url", w.local).Msg("engine ready")
	w.resolveBlockSize(ctx)

	rec := w.ep.Record(w.adapter.Name())
	rec.KVDPeer = w.cfg.KVDPeer
	if err := rec.Validate(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	// drainRequests drains requests over NATS on shutdown (a no-op on HTTP).
	drainRequests := func() {}
	var reqs *natsreq.Server
	if w.cfg.Requests.Transport == config.RequestTransportNATS {
		var err error
		reqs, err = w.startRequests(ctx, rec.WorkerID)
		if err != nil {
			return err
		}
		rec.RequestTransport = config.RequestTransportNATS
		stopped := false
		defer func() {
			if !stopped {
				reqs.Stop(0)
			}
		}()
		drainRequests = func() {
			stopped = true
			reqs.Stop(w.cfg.DrainTimeout)
		}
	}
	if wantsKVRelay(w.cfg) {
		relay, err := w.startKVRelay(ctx, rec.WorkerID, w.nc)
		if err != nil {
			return err
		}
		if relay != nil {
			// Closed after deregistration and drain: the engine's last
			// events and the final view still reach NATS.
			defer relay.Close()
		}
	}
	reg := newKeeper(rec)
	if err := w.register(ctx, reg); err != nil {
		if ctx.Err() != nil && !errors.Is(err, ErrExited) {
			w.log.Info().Msg("stopped before the worker was registered")
			w.revoke(reg, false) // a registration may have landed as ctx ended
			return nil
		}
		w.revoke(reg, false)
		return fmt.Errorf("worker: %w", err)
	}
	ev := w.log.Info().Str("worker_id", rec.WorkerID).Str("url", rec.URL).Str("model_name", rec.ModelName).
		Str("disagg_mode", string(rec.DisaggMode)).Int("dp_size", rec.DPSize)
	if rec.DPRank != nil {
		ev = ev.Int("dp_rank", *rec.DPRank)
	}
	if rec.KVBlockSize != nil {
		ev = ev.Int("kv_block_size", *rec.KVBlockSize)
	}
	if rec.KVCapacityBlocks > 0 {
		ev = ev.Int("kv_capacity_blocks", rec.KVCapacityBlocks)
	}
	if rec.KVEventsEndpoint != nil {
		ev = ev.Str("kv_events_endpoint", *rec.KVEventsEndpoint)
	}
	ev.Msg("worker registered")

	// The keepalive must outlive ctx: the record has to stay (as draining)
	// while in-flight requests finish.
	keepCtx, stopKeep := context.WithCancel(context.WithoutCancel(ctx))
	defer stopKeep()
	keepDone := make(chan struct{})
	var keepErr error
	go func() {
		defer close(keepDone)
		keepErr = reg.Run(keepCtx)
	}()
	// Revoke first, so the record is gone as soon as possible (Run then
	// returns by itself), and wait for Run so no goroutine outlives Run.
	finish := func() {
		w.revoke(reg, true)
		stopKeep()
		<-keepDone
	}

	select {
	case <-w.proc.Done():
		finish()
		return fmt.Errorf("worker: %w unexpectedly: %s", ErrExited, exitStatus(w.proc.ExitErr()))
	case <-keepDone:
		finish()
		if keepErr == nil {
			return fmt.Errorf("worker: %w", ErrKeepAlive)
		}
		return fmt.Errorf("worker: %w: %w", ErrKeepAlive, keepErr)
	case <-ctx.Done():
	}
	if reqs != nil {
		// Routers stop sending once the record says draining; then the
		// NATS requests drain (queued, in flight, hand-back).
		sctx, cancel := context.WithTimeout(context.Background(), etcdOpTimeout)
		if err := reg.SetStatus(sctx, discovery.StatusDraining); err != nil {
			w.log.Warn().Err(err).Msg("set draining status failed")
		}
		cancel()
		drainRequests()
	}
	w.drain(reg)
	finish()
	return nil
}

// register writes the record, retrying while etcd is unreachable: the engine
// is up (which may have taken minutes), so waiting for etcd beats exiting.
func (w *worker) register(ctx context.Context, reg recordKeeper) error {
	pause := 250 * time.Millisecond
	for {
		err := reg.Register(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, discovery.ErrInvalidRecord) || ctx.Err() != nil {
			return err
		}
		w.log.Warn().Err(err).Dur("retry_in", pause).Msg("worker registration failed, retrying")
		timer := time.NewTimer(pause)
		select {
		case <-w.proc.Done():
			timer.Stop()
			return fmt.Errorf("%w before registration: %s", ErrExited, exitStatus(w.proc.ExitErr()))
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		pause = min(2*pause, registerRetryMax)
	}
}

// drain marks the record draining and waits until the engine reports no
// running or waiting request, --drain-timeout passes, or the engine exits.
func (w *worker) drain(reg recordKeeper) {
	sctx, cancel := context.WithTimeout(context.Background(), etcdOpTimeout)
	err := reg.SetStatus(sctx, discovery.StatusDraining)
	cancel()
	if err != nil {
		// The registrar keeps the status and writes it when etcd is back.
		w.log.Warn().Err(err).Msg("set draining status failed")
	}
	w.log.Info().Dur("drain_timeout", w.cfg.DrainTimeout).Msg("worker draining")

	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.DrainTimeout)
	defer cancel()
	// The first look is one interval after the status change, which gives
	// routers a moment to see "draining" before an idle engine is stopped.
	ticker := time.NewTicker(drainPollInterval)
	defer ticker.Stop()
	var last Stats
	var lastErr error
	for {
		select {
		case <-w.proc.Done():
			w.log.Warn().Str("exit", exitStatus(w.proc.ExitErr())).Msg("engine exited while draining")
			return
		case <-ctx.Done():
			ev := w.log.Warn().Float64("running", last.Running).Float64("waiting", last.Waiting)
			if lastErr != nil {
				ev = ev.AnErr("metrics_error", lastErr)
			}
			ev.Msg("drain timeout passed with requests in flight")
			return
		case <-ticker.C:
		}
		st, err := w.stats(ctx)
		if err != nil {
			if lastErr == nil {
				w.log.Debug().Err(err).Msg("engine metrics unavailable while draining")
			}
			lastErr = err
			continue
		}
		last, lastErr = st, nil
		if st.Idle() {
			w.log.Info().Msg("engine idle, drain complete")
			return
		}
	}
}

// resolveBlockSize prefers the block size the engine reports over the one
// parsed from its arguments: the engine may have chosen its own (vLLM for
// hybrid models, SGLang per attention backend), and a router hashing with
// another size than the engine's events would match nothing. It asks a few
// times: the value is read once, and one slow answer right after readiness
// must not leave the worker without it. The cache size in blocks comes
// with it where the engine reports one (kv_capacity_blocks).
func (w *worker) resolveBlockSize(ctx context.Context) {
	var lastErr error
	for attempt := range blockSizeAttempts {
		if attempt > 0 {
			timer := time.NewTimer(w.cfg.HealthInterval)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-w.proc.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
		}
		size, blocks, err := w.reportedBlockSize(ctx)
		if err == nil {
			if size > 0 && size != w.ep.BlockSize {
				w.log.Info().Int("block_size", size).Int("args_block_size", w.ep.BlockSize).Msg("engine reports another block size, using it")
				w.ep.BlockSize = size
			}
			if size > 0 && blocks > 0 {
				w.ep.KVBlocks = blocks
			}
			return
		}
		lastErr = err
	}
	ev := w.log.Warn().Err(lastErr).Int("block_size", w.ep.BlockSize)
	if w.ep.BlockSize == 0 {
		ev.Msg("engine block size unknown: registering without kv_block_size, so routing to it is approximate (give the engine's block/page size flag)")
		return
	}
	ev.Msg("engine does not report its block size, keeping the one from its arguments")
}

// reportedBlockSize asks the engine for its block size and its cache size
// in blocks, from /metrics or the adapter's own endpoint (0 blocks where
// the engine does not say). 0 with a nil error means the engine answered
// without a block size.
func (w *worker) reportedBlockSize(ctx context.Context) (size, blocks int, err error) {
	p, ok := w.adapter.(blockSizeProber)
	if !ok {
		st, err := w.stats(ctx)
		return st.BlockSize, st.KVBlocks, err
	}
	ctx, cancel := context.WithTimeout(ctx, maxProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.local+p.blockSizePath(), nil)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %w", ErrMetrics, err)
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %w", ErrMetrics, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("%w: %s: status %d", ErrMetrics, p.blockSizePath(), resp.StatusCode)
	}
	return p.parseBlockSize(resp.Body)
}

// stats reads the engine's /metrics once.
func (w *worker) stats(ctx context.Context) (Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, maxProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.local+"/metrics", nil)
	if err != nil {
		return Stats{}, fmt.Errorf("%w: %w", ErrMetrics, err)
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return Stats{}, fmt.Errorf("%w: %w", ErrMetrics, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Stats{}, fmt.Errorf("%w: status %d", ErrMetrics, resp.StatusCode)
	}
	return w.adapter.Inspect(io.LimitReader(resp.Body, maxMetricsBytes))
}

// revoke deletes the record now, under a fresh bounded context: it runs on
// the way out, when the caller's context is usually already cancelled.
// registered says whether the record is known to exist (for the log).
func (w *worker) revoke(reg recordKeeper, registered bool) {
	ctx, cancel := context.WithTimeout(context.Background(), etcdOpTimeout)
	defer cancel()
	if err := reg.Revoke(ctx); err != nil {
		w.log.Warn().Err(err).Msg("revoke worker lease failed; the record expires with the lease")
		return
	}
	if registered {
		w.log.Info().Msg("worker deregistered")
	}
}

func (w *worker) stopEngine() {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.StopGrace+stopSlack)
	defer cancel()
	if err := w.proc.Stop(ctx, w.cfg.StopGrace); err != nil {
		w.log.Error().Err(err).Msg("engine did not stop")
	}
}

// followerRank is the node rank of a member of a multi-node engine group
// (a LeaderWorkerSet): the engine's --node-rank, else LWS_WORKER_INDEX; 0
// for the leader, a single node or an unreadable value.
func followerRank(args []string, lookup func(string) (string, bool)) int {
	v, ok, err := firstEngineFlag(args, "node-rank")
	if !ok || err != nil {
		v, _ = lookup("LWS_WORKER_INDEX")
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// follow supervises the engine of a multi-node follower (node rank > 0)
// until ctx ends or the engine exits: a follower runs its tensor-parallel
// part only and cannot serve the API, so it never registers (node rank 0
// does), as the reference's workers.
func (w *worker) follow(ctx context.Context, rank int) error {
	w.log.Info().Int("node_rank", rank).Msg("multinode follower: not registering (node rank 0 serves and registers)")
	select {
	case <-w.proc.Done():
		return fmt.Errorf("worker: %w unexpectedly: %s", ErrExited, exitStatus(w.proc.ExitErr()))
	case <-ctx.Done():
		return nil
	}
}
