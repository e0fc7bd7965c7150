package engines

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/infera/infera/config"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/kvnats"
	"github.com/infera/infera/natsreq"
	"github.com/infera/infera/natsx"
)

// natsConnectTimeout bounds the worker's NATS connect at start-up.
const natsConnectTimeout = 15 * time.Second

// wantsKVRelay reports whether the worker relays its engine's KV events to
// NATS (--kv-event-transport nats with KV events on).
func wantsKVRelay(cfg config.Worker) bool {
	return cfg.KVEventTransport == config.KVEventTransportNATS && !cfg.NoKVEvents
}

// connectNATS connects before the engine starts, so that a server that is
// down or refuses us fails the worker at once instead of after the
// engine's load.
func (w *worker) connectNATS(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, natsConnectTimeout)
	defer cancel()
	n := w.cfg.NATS
	nc, err := natsx.Connect(cctx, natsx.Config{URL: n.URL, CredsFile: n.CredsFile, NKeyFile: n.NKeyFile, CAFile: n.CAFile,
		Name: "infera-worker"}, w.log)
	if err != nil {
		return fmt.Errorf("worker: --kv-event-transport nats: %w", err)
	}
	w.nc = nc
	return nil
}

// relayRanks are the engine publishers the relay follows, on the engine's
// local address: every rank of an engine that multiplexes ranks (subject
// rank = DP rank), else the one publisher on rank 0.
func relayRanks(ep Endpoint) ([]kvnats.RelayRank, error) {
	u, err := url.Parse(ep.KVEvents)
	if err != nil || u.Port() == "" {
		return nil, fmt.Errorf("kv events endpoint %q: no tcp://host:port", ep.KVEvents)
	}
	local := "tcp://" + net.JoinHostPort(localHost(ep.Host), u.Port())
	if ep.DPSize <= 1 || ep.DPRank != nil {
		return []kvnats.RelayRank{{Rank: 0, Endpoint: local}}, nil
	}
	out := make([]kvnats.RelayRank, 0, ep.DPSize)
	for r := range ep.DPSize {
		e, err := kvcache.RankEndpoint(local, r)
		if err != nil {
			return nil, err
		}
		out = append(out, kvnats.RelayRank{Rank: r, Endpoint: e})
	}
	return out, nil
}

// startKVRelay starts relaying the engine's events to NATS as workerID.
func (w *worker) startKVRelay(ctx context.Context, workerID string, nc *nats.Conn) (*kvnats.Relay, error) {
	if w.ep.KVEvents == "" {
		w.log.Warn().Msg("--kv-event-transport nats: the engine has no KV-event publisher; nothing to relay")
		return nil, nil
	}
	ranks, err := relayRanks(w.ep)
	if err != nil {
		return nil, fmt.Errorf("worker: kv events relay: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, natsConnectTimeout)
	defer cancel()
	r, err := kvnats.NewRelay(cctx, kvnats.RelayConfig{WorkerID: workerID, Ranks: ranks, BlockSize: w.ep.BlockSize}, nc, w.base)
	if err != nil {
		return nil, fmt.Errorf("worker: kv events relay: %w", err)
	}
	if err := r.Start(); err != nil {
		return nil, fmt.Errorf("worker: kv events relay: %w", err)
	}
	return r, nil
}

// startRequests takes requests over NATS for workerID and proxies them to
// the engine (--request-transport nats).
func (w *worker) startRequests(ctx context.Context, workerID string) (*natsreq.Server, error) {
	r := w.cfg.Requests
	srv, err := natsreq.NewServer(natsreq.ServerConfig{WorkerID: workerID, EngineURL: w.local, IdleTimeout: r.IdleTimeout,
		MaxDuration: r.MaxDuration, MaxPending: r.MaxPending}, w.nc, w.base)
	if err != nil {
		return nil, fmt.Errorf("worker: requests over nats: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, natsConnectTimeout)
	defer cancel()
	if err := srv.Start(cctx); err != nil {
		return nil, fmt.Errorf("worker: requests over nats: %w", err)
	}
	return srv, nil
}
