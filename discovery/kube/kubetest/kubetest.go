// Package kubetest starts a real kube-apiserver (built by
// scripts/kube-apiserver.sh when absent) on an etcd of its own for tests,
// and removes both when the test ends.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/infera/infera/discovery/kube"
	"github.com/infera/infera/internal/testkit"
)

// Token is the static bearer token of the test API server (system:masters).
const Token = "kubetest-token"

// UserTokens are static bearer tokens of users without any group: the API
// server authorizes with RBAC, so they may do only what a test grants them
// with a Role and RoleBinding naming the user (the map's key).
var UserTokens = map[string]string{"alice": "kubetest-alice", "bob": "kubetest-bob", "carol": "kubetest-carol"}

// Server is a running kube-apiserver.
type Server struct {
	Config kube.Config
	t      testing.TB
	dir    string
	bin    string
	port   int
	etcd   string
	cmd    *exec.Cmd
}

func repoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..", "..")
}

// Binary returns the kube-apiserver binary, building it if needed.
func Binary(t testing.TB) string {
	out, err := exec.Command("bash", filepath.Join(repoRoot(), "scripts", "kube-apiserver.sh")).Output()
	if err != nil {
		t.Fatalf("build kube-apiserver: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Start runs etcd and kube-apiserver until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	// CA and serving certificate for 127.0.0.1.
	ca := testkit.NewCA(t)
	ca.WriteCA(t, dir, "ca.crt")
	ca.Issue(t, "127.0.0.1", x509.ExtKeyUsageServerAuth).Write(t, dir, "srv.crt", "srv.key")
	saKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	writePEM(t, filepath.Join(dir, "sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey))
	pub, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	writePEM(t, filepath.Join(dir, "sa.pub"), "PUBLIC KEY", pub)
	tokens := Token + ",admin,admin,system:masters\n"
	for user, tok := range UserTokens {
		tokens += tok + "," + user + "," + user + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}

	ep, ec := testkit.FreePort(t), testkit.FreePort(t)
	etcd := exec.Command("etcd", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:"+strconv.Itoa(ec), "--advertise-client-urls", "http://127.0.0.1:"+strconv.Itoa(ec),
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(ep), "--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(ep),
		"--initial-cluster", "default=http://127.0.0.1:"+strconv.Itoa(ep), "--unsafe-no-fsync",
		"--experimental-watch-progress-notify-interval=200ms", "--log-level", "error")
	if err := etcd.Start(); err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	t.Cleanup(func() { _ = etcd.Process.Kill(); _ = etcd.Wait() })

	s := &Server{t: t, dir: dir, bin: bin, port: testkit.FreePort(t), etcd: "http://127.0.0.1:" + strconv.Itoa(ec)}
	s.Config = kube.Config{Server: "https://127.0.0.1:" + strconv.Itoa(s.port), Token: Token, CAPEM: ca.PEM(), Namespace: "default"}
	s.startAPI()
	t.Cleanup(s.stopAPI)
	return s
}

func (s *Server) startAPI() {
	d := s.dir
	s.cmd = exec.Command(s.bin, "--etcd-servers="+s.etcd, "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(s.port), "--tls-cert-file="+d+"/srv.crt", "--tls-private-key-file="+d+"/srv.key",
		"--client-ca-file="+d+"/ca.crt", "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+d+"/sa.pub", "--service-account-signing-key-file="+d+"/sa.key",
		"--service-cluster-ip-range=10.0.0.0/24", "--token-auth-file="+d+"/tokens.csv", "--authorization-mode=RBAC",
		"--disable-admission-plugins=ServiceAccount", "--endpoint-reconciler-type=none")
	logf, err := os.Create(filepath.Join(d, "apiserver.log"))
	if err != nil {
		s.t.Fatal(err)
	}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start kube-apiserver: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.Config.CAPEM)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(http.MethodGet, s.Config.Server+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+Token)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(d, "apiserver.log"))
	s.t.Fatalf("kube-apiserver not ready: %s", tail(log))
}

func (s *Server) stopAPI() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart stops and starts the API server on the same port and etcd.
func (s *Server) Restart() {
	s.stopAPI()
	s.startAPI()
}

func tail(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Kubeconfig writes a kubeconfig for the server (namespace default) into
// the test's temporary directory and returns its path, for child processes
// (infera serve and worker take it with --kubeconfig).
func (s *Server) Kubeconfig(t testing.TB) string {
	t.Helper()
	ca := base64.StdEncoding.EncodeToString(s.Config.CAPEM)
	kc := "apiVersion: v1\nkind: Config\ncurrent-context: kubetest\n" +
		"clusters:\n- name: kubetest\n  cluster:\n    server: " + s.Config.Server + "\n    certificate-authority-data: " + ca + "\n" +
		"users:\n- name: admin\n  user:\n    token: " + Token + "\n" +
		"contexts:\n- name: kubetest\n  context:\n    cluster: kubetest\n    user: admin\n    namespace: default\n"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// CreateRunningPod creates Pod name in namespace default with labels and a
// node name (so that a graceful delete sets a deletion timestamp and keeps
// the Pod), then sets its phase to Running through the status subresource:
// there is no kubelet.
func CreateRunningPod(t testing.TB, cli *kube.Client, name string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	lb, _ := json.Marshal(labels)
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":` + strconv.Quote(name) + `,"labels":` + string(lb) + `},` +
		`"spec":{"nodeName":"node-a","containers":[{"name":"w","image":"infera"}]}}`
	const pods = "/api/v1/namespaces/default/pods"
	if _, err := cli.Do(ctx, http.MethodPost, pods, "application/json", []byte(pod)); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	if _, err := cli.Do(ctx, http.MethodPatch, pods+"/"+name+"/status", "application/merge-patch+json",
		[]byte(`{"status":{"phase":"Running"}}`)); err != nil {
		t.Fatalf("pod %s status: %v", name, err)
	}
}

// As returns the server's configuration with another bearer token.
func (s *Server) As(token string) kube.Config {
	c := s.Config
	c.Token = token
	return c
}

// Apply creates the objects of a YAML or JSON document (several YAML
// documents separated by "---" lines) as the admin: namespaced kinds in
// namespace default. Kinds it knows: CustomResourceDefinition (it waits
// until the new resource is served), Role, RoleBinding, Pod, and any
// InferaDeployment.
func Apply(t testing.TB, cli *kube.Client, doc []byte) {
	t.Helper()
	ctx := context.Background()
	for _, d := range bytes.Split(doc, []byte("\n---\n")) {
		if len(bytes.TrimSpace(d)) == 0 {
			continue
		}
		js, err := yaml.YAMLToJSON(d)
		if err != nil {
			t.Fatalf("apply: %v", err)
		}
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Group string `json:"group"`
				Names struct {
					Plural string `json:"plural"`
				} `json:"names"`
				Versions []struct {
					Name string `json:"name"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(js, &head); err != nil {
			t.Fatalf("apply: %v", err)
		}
		var path string
		switch head.Kind {
		case "CustomResourceDefinition":
			path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
		case "Role":
			path = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles"
		case "RoleBinding":
			path = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings"
		case "Pod":
			path = "/api/v1/namespaces/default/pods"
		case "InferaDeployment":
			path = "/apis/" + kube.CRGroup + "/" + kube.CRVersion + "/namespaces/default/" + kube.CRPlural
		default:
			t.Fatalf("apply: no path known for kind %q", head.Kind)
		}
		if _, err := cli.Do(ctx, http.MethodPost, path, "application/json", js); err != nil {
			t.Fatalf("apply %s %s: %v", head.Kind, head.Metadata.Name, err)
		}
		if head.Kind != "CustomResourceDefinition" || len(head.Spec.Versions) == 0 {
			continue
		}
		list := "/apis/" + head.Spec.Group + "/" + head.Spec.Versions[0].Name + "/" + head.Spec.Names.Plural
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := cli.Do(ctx, http.MethodGet, list, "", nil)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("custom resource %s not served: %v", list, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
