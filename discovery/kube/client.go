package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Service-account mount read by the in-cluster configuration.
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// ErrNoConfig is returned when neither in-cluster credentials nor a kubeconfig are found.
var ErrNoConfig = errors.New("kube: no in-cluster credentials and no kubeconfig")

// ErrStatus wraps an API server answer that is not 2xx.
var ErrStatus = errors.New("kube: api server status")

// Config says how to reach the API server.
type Config struct {
	// Server is the API server's base URL (https://host:port).
	Server string
	// Token is a bearer token ("" for none).
	Token string
	// CAPEM is the PEM CA bundle that signs the server's certificate (nil: system roots).
	CAPEM []byte
	// CertPEM and KeyPEM are an optional client certificate.
	CertPEM, KeyPEM []byte
	// Insecure skips server certificate verification (kubeconfig's insecure-skip-tls-verify).
	Insecure bool
	// Namespace is the namespace of the credentials' context or service account ("" if unknown).
	Namespace string
}

// LoadConfig returns the in-cluster configuration when the process runs in a
// Pod (KUBERNETES_SERVICE_HOST set and a service-account token mounted),
// else the kubeconfig at path, else $KUBECONFIG, else ~/.kube/config.
func LoadConfig(path string) (Config, error) {
	if path == "" {
		if c, err := InClusterConfig(); err == nil {
			return c, nil
		}
		path = os.Getenv("KUBECONFIG")
		if i := strings.IndexByte(path, os.PathListSeparator); i >= 0 {
			path = path[:i]
		}
	}
	if path == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return Config{}, ErrNoConfig
		}
		path = home + "/.kube/config"
		if _, err := os.Stat(path); err != nil {
			return Config{}, ErrNoConfig
		}
	}
	return LoadKubeconfig(path)
}

// InClusterConfig reads the service account mounted into the Pod.
func InClusterConfig() (Config, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return Config{}, ErrNoConfig
	}
	tok, err := os.ReadFile(serviceAccountDir + "/token")
	if err != nil {
		return Config{}, fmt.Errorf("kube: read service account token: %w", err)
	}
	ca, err := os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		return Config{}, fmt.Errorf("kube: read service account ca: %w", err)
	}
	ns, _ := os.ReadFile(serviceAccountDir + "/namespace")
	return Config{
		Server:    "https://" + net.JoinHostPort(host, port),
		Token:     strings.TrimSpace(string(tok)),
		CAPEM:     ca,
		Namespace: strings.TrimSpace(string(ns)),
	}, nil
}

// kubeconfig holds the fields of a kubeconfig file this package uses.
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Clusters       []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server                   string `json:"server"`
			CertificateAuthority     string `json:"certificate-authority"`
			CertificateAuthorityData string `json:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify"`
		} `json:"cluster"`
	} `json:"clusters"`
	Contexts []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster   string `json:"cluster"`
			User      string `json:"user"`
			Namespace string `json:"namespace"`
		} `json:"context"`
	} `json:"contexts"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			Token                 string `json:"token"`
			TokenFile             string `json:"tokenFile"`
			ClientCertificate     string `json:"client-certificate"`
			ClientCertificateData string `json:"client-certificate-data"`
			ClientKey             string `json:"client-key"`
			ClientKeyData         string `json:"client-key-data"`
		} `json:"user"`
	} `json:"users"`
}

// LoadKubeconfig reads the current context of a kubeconfig file: server, CA,
// token or client certificate (inline data or files), namespace. Exec and
// auth-provider plugins are not supported.
func LoadKubeconfig(path string) (Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("kube: read kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(raw, &kc); err != nil {
		return Config{}, fmt.Errorf("kube: parse kubeconfig %s: %w", path, err)
	}
	var c Config
	found := false
	for _, x := range kc.Contexts {
		if x.Name != kc.CurrentContext {
			continue
		}
		found = true
		c.Namespace = x.Context.Namespace
		for _, cl := range kc.Clusters {
			if cl.Name != x.Context.Cluster {
				continue
			}
			c.Server = cl.Cluster.Server
			c.Insecure = cl.Cluster.InsecureSkipTLSVerify
			if c.CAPEM, err = dataOrFile(cl.Cluster.CertificateAuthorityData, cl.Cluster.CertificateAuthority); err != nil {
				return Config{}, err
			}
		}
		for _, u := range kc.Users {
			if u.Name != x.Context.User {
				continue
			}
			c.Token = u.User.Token
			if c.Token == "" && u.User.TokenFile != "" {
				t, err := os.ReadFile(u.User.TokenFile)
				if err != nil {
					return Config{}, fmt.Errorf("kube: read token file: %w", err)
				}
				c.Token = strings.TrimSpace(string(t))
			}
			if c.CertPEM, err = dataOrFile(u.User.ClientCertificateData, u.User.ClientCertificate); err != nil {
				return Config{}, err
			}
			if c.KeyPEM, err = dataOrFile(u.User.ClientKeyData, u.User.ClientKey); err != nil {
				return Config{}, err
			}
		}
	}
	if !found || c.Server == "" {
		return Config{}, fmt.Errorf("kube: kubeconfig %s: current context %q has no cluster server", path, kc.CurrentContext)
	}
	return c, nil
}

func dataOrFile(b64, file string) ([]byte, error) {
	if b64 != "" {
		b, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, fmt.Errorf("kube: decode kubeconfig data: %w", err)
		}
		return b, nil
	}
	if file == "" {
		return nil, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("kube: read kubeconfig file: %w", err)
	}
	return b, nil
}

// Client makes the few API calls discovery needs.
type Client struct {
	base  string
	token string
	http  *http.Client
}

// NewClient builds a client from a configuration.
func NewClient(c Config) (*Client, error) {
	u, err := url.Parse(c.Server)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("kube: bad server url %q", c.Server)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.Insecure} //nolint:gosec // kubeconfig asks for it
	if len(c.CAPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(c.CAPEM) {
			return nil, fmt.Errorf("kube: no certificate in the ca bundle")
		}
		tc.RootCAs = pool
	}
	if len(c.CertPEM) > 0 {
		cert, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
		if err != nil {
			return nil, fmt.Errorf("kube: client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	tr := &http.Transport{
		TLSClientConfig:       tc,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   4,
	}
	return &Client{base: strings.TrimRight(c.Server, "/"), token: c.Token, http: &http.Client{Transport: tr}}, nil
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// StatusError is a non-2xx answer.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("kube: api server status %d: %s", e.Code, e.Body)
}

// Unwrap makes errors.Is(err, ErrStatus) true.
func (e *StatusError) Unwrap() error { return ErrStatus }

// do sends one request; the caller closes the body of a 2xx answer.
func (c *Client) do(ctx context.Context, method, path, ctype string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("kube: new request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kube: %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, &StatusError{Code: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	return resp, nil
}

// PatchPod merge-patches one Pod.
func (c *Client) PatchPod(ctx context.Context, ns, name string, patch []byte) error {
	resp, err := c.do(ctx, http.MethodPatch, "/api/v1/namespaces/"+url.PathEscape(ns)+"/pods/"+url.PathEscape(name),
		"application/merge-patch+json", patch)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, MaxPodBytes))
	return resp.Body.Close()
}

// Do sends one request and returns the body of a 2xx answer (at most
// MaxPodBytes); other answers are a *StatusError.
func (c *Client) Do(ctx context.Context, method, path, ctype string, body []byte) ([]byte, error) {
	resp, err := c.do(ctx, method, path, ctype, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxPodBytes))
	if err != nil {
		return nil, fmt.Errorf("kube: read %s %s: %w", method, path, err)
	}
	return b, nil
}
