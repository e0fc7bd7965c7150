package testkit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority made for one test: TLS servers and clients
// of the test (etcd, kube-apiserver, a worker behind TLS) present
// certificates it issued, and their peers trust Pool.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Cert is a certificate and its key, both in DER.
type Cert struct {
	DER    []byte // the certificate
	KeyDER []byte // the private key, SEC 1 ("EC PRIVATE KEY")
	key    *ecdsa.PrivateKey
}

// certSerial numbers every certificate a test binary issues.
var certSerial atomic.Int64

// certValidity is how long a test certificate is valid either side of now:
// long enough for any test, short enough never to outlive one by much.
const certValidity = 24 * time.Hour

// NewCA returns a fresh certificate authority (ECDSA P-256).
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(certSerial.Add(1)),
		Subject:               pkix.Name{CommonName: "infera test CA"},
		NotBefore:             time.Now().Add(-certValidity),
		NotAfter:              time.Now().Add(certValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("create CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("parse CA certificate: %v", err)
	}
	return &CA{Cert: cert, key: key}
}

// Issue returns a certificate for the loopback host (127.0.0.1 and
// localhost) named name, signed by ca, for the given uses (server, client
// or both).
func (ca *CA) Issue(t testing.TB, name string, usage ...x509.ExtKeyUsage) Cert {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(certSerial.Add(1)),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-certValidity),
		NotAfter:     time.Now().Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("issue certificate %s: %v", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("marshal key of %s: %v", name, err)
	}
	return Cert{DER: der, KeyDER: keyDER, key: key}
}

// Pool returns a certificate pool that trusts ca.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// PEM returns ca's certificate in PEM.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// WriteCA writes ca's certificate in PEM to dir/name and returns its path.
func (ca *CA) WriteCA(t testing.TB, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	writeFile(t, path, ca.PEM())
	return path
}

// TLS returns c as a tls.Certificate for a tls.Config.
func (c Cert) TLS() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{c.DER}, PrivateKey: c.key}
}

// Write writes c's certificate and key in PEM to dir/certName and
// dir/keyName and returns their paths.
func (c Cert) Write(t testing.TB, dir, certName, keyName string) (certPath, keyPath string) {
	t.Helper()
	certPath, keyPath = filepath.Join(dir, certName), filepath.Join(dir, keyName)
	writeFile(t, certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.DER}))
	writeFile(t, keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: c.KeyDER}))
	return certPath, keyPath
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	return key
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
