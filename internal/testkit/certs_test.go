package testkit

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
)

// TestCAHandshake: a server presenting a certificate the CA issued is
// trusted by a client with the CA's pool (for 127.0.0.1 and localhost),
// and the written PEM files load as a key pair; a client trusting another
// CA refuses it.
func TestCAHandshake(t *testing.T) {
	ca := NewCA(t)
	server := ca.Issue(t, "server", x509.ExtKeyUsageServerAuth)
	dir := t.TempDir()
	certPath, keyPath := server.Write(t, dir, "server.pem", "server-key.pem")
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		t.Fatalf("load written key pair: %v", err)
	}
	caPEM, err := os.ReadFile(ca.WriteCA(t, dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("written CA is not PEM")
	}
	for _, tc := range []struct {
		name   string
		server tls.Certificate
		roots  *x509.CertPool
		host   string
		ok     bool
	}{
		{"ip, pool", server.TLS(), ca.Pool(), "127.0.0.1", true},
		{"localhost, written files", pair, roots, "localhost", true},
		{"another CA", server.TLS(), NewCA(t).Pool(), "127.0.0.1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := TCPPair(t)
			srv := tls.Server(a, &tls.Config{Certificates: []tls.Certificate{tc.server}, MinVersion: tls.VersionTLS12})
			done := make(chan error, 1)
			go func() { done <- srv.Handshake() }()
			cli := tls.Client(b, &tls.Config{RootCAs: tc.roots, ServerName: tc.host, MinVersion: tls.VersionTLS12})
			err := cli.Handshake()
			if tc.ok && err != nil {
				t.Fatalf("handshake: %v", err)
			}
			if !tc.ok && err == nil {
				t.Fatal("handshake with an untrusted certificate succeeded")
			}
			_ = cli.Close()
			_ = srv.Close()
			<-done
		})
	}
}
