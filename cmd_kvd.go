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

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/infera/infera/config"
	"github.com/infera/infera/kvd"
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
	store, err := kvd.NewStore(kvd.StoreOptions{MaxBytes: cfg.MaxBytes, Arena: arena, PrefetchQueue: cfg.PrefetchQueue, LongQueue: cfg.LongQueue, Log: log})
	if err != nil {
		return err
	}
	defer store.Close()
	srv := kvd.NewServer(store, kvd.ServerOptions{AllowUIDs: cfg.AllowUIDs, MaxFrameBytes: int(cfg.MaxFrameBytes), Log: log})
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
	log.Info().Str("socket", cfg.Socket).Str("admin", adminAddr).Str("server_id", srv.ID()).Int64("max_bytes", cfg.MaxBytes).Msg("kvd serving")
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
	st, err := cl.Stats()
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
	return err
}
