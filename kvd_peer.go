package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
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
	pullEng    transport.Engine
	puller     *peer.Puller
	prefetcher *peer.Prefetcher
	srvEng     transport.Engine // the pull engine itself with Mooncake
	srv        *peer.Server
	admit      atomic.Pointer[peer.Server] // srv, once it fences the arena's port
	addr       string
	segment    string         // the Mooncake segment name, with --peer-transport mooncake
	fence      *registryFence // with --etcd-endpoints
	registry   *kvdRegistry
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

// startPeer starts the pull side always and the serving side when
// configured; stop undoes both, newest first.
func startPeer(ctx context.Context, cfg config.KVD, store *kvd.Store, log zerolog.Logger) (*kvdPeer, error) {
	log = log.With().Str("component", "kvd-peer").Logger()
	p := &kvdPeer{}
	var err error
	if cfg.PeerTransport == "mooncake" {
		// One Mooncake engine registers the arena and reads other kvds'.
		name := cfg.PeerMooncakeName
		if name == "" {
			name = cfg.PeerListen
		}
		if name == "" {
			host, _ := os.Hostname()
			name = host + ":0"
		}
		p.segment = name
		if p.pullEng, err = newMooncakeEngine(cfg, name); err != nil {
			return nil, fmt.Errorf("kvd peer (--peer-transport mooncake): %w", err)
		}
		log.Info().Str("segment", name).Str("metadata", cfg.PeerMooncakeMetadata).Msg("kvd peer transport: mooncake transfer engine")
	} else if p.pullEng, err = transport.NewTCP(transport.TCPConfig{LocalAddr: localAddr(pullSource(cfg)), Log: log}); err != nil {
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
	if len(cfg.Etcd.Endpoints) > 0 {
		p.fence = &registryFence{log: log}
	}
	desc, err := p.listen(ctx, cfg, store, log)
	if err != nil {
		p.stop()
		return nil, err
	}
	if p.fence != nil {
		p.puller.SetSource(pullSource(cfg))
		rec := discovery.KVDRecord{Host: cfg.PeerRegistryHost(), Peer: p.addr, Transport: desc}
		if p.registry, err = startRegistry(ctx, cfg, rec, p.fence, log); err != nil {
			p.stop()
			return nil, err
		}
	}
	return p, nil
}

// pullSource is the local address pulls dial from: with the kvd registry
// other kvds admit this one's pulls by its registered host, so they come
// from the --peer-listen address when it names one (nil: the system's
// choice: the zero Addr).
func pullSource(cfg config.KVD) netip.Addr {
	if len(cfg.Etcd.Endpoints) == 0 {
		return netip.Addr{}
	}
	host, _, _ := net.SplitHostPort(cfg.PeerListen)
	a, err := netip.ParseAddr(host)
	if err != nil || a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}

// localAddr is a dialer's local address for ip (nil for the zero Addr).
func localAddr(ip netip.Addr) net.Addr {
	if !ip.IsValid() {
		return nil
	}
	return &net.TCPAddr{IP: ip.AsSlice()}
}

// listen serves locate requests on --peer-listen and the arena's bytes
// on the port after it; it returns the arena's transport as the kvd
// registry describes it.
func (p *kvdPeer) listen(ctx context.Context, cfg config.KVD, store *kvd.Store, log zerolog.Logger) (discovery.KVDTransport, error) {
	var desc discovery.KVDTransport
	ln, err := net.Listen("tcp", cfg.PeerListen)
	if err != nil {
		return desc, fmt.Errorf("kvd peer listen: %w", err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	adv := cfg.PeerAdvertise
	if adv == "" {
		adv = host
	}
	transportAddr := ""
	if cfg.PeerTransport == "mooncake" {
		p.srvEng = p.pullEng
		transportAddr = "mooncake"
		desc = discovery.KVDTransport{Kind: discovery.KVDTransportMooncake, Addr: p.segment}
	} else {
		n, _ := strconv.Atoi(port)
		tln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(n+1)))
		if err != nil {
			ln.Close()
			return desc, fmt.Errorf("kvd peer listen (arena transport, the port after --peer-listen): %w", err)
		}
		_, tport, _ := net.SplitHostPort(tln.Addr().String())
		tcfg := transport.TCPConfig{Listener: tln, Advertise: net.JoinHostPort(adv, tport), Log: log}
		if p.fence != nil || len(cfg.PeerAllow) > 0 {
			// The arena's bytes go to whom the locate listener serves;
			// nobody before that listener's server exists.
			tcfg.Admit = func(remote net.Addr) bool {
				srv := p.admit.Load()
				return srv != nil && srv.Admit(remote)
			}
		}
		eng, err := transport.NewTCP(tcfg)
		if err != nil {
			ln.Close()
			tln.Close()
			return desc, fmt.Errorf("kvd peer: %w", err)
		}
		p.srvEng, transportAddr = eng, eng.Addr()
		desc = discovery.KVDTransport{Kind: discovery.KVDTransportTCP, Addr: eng.Addr()}
	}
	opt := peer.ServerOptions{Secret: []byte(cfg.PeerSecret), Allow: cfg.PeerAllow, Hint: p.prefetcher.HintWait, Log: log}
	if p.fence != nil {
		opt.Registered = p.fence.registered
	}
	if p.srv, err = peer.NewServer(store, p.srvEng, opt); err != nil {
		ln.Close()
		return desc, err
	}
	p.admit.Store(p.srv)
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
	log.Info().Str("peer_listen", p.addr).Str("arena_transport", transportAddr).Bool("secret", cfg.PeerSecret != "").
		Int("allowed_networks", len(cfg.PeerAllow)).Bool("registered_only", p.fence != nil).Msg("kvd peer listener: other hosts' kvds may pull from this arena")
	return desc, nil
}

// hint is kvd.ServerOptions.PeerPrefetch.
func (p *kvdPeer) hint(source string, model, compat []byte, keys [][]byte, deadline time.Duration) {
	p.prefetcher.Hint(source, model, compat, keys, deadline)
}

func (p *kvdPeer) collectors() []prometheus.Collector {
	cs := []prometheus.Collector{p.prefetcher.Collector()}
	if p.srv != nil {
		cs = append(cs, p.srv.Collector())
	}
	return cs
}

func (p *kvdPeer) stop() {
	if p.registry != nil {
		p.registry.stop()
	}
	if p.cancel != nil {
		p.cancel()
		p.wg.Wait()
	}
	if p.srv != nil {
		_ = p.srv.Close()
	}
	if p.srvEng != nil && p.srvEng != p.pullEng {
		_ = p.srvEng.Close()
	}
	p.prefetcher.Close()
	_ = p.puller.Close()
	_ = p.pullEng.Close()
}
