package main

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
)

// kvdRegistry is kvd's side of the kvd registry (--etcd-endpoints): its
// own record kept under a lease by discovery's registrar, and a watch of
// every kvd's record that fences the peer listener (registryFence).
type kvdRegistry struct {
	cli    *clientv3.Client
	reg    *discovery.KVDRegistrar
	cancel context.CancelFunc
	wg     sync.WaitGroup
	log    zerolog.Logger
}

// registryFence admits the hosts of the registered kvds; before the first
// list it admits none (ServerOptions.Registered).
type registryFence struct {
	hosts atomic.Pointer[map[netip.Addr]struct{}]
	log   zerolog.Logger
}

func (f *registryFence) registered(ip netip.Addr) bool {
	m := f.hosts.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[ip]
	return ok
}

// hostResolveTimeout bounds resolving one registered host name.
const hostResolveTimeout = 2 * time.Second

// update is the watcher's onChange: IP hosts are taken as they are, host
// names are resolved (a name that does not resolve admits nothing).
func (f *registryFence) update(s *discovery.KVDSnapshot) {
	m := make(map[netip.Addr]struct{}, len(s.KVDs))
	for _, k := range s.KVDs {
		if a, err := netip.ParseAddr(k.Host); err == nil {
			m[a.Unmap()] = struct{}{}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), hostResolveTimeout)
		addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", k.Host)
		cancel()
		if err != nil {
			f.log.Warn().Err(err).Str("host", k.Host).Str("kvd", k.Peer).Msg("kvd registry: host does not resolve; its connections are refused")
			continue
		}
		for _, a := range addrs {
			m[a.Unmap()] = struct{}{}
		}
	}
	f.hosts.Store(&m)
	f.log.Debug().Int("kvds", len(s.KVDs)).Int("addresses", len(m)).Int64("revision", s.Revision).Msg("kvd registry: peer listener admits")
}

// startRegistry registers rec and watches the registry into fence (nil:
// no listener to fence). stop revokes the record.
func startRegistry(ctx context.Context, cfg config.KVD, rec discovery.KVDRecord, fence *registryFence, log zerolog.Logger) (*kvdRegistry, error) {
	log = log.With().Str("component", "kvd-registry").Logger()
	cli, err := discovery.NewClient(cfg.Etcd, log)
	if err != nil {
		return nil, err
	}
	r := &kvdRegistry{cli: cli, log: log}
	rctx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	if fence != nil {
		w := discovery.NewKVDWatcher(cli, cfg.Etcd.Prefix, log, fence.update)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			_ = w.Run(rctx) // returns nil when rctx ends
		}()
	}
	r.reg = discovery.NewKVDRegistrar(cli, cfg.Etcd.Prefix, rec, discovery.RegistrarOptions{TTL: cfg.LeaseTTL, KeepAliveInterval: cfg.KeepAliveInterval}, log)
	if err := r.reg.Register(ctx); err != nil {
		// Run keeps trying; the kvd serves meanwhile.
		log.Warn().Err(err).Msg("kvd registry: first registration failed; retrying")
	} else {
		log.Info().Str("host", rec.Host).Str("peer", rec.Peer).Str("transport", rec.Transport.Kind).Str("transport_addr", rec.Transport.Addr).
			Str("prefix", cfg.Etcd.Prefix).Msg("kvd registered")
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		_ = r.reg.Run(rctx)
	}()
	return r, nil
}

// stop revokes the record (bounded), ends the watch and closes the client.
func (r *kvdRegistry) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if err := r.reg.Revoke(ctx); err != nil {
		r.log.Warn().Err(err).Msg("kvd registry: revoke failed; the record expires with its lease")
	}
	cancel()
	r.cancel()
	r.wg.Wait()
	_ = r.cli.Close()
}
