package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/discovery/kube/kubetest"
	"github.com/infera/infera/internal/testkit"
)

// --enable-scaling-api needs Kubernetes credentials: without them serve
// does not start; with a kubeconfig it starts (whatever the discovery
// backend) and says where it scales.
func TestServeScalingAPICredentials(t *testing.T) {
	var out bytes.Buffer
	code := run([]string{"infera", "serve", "--listen", "127.0.0.1:0", "--embedded-etcd-listen", "127.0.0.1:0",
		"--embedded-etcd-dir", t.TempDir(), "--enable-scaling-api", "--kubeconfig", t.TempDir() + "/none"}, &out, &out)
	if code == 0 || !strings.Contains(out.String(), "scaling api: kubernetes credentials") {
		t.Fatalf("exit %d: %s", code, out.String())
	}

	api := kubetest.Start(t)
	var stderr testkit.LogSink
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- newApp(io.Discard, &stderr).RunContext(ctx, []string{"infera", "serve",
			"--listen", "127.0.0.1:0", "--embedded-etcd-listen", "127.0.0.1:0", "--embedded-etcd-dir", t.TempDir(),
			"--enable-scaling-api", "--kubeconfig", api.Kubeconfig(t), "--k8s-namespace", "fleet"})
	}()
	msg := "scaling API enabled: GET/POST /v1/admin/scale resizes this deployment's pools (needs RBAC to patch inferadeployments)"
	if ns := logField(t, &stderr, msg, "namespace"); ns != "fleet" {
		t.Fatalf("namespace %v, want fleet", ns)
	}
	logField(t, &stderr, "infera serve listening", "addr")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
}
