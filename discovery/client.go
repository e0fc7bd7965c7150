package discovery

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"

	"github.com/infera/infera/config"
)

const (
	defaultDialTimeout = 5 * time.Second
	// gRPC keepalive pings detect a half-open connection to etcd; without
	// them a watcher on a dead TCP connection would serve a stale fleet and a
	// registrar would not notice that its keepalives go nowhere.
	dialKeepAliveTime    = 10 * time.Second
	dialKeepAliveTimeout = 5 * time.Second
)

// NewClient builds an etcd client from the shared etcd flags: endpoints,
// dial timeout, username/password and client TLS (certificate, key and CA
// files). The caller chooses the endpoints (e.g. those of an embedded etcd).
// Dialing does not block unless a username is set (the client then fetches
// an auth token within the dial timeout), so workers may start before etcd.
// The client's own logs reach log at error level only.
func NewClient(cfg config.Etcd, log zerolog.Logger) (*clientv3.Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: no etcd endpoints", config.ErrInvalid)
	}
	tlsCfg, err := clientTLS(cfg)
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		for _, ep := range cfg.Endpoints {
			// clientv3 silently drops TLS for http:// endpoints; refuse
			// rather than send credentials in clear text.
			if strings.HasPrefix(ep, "http://") {
				return nil, fmt.Errorf("%w: etcd endpoint %q is plain http but TLS files are set", config.ErrInvalid, ep)
			}
		}
	}
	dial := cfg.DialTimeout
	if dial <= 0 {
		dial = defaultDialTimeout
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          dial,
		DialKeepAliveTime:    dialKeepAliveTime,
		DialKeepAliveTimeout: dialKeepAliveTimeout,
		PermitWithoutStream:  true,
		TLS:                  tlsCfg,
		Username:             cfg.Username,
		Password:             cfg.Password,
		Logger:               newZapLogger(log.With().Str("component", "etcd_client").Logger(), zapcore.ErrorLevel, nil),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %v: %w", cfg.Endpoints, err)
	}
	return cli, nil
}

// clientTLS returns nil when no TLS file is configured (https:// endpoints
// then still use TLS with the system roots, as clientv3 does by default).
func clientTLS(cfg config.Etcd) (*tls.Config, error) {
	if cfg.CertFile == "" && cfg.KeyFile == "" && cfg.CAFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CertFile != "" || cfg.KeyFile != "" {
		if cfg.CertFile == "" || cfg.KeyFile == "" {
			return nil, fmt.Errorf("%w: etcd client certificate and key must be given together", config.ErrInvalid)
		}
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load etcd client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read etcd CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: etcd CA file %q holds no PEM certificate", config.ErrInvalid, cfg.CAFile)
		}
		tc.RootCAs = pool
	}
	return tc, nil
}
