package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/infera/infera/config"
	"github.com/infera/infera/kvd"
	"github.com/infera/infera/kvd/l4"
	"github.com/infera/infera/kvd/mcstore"
	"github.com/infera/infera/kvd/resp"
	"github.com/infera/infera/kvd/tablespace"
)

// kvdCommand is `infera kvd`: the per-host KV-cache daemon, and `infera
// kvd stat` to read its counters.
func kvdCommand() *cli.Command {
	var cfg config.KVD
	return &cli.Command{
		Name:  "kvd",
		Usage: "run the per-host KV-cache daemon: a shared host-RAM arena below the engines' GPU caches",
		Description: "Engines' Infera kvd connectors reach it on --socket (length-prefixed msgpack frames; the\n" +
			"shared arena's memfd is passed with SCM_RIGHTS after hello_ack, so reads are zero-copy).\n" +
			"RAM evicts none before ephemeral before short before long entries, least recently used\n" +
			"first within a class; a lower retention never displaces a higher one. Only peers whose uid\n" +
			"is in --allow-uid (default: the daemon's own and root) are served. Prometheus metrics and\n" +
			"/health are on --admin-listen.\n\n" +
			"Example: infera kvd --socket /run/infera/kvd.sock --max-bytes 64GiB\n" +
			"         infera kvd stat --socket /run/infera/kvd.sock --json",
		Flags: cfg.Flags(),
		Action: func(c *cli.Context) error {
			cfg.Finish(c)
			if err := cfg.Validate(); err != nil {
				return err
			}
			log := newLogger(cfg.Log, c.App.ErrWriter).With().Str("component", "kvd").Logger()
			ctx, stop := signalContext(c.Context)
			defer stop()
			return runKVD(ctx, cfg, log, nil)
		},
		Subcommands: []*cli.Command{kvdStatCommand()},
	}
}

