package discovery

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"

	"github.com/infera/infera/internal/freeport"
)

// ErrEmbedded is wrapped by errors starting the embedded etcd.
var ErrEmbedded = errors.New("embedded etcd")

const (
	// DefaultEmbeddedListen is where `infera serve` runs its embedded etcd.
	DefaultEmbeddedListen = "127.0.0.1:2379"
	// DefaultEmbeddedName names the single member.
	DefaultEmbeddedName = "infera"
	// embeddedReadyTimeout bounds the wait for the member to elect itself.
	embeddedReadyTimeout = 30 * time.Second
)

// EmbeddedConfig configures a single-node etcd run inside the process.
type EmbeddedConfig struct {
	// ClientListen is host:port for clients; default 127.0.0.1:2379. Port 0
	// picks a free port (see Endpoints for the one chosen).
	ClientListen string
	// PeerListen is host:port for the (unused) peer protocol; default
	// 127.0.0.1 on a free port, so it never collides with a real member.
	PeerListen string
	// Dir is the data directory, created 0700 if missing. Required.
	Dir string
	// Name of the member; default "infera". Keep it stable across restarts
	// on the same Dir.
	Name string
}

// Embedded is a running single-node etcd.
type Embedded struct {
	etcd      *embed.Etcd
	endpoints []string
	closeOnce sync.Once
	closing   *atomic.Bool
}

// StartEmbedded starts a single-node etcd and waits until it serves (it has
// elected itself), or fails after 30s. etcd's own logs reach log at error
// level only. Call Close to stop it.
func StartEmbedded(cfg EmbeddedConfig, log zerolog.Logger) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: data directory is required", ErrEmbedded)
	}
	if cfg.ClientListen == "" {
		cfg.ClientListen = DefaultEmbeddedListen
	}
	if cfg.Name == "" {
		cfg.Name = DefaultEmbeddedName
	}
	clientListen, clientAdvertise, err := listenURLs(cfg.ClientListen)
	if err != nil {
		return nil, fmt.Errorf("%w: client listen %q: %w", ErrEmbedded, cfg.ClientListen, err)
	}
	if cfg.PeerListen == "" {
		cfg.PeerListen = "127.0.0.1:0"
	}
	peerListen, peerAdvertise, err := listenURLs(cfg.PeerListen)
	if err != nil {
		return nil, fmt.Errorf("%w: peer listen %q: %w", ErrEmbedded, cfg.PeerListen, err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: create data directory: %w", ErrEmbedded, err)
	}

	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{clientListen}
	ec.AdvertiseClientUrls = []url.URL{clientAdvertise}
	ec.ListenPeerUrls = []url.URL{peerListen}
	ec.AdvertisePeerUrls = []url.URL{peerAdvertise}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.LogLevel = "error"
	closing := new(atomic.Bool)
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(
		newZapLogger(log.With().Str("component", "embedded_etcd").Logger(), zapcore.ErrorLevel, closing))
	// The JSON gateway (/v3/lease/grant, /v3/kv/put, /v3/watch … as plain
	// HTTP on the client port) is on as in a standalone etcd: Infera's Python
	// workers and servers speak only that, so a mixed fleet can share the
	// embedded etcd.
	ec.EnableGRPCGateway = true
	// Keep an hour of history: enough for any watcher to resume, while a
	// long-running server's database stays bounded.
	ec.AutoCompactionMode = "periodic"
	ec.AutoCompactionRetention = "1h"

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("%w: start: %w", ErrEmbedded, err)
	}
	timer := time.NewTimer(embeddedReadyTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		closing.Store(true)
		e.Close()
		return nil, fmt.Errorf("%w: serve: %w", ErrEmbedded, err)
	case <-timer.C:
		closing.Store(true)
		e.Close()
		return nil, fmt.Errorf("%w: not ready after %s", ErrEmbedded, embeddedReadyTimeout)
	}
	return &Embedded{etcd: e, endpoints: []string{clientAdvertise.String()}, closing: closing}, nil
}

// Endpoints returns the client URLs to give other processes.
func (e *Embedded) Endpoints() []string {
	return append([]string(nil), e.endpoints...)
}

// Err reports a fatal serving error after start (the channel is never closed
// by a normal Close).
func (e *Embedded) Err() <-chan error { return e.etcd.Err() }

// Close stops the server and waits for it; safe to call more than once.
func (e *Embedded) Close() {
	e.closeOnce.Do(func() {
		e.closing.Store(true)
		e.etcd.Close()
	})
}

// listenURLs turns host:port into the URL to bind and the URL to advertise.
// Port 0 is resolved to a free port here because etcd advertises the
// configured URL, which must name the real port. An unspecified host
// (0.0.0.0, ::) is advertised as loopback, the address local workers dial.
func listenURLs(hostPort string) (listen, advertise url.URL, err error) {
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return url.URL{}, url.URL{}, err
	}
	if host == "" {
		return url.URL{}, url.URL{}, errors.New("host is required (e.g. 127.0.0.1 or 0.0.0.0)")
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return url.URL{}, url.URL{}, fmt.Errorf("bad port %q", port)
	}
	if p == 0 {
		if p, err = freePort(host); err != nil {
			return url.URL{}, url.URL{}, err
		}
	}
	ps := strconv.FormatUint(p, 10)
	adv := host
	if a, err := netip.ParseAddr(host); err == nil && a.IsUnspecified() {
		adv = "127.0.0.1"
		if a.Is6() {
			adv = "::1"
		}
	}
	listen = url.URL{Scheme: "http", Host: net.JoinHostPort(host, ps)}
	advertise = url.URL{Scheme: "http", Host: net.JoinHostPort(adv, ps)}
	return listen, advertise, nil
}

// freePort asks the kernel for a free port on host that this process has
// not handed out moments ago (freeport.Pick: the client and the peer port
// must not come out equal). Another process could take it before etcd
// binds it; etcd then fails to start with a clear error.
func freePort(host string) (uint64, error) {
	p, err := freeport.Pick(host)
	if err != nil {
		return 0, err
	}
	return uint64(p), nil
}
