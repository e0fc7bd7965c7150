package discovery

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

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
		// Chained inside the client's own retry interceptors, so they see
		// each attempt and the member it went to.
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(notePeerUnary),
			grpc.WithChainStreamInterceptor(notePeerStream),
		},
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

// memberNoteKey marks a context whose etcd calls note the member they were
// sent to (withMemberNote), so that a call that timed out on a member that
// stopped answering can name it. Only clients built by NewClient note it.
type memberNoteKey struct{}

// withMemberNote returns ctx marked so that the etcd calls made under it
// record their member's address in the returned peer, which the caller
// reads once the call has returned (the interceptors write it on the
// calling goroutine, before the call returns).
func withMemberNote(ctx context.Context) (context.Context, *peer.Peer) {
	p := new(peer.Peer)
	return context.WithValue(ctx, memberNoteKey{}, p), p
}

// memberOf is the address a noted call went to, "" when it reached none.
func memberOf(p *peer.Peer) string {
	if p == nil || p.Addr == nil {
		return ""
	}
	return p.Addr.String()
}

// notePeerUnary asks gRPC for the peer of a unary call made under
// withMemberNote; other calls pass through untouched.
func notePeerUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if p, ok := ctx.Value(memberNoteKey{}).(*peer.Peer); ok {
		opts = append(opts[:len(opts):len(opts)], grpc.Peer(p))
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// notePeerStream records the peer of a stream opened under withMemberNote
// (a lease keepalive) as soon as the stream is open: a stream to a stopped
// member opens, and then nothing answers on it.
func notePeerStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if p, ok := ctx.Value(memberNoteKey{}).(*peer.Peer); ok && err == nil {
		if got, ok := peer.FromContext(cs.Context()); ok {
			*p = *got
		}
	}
	return cs, err
}