// runKVD runs the daemon until ctx ends; ready, when set, receives the
// admin address once the socket is served (tests).
func runKVD(ctx context.Context, cfg config.KVD, log zerolog.Logger, ready chan<- string) error {
	var arena *kvd.Arena
	if cfg.ArenaBytes > 0 {
		a, fallbacks, err := kvd.OpenArena(cfg.ArenaBytes, cfg.ArenaHugetlb, cfg.ArenaMlock)
		if err != nil {
			return fmt.Errorf("kvd arena: %w", err)
		}
		defer a.Close()
		for _, f := range fallbacks {
			log.Warn().Str("fallback", f).Msg("arena option not available; continuing without it")
		}
		log.Info().Int64("arena_bytes", a.Size()).Bool("hugetlb", a.Hugetlb).Bool("mlock", a.Locked).Msg("shared arena ready")
		arena = a
	}
	var pinned bool
	if arena != nil {
		unpin, ok, err := pinArena(arena.Memory(), cfg.ArenaHIPRegister, cfg.HIPLibrary, log)
		if err != nil {
			return err
		}
		// Deferred after the arena's Close, so it runs before it.
		defer unpin()
		pinned = ok
	}
	opt := kvd.StoreOptions{MaxBytes: cfg.MaxBytes, Arena: arena, SlotBytes: int(cfg.ArenaSlotBytes), PrefetchQueue: cfg.PrefetchQueue, LongQueue: cfg.LongQueue, Log: log}
	if len(cfg.LongPaths) > 0 {
		ts, err := openTablespace(ctx, cfg, log)
		if err != nil {
			return err
		}
		// Deferred before the store's Close, so it runs after it: the
		// pending write-throughs land before the snapshot is written.
		defer func() {
			if err := ts.Close(); err != nil {
				log.Error().Err(err).Msg("close tablespace")
			}
		}()
		opt.Long, opt.LongNotFound = ts, tablespace.ErrNotFound
	}
	collectors := []prometheus.Collector{arenaHIPGauge(pinned)}
	if len(cfg.L4Redis) > 0 {
		tier, err := l4.Open(l4.Options{URLs: cfg.L4Redis, Prefix: cfg.L4Prefix, TTL: cfg.L4TTL, Queue: cfg.L4Queue, Timeout: cfg.L4Timeout,
			Below: opt.Long, BelowNotFound: opt.LongNotFound, Log: log.With().Str("tier", "l4").Logger()})
		if err != nil {
			return fmt.Errorf("kvd l4: %w", err)
		}
		// Deferred before the store's Close, so it runs after it (and
		// before the tablespace's): the store's last write-throughs reach
		// the tier's queue, which is written before Redis is left.
		defer tier.Close()
		opt.Long, opt.LongNotFound = tier, l4.ErrNotFound
		collectors = append(collectors, tier.Collector())
	}
	if cfg.LongBackend == config.LongBackendMooncake {
		m := cfg.Mooncake
		tier, err := l4.OpenMooncake(l4.Options{Prefix: m.ClusterID + ":", Queue: cfg.L4Queue, Timeout: cfg.L4Timeout, MaxValueBytes: m.MaxValueBytes,
			Below: opt.Long, BelowNotFound: opt.LongNotFound, Log: log.With().Str("tier", "l4").Logger()},
			mcstore.Config{Library: m.Library, LocalHostname: m.LocalHostname, MetadataServer: m.MetadataServer, MasterAddress: m.MasterAddress,
				GlobalSegmentSize: m.GlobalSegmentSize, LocalBufferSize: m.LocalBufferSize, Protocol: m.Protocol, DeviceName: m.DeviceName})
		if err != nil {
			return fmt.Errorf("kvd l4 mooncake: %w", err)
		}
		log.Info().Str("master", m.MasterAddress).Str("local", m.LocalHostname).Str("protocol", m.Protocol).Str("cluster_id", m.ClusterID).
			Bool("below_l3", len(cfg.LongPaths) > 0).Msg("l4 on mooncake store")
		defer tier.Close()
		opt.Long, opt.LongNotFound = tier, l4.ErrNotFound
		collectors = append(collectors, tier.Collector())
	}
	store, err := kvd.NewStore(opt)
	if err != nil {
		return err
	}
	defer store.Close()
	kp, err := startPeer(ctx, cfg, store, log)
	if err != nil {
		return err
	}
	defer kp.stop()
	collectors = append(collectors, kp.collectors()...)
	var rs *resp.Server
	if cfg.RESPListen != "" {
		rs, err = resp.NewServer(store, resp.Options{Model: cfg.RESPModel, CompatKey: cfg.RESPCompatKey, Retention: cfg.RESPRetention,
			User: cfg.RESPUser, Password: cfg.RESPPassword, MaxRequestBytes: int(cfg.MaxFrameBytes), Loops: cfg.RESPLoops, MaxClients: cfg.RESPMaxClients,
			MaxOutputBytes: int(cfg.RESPMaxOutput), OutputTimeout: respOutputTimeout(cfg.RESPOutputTimeout), Log: log.With().Str("listener", "resp").Logger()})
		if err != nil {
			return err
		}
		collectors = append(collectors, rs.Collector())
	}
	srv := kvd.NewServer(store, kvd.ServerOptions{AllowUIDs: cfg.AllowUIDs, MaxFrameBytes: int(cfg.MaxFrameBytes), MaxConns: cfg.MaxConns,
		MaxLeasesPerConn: cfg.MaxLeases, LeaseTimeout: cfg.LeaseTimeout, Log: log, Collectors: collectors, PeerPrefetch: kp.hint})
	ln, err := kvd.Listen(cfg.Socket)
	if err != nil {
		return err
	}
	defer os.Remove(cfg.Socket)
	adminAddr := ""
	var admin *http.Server
	adminDone := make(chan error, 1)
	if cfg.AdminListen != "" {
		aln, err := net.Listen("tcp", cfg.AdminListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("kvd admin listen: %w", err)
		}
		adminAddr = aln.Addr().String()
		admin = &http.Server{Handler: srv.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { adminDone <- admin.Serve(aln) }()
	}
	respDone := make(chan error, 1)
	respAddr := ""
	if rs != nil {
		rln, err := net.Listen("tcp", cfg.RESPListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("kvd resp listen: %w", err)
		}
		respAddr = rln.Addr().String()
		rctx, rcancel := context.WithCancel(ctx)
		defer func() { rcancel(); <-respDone }()
		go func() { respDone <- rs.Serve(rctx, rln) }()
	} else {
		respDone <- nil
	}
	log.Info().Str("socket", cfg.Socket).Str("admin", adminAddr).Str("resp", respAddr).Str("peer", kp.addr).Str("server_id", srv.ID()).Int64("max_bytes", cfg.MaxBytes).Msg("kvd serving")
	if ready != nil {
		ready <- adminAddr
	}
	err = srv.Serve(ctx, ln)
	if admin != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = admin.Shutdown(sctx)
		cancel()
		if aerr := <-adminDone; !errors.Is(aerr, http.ErrServerClosed) && err == nil {
			err = aerr
		}
	}
	log.Info().Msg("kvd stopped")
	return err
}

