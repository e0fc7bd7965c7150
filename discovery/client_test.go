package discovery_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
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
	ca, caKey := newCA(t)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	issue(t, ca, caKey, dir, "server", x509.ExtKeyUsageServerAuth)
	issue(t, ca, caKey, dir, "client", x509.ExtKeyUsageClientAuth)

	addr := testkit.FreeAddr(t)
	u := url.URL{Scheme: "https", Host: addr}
	ec := embed.NewConfig()
	ec.Dir = t.TempDir()
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{u}, []url.URL{u}
	peer := url.URL{Scheme: "http", Host: testkit.FreeAddr(t)}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	ec.ClientTLSInfo.CertFile = filepath.Join(dir, "server.pem")
	ec.ClientTLSInfo.KeyFile = filepath.Join(dir, "server-key.pem")
	ec.ClientTLSInfo.TrustedCAFile = filepath.Join(dir, "ca.pem")
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
		CertFile:  filepath.Join(dir, "client.pem"),
		KeyFile:   filepath.Join(dir, "client-key.pem"),
		CAFile:    filepath.Join(dir, "ca.pem"),
	}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(t.Context(), "/k", "v"); err != nil {
		t.Fatalf("put over mutual TLS: %v", err)
	}

	// Without the client certificate the server refuses the handshake.
	noCert, err := discovery.NewClient(config.Etcd{Endpoints: []string{u.String()}, CAFile: filepath.Join(dir, "ca.pem")}, zerolog.Nop())
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

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "infera test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// issue writes <name>.pem and <name>-key.pem signed by ca, valid for 127.0.0.1.
func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, dir, name string, usage x509.ExtKeyUsage) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	writePEM(t, filepath.Join(dir, name+"-key.pem"), "EC PRIVATE KEY", keyDER)
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
