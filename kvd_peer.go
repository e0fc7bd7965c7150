package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/kvd"
	"github.com/infera/infera/kvd/peer"
	"github.com/infera/infera/transport"
)

// peerScratchBytes bounds one pull batch (and so the largest block pulled).
const peerScratchBytes = 64 << 20

// kvdPeer is kvd's side of kvd-to-kvd pulls: the puller and prefetcher
// that prefetch hints naming a source use, and, with --peer-listen, the
// listener that lets other hosts' kvds pull from this one.
type kvdPeer struct {
	pullEng    *transport.TCP
	puller     *peer.Puller
	prefetcher *peer.Prefetcher
	srvEng     *transport.TCP
	srv        *peer.Server
	addr       string
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

// startPeer starts the pull side always and the serving side when
// configured; stop undoes both, newest first.
func startPeer(ctx context.Context, cfg config.KVD, store *kvd.Store, log zerolog.Logger) (*kvdPeer, error) {
	log = log.With().Str("component", "kvd-peer").Logger()
	p := &kvdPeer{}
	var err error
	if p.pullEng, err = transport.NewTCP(transport.TCPConfig{Log: log}); err != nil {
		return nil, fmt.Errorf("kvd peer: %w", err)
	}
	if p.puller, err = peer.NewPuller(p.pullEng, peerScratchBytes, []byte(cfg.PeerSecret)); err != nil {
		p.pullEng.Close()
		return nil, err
	}
	p.prefetcher = peer.NewPrefetcher(store, p.puller, cfg.PrefetchQueue, log)
	if cfg.PeerListen == "" || store.Arena() == nil {
		return p, nil
	}
	if err := p.listen(ctx, cfg, store, log); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// listen serves locate requests on --peer-listen and the arena's bytes
// on the port after it.
func (p *kvdPeer) listen(ctx context.Context, cfg config.KVD, store *kvd.Store, log zerolog.Logger) error {
	ln, err := net.Listen("tcp", cfg.PeerListen)
	if err != nil {
		return fmt.Errorf("kvd peer listen: %w", err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	n, _ := strconv.Atoi(port)
	tln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(n+1)))
	if err != nil {
		ln.Close()
		return fmt.Errorf("kvd peer listen (arena transport, the port after --peer-listen): %w", err)
	}
	adv := cfg.PeerAdvertise
	if adv == "" {
		adv = host
	}
	_, tport, _ := net.SplitHostPort(tln.Addr().String())
	if p.srvEng, err = transport.NewTCP(transport.TCPConfig{Listener: tln, Advertise: net.JoinHostPort(adv, tport), Log: log}); err != nil {
		ln.Close()
		tln.Close()
		return fmt.Errorf("kvd peer: %w", err)
	}
	if p.srv, err = peer.NewServer(store, p.srvEng, peer.ServerOptions{Secret: []byte(cfg.PeerSecret), Allow: cfg.PeerAllow, Log: log}); err != nil {
		ln.Close()
		return err
	}
	p.addr = net.JoinHostPort(adv, port)
	sctx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if err := p.srv.Serve(sctx, ln); err != nil {
			log.Error().Err(err).Msg("kvd peer listener stopped")
		}
	}()
	log.Info().Str("peer_listen", p.addr).Str("arena_transport", p.srvEng.Addr()).Bool("secret", cfg.PeerSecret != "").
		Int("allowed_networks", len(cfg.PeerAllow)).Msg("kvd peer listener: other hosts' kvds may pull from this arena")
	return nil
}

// hint is kvd.ServerOptions.PeerPrefetch.
func (p *kvdPeer) hint(source string, model, compat []byte, keys [][]byte, deadline time.Duration) {
	p.prefetcher.Hint(source, model, compat, keys, deadline)
}

func (p *kvdPeer) collectors() []prometheus.Collector {
	return []prometheus.Collector{p.prefetcher.Collector()}
}

func (p *kvdPeer) stop() {
	if p.cancel != nil {
		p.cancel()
		p.wg.Wait()
	}
	if p.srv != nil {
		_ = p.srv.Close()
	}
	if p.srvEng != nil {
		_ = p.srvEng.Close()
	}
	p.prefetcher.Close()
	_ = p.puller.Close()
	_ = p.pullEng.Close()
}