// openTablespace opens the L3 tablespace and, unless skipped, measures its
// write speed once (logged; a failed check does not stop the daemon).
func openTablespace(ctx context.Context, cfg config.KVD, log zerolog.Logger) (*tablespace.Tablespace, error) {
	ts, err := tablespace.Open(tablespace.Config{
		Paths:            cfg.LongPaths,
		Bytes:            cfg.LongBytes,
		SlotBytes:        cfg.SlotBytes,
		ContainerBytes:   cfg.ContainerBytes,
		DirectIO:         tablespace.DirectIO(cfg.LongDirectIO),
		GroupCommit:      cfg.LongGroupCommit,
		SnapshotInterval: cfg.LongSnapshotInterval,
		Logger:           log.With().Str("tier", "l3").Logger(),
	})
	if err != nil {
		return nil, fmt.Errorf("kvd l3: %w", err)
	}
	st := ts.Stats()
	log.Info().Strs("paths", cfg.LongPaths).Int64("long_bytes", cfg.LongBytes).Bool("direct_io", ts.DirectIOActive()).
		Int("entries", ts.Len()).Uint64("replay_checked", st.ReplayChecked).Uint64("replay_rejected", st.ReplayRejected).
		Msg("tablespace ready")
	if !cfg.SkipSelfCheck {
		if bps, err := ts.SelfCheck(ctx); err != nil {
			log.Warn().Err(err).Msg("l3 write-speed self-check failed")
		} else {
			log.Info().Float64("write_bytes_per_second", bps).Msg("l3 write-speed self-check")
		}
	}
	return ts, nil
}

func kvdStatCommand() *cli.Command {
	var cfg config.KVDStat
	return &cli.Command{
		Name:        "stat",
		Usage:       "print a running kvd's counters (stats op)",
		Description: "Example: infera kvd stat --socket /run/infera/kvd.sock --json",
		Flags:       cfg.Flags(),
		Action: func(c *cli.Context) error {
			ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
			defer cancel()
			return kvdStat(ctx, cfg, c.App.Writer)
		},
	}
}

func kvdStat(ctx context.Context, cfg config.KVDStat, w io.Writer) error {
	cl, err := kvd.Dial(ctx, cfg.Socket, kvd.ClientOptions{ClientID: "infera-kvd-stat"})
	if err != nil {
		return err
	}
	defer cl.Close()
	st, err := cl.StatsCtx(ctx) // the 10 s bound covers the request too
	if err != nil {
		return err
	}
	if cfg.JSON {
		out := struct {
			ServerID string `json:"server_id"`
			kvd.StatsCounters
		}{cl.ServerID, st}
		b, err := json.Marshal(out)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	hitRatio := 0.0
	if st.GetsTotal > 0 {
		hitRatio = float64(st.HitsTotal) / float64(st.GetsTotal)
	}
	_, err = fmt.Fprintf(w, "server     %s\nentries    %d\nhost       %d bytes\nlong (L3)  %d bytes\ngets       %d (hits %d, misses %d, hit ratio %.3f)\nsets       %d\nevictions  %d\n",
		cl.ServerID, st.Entries, st.HostBytes, st.LongBytes, st.GetsTotal, st.HitsTotal, st.MissesTotal, hitRatio, st.SetsTotal, st.EvictionsTotal)
	n := min(len(st.ClassSlotBytes), len(st.ClassPages), len(st.ClassSlots), len(st.ClassUsedSlots), len(st.ClassValueBytes))
	for i := range n {
		if err != nil {
			break
		}
		_, err = fmt.Fprintf(w, "class %7d B  pages %d  slots %d/%d used  values %d bytes\n",
			st.ClassSlotBytes[i], st.ClassPages[i], st.ClassUsedSlots[i], st.ClassSlots[i], st.ClassValueBytes[i])
	}
	return err
}

// respOutputTimeout maps --resp-output-timeout 0 (never) to the listener's
// "never" (negative; its 0 is the default).
func respOutputTimeout(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
