package discovery_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
	"github.com/infera/infera/internal/testkit"
)

func TestNewClientConfigErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		cfg     config.Etcd
		invalid bool // wraps config.ErrInvalid (a usage error, exit 2)
	}{
		{"no endpoints", config.Etcd{}, true},
		{"cert without key", config.Etcd{Endpoints: []string{"127.0.0.1:1"}, CertFile: "c.pem"}, true},
		{"tls over http", config.Etcd{Endpoints: []string{"http://127.0.0.1:1"}, CAFile: notPEM}, true},
		{"ca not pem", config.Etcd{Endpoints: []string{"127.0.0.1:1"}, CAFile: notPEM}, true},
		{"ca missing", config.Etcd{Endpoints: []string{"127.0.0.1:1"}, CAFile: filepath.Join(dir, "nope")}, false},
		{"cert missing", config.Etcd{Endpoints: []string{"127.0.0.1:1"}, CertFile: filepath.Join(dir, "c"), KeyFile: filepath.Join(dir, "k")}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cli, err := discovery.NewClient(tt.cfg, zerolog.Nop())
			if err == nil {
				cli.Close()
				t.Fatal("client built")
			}
			if errors.Is(err, config.ErrInvalid) != tt.invalid {
				t.Fatalf("err = %v; wraps config.ErrInvalid = %v, want %v", err, !tt.invalid, tt.invalid)
			}
		})
	}
}

// Username and password reach etcd: with auth enabled, the right password
// works and a wrong one is refused.
func TestNewClientAuth(t *testing.T) {
	eps := etcdtest.Start(t)
	admin := etcdtest.Client(t, eps)
	ctx := t.Context()
	if _, err := admin.UserAdd(ctx, "root", "s3cret"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}

	// The dial authenticates, and etcd checks the password with bcrypt
	// (cost 10): under -race on a loaded 2-core box that alone can take
	// longer than the default 5 s dial timeout.
	const dial = time.Minute
	cli, err := discovery.NewClient(config.Etcd{Endpoints: eps, Username: "root", Password: "s3cret", DialTimeout: dial}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("put with credentials: %v", err)
	}
	if bad, err := discovery.NewClient(config.Etcd{Endpoints: eps, Username: "root", Password: "wrong", DialTimeout: dial}, zerolog.Nop()); err == nil {
		bad.Close()
		t.Fatal("wrong password accepted")
	}
}

// Client certificate, key and CA reach the TLS handshake of an etcd that
// requires client certificates.
func TestNewClientTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.NewCA(t)
	caFile := ca.WriteCA(t, dir, "ca.pem")
	serverCert, serverKey := ca.Issue(t, "server", x509.ExtKeyUsageServerAuth).Write(t, dir, "server.pem", "server-key.pem")
	clientCert, clientKey := ca.Issue(t, "client", x509.ExtKeyUsageClientAuth).Write(t, dir, "client.pem", "client-key.pem")

	addr := testkit.FreeAddr(t)
	u := url.URL{Scheme: "https", Host: addr}
	ec := embed.NewConfig()
	ec.Dir = t.TempDir()
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{u}, []url.URL{u}
	peer := url.URL{Scheme: "http", Host: testkit.FreeAddr(t)}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	ec.ClientTLSInfo.CertFile = serverCert
	ec.ClientTLSInfo.KeyFile = serverKey
	ec.ClientTLSInfo.TrustedCAFile = caFile
	ec.ClientTLSInfo.ClientCertAuth = true
	e, err := embed.StartEtcd(ec)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(waitDeadline):
		t.Fatal("etcd not ready")
	}

	cli, err := discovery.NewClient(config.Etcd{
		Endpoints: []string{u.String()},
		CertFile:  clientCert,
		KeyFile:   clientKey,
		CAFile:    caFile,
	}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(t.Context(), "/k", "v"); err != nil {
		t.Fatalf("put over mutual TLS: %v", err)
	}

	// Without the client certificate the server refuses the handshake.
	noCert, err := discovery.NewClient(config.Etcd{Endpoints: []string{u.String()}, CAFile: caFile}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer noCert.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if _, err := noCert.Put(ctx, "/k", "v"); err == nil {
		t.Fatal("put without a client certificate succeeded")
	}
}
