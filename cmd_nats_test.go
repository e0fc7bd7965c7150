package main

import (
	"bytes"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/infera/infera/internal/natstest"
	"github.com/infera/infera/internal/testkit"
)

// TestNATSRefusedAtStartup: serve and worker stop at start-up with one
// clear error when the NATS server refuses their credentials, and do not
// print the password.
func TestNATSRefusedAtStartup(t *testing.T) {
	ns := natstest.Start(t, "--user", "infera", "--pass", "s3cret")
	url := "nats://infera:wrongpw@" + ns.Addr
	for _, args := range [][]string{
		{"infera", "serve", "--listen", "127.0.0.1:0", "--router-policy", "kv-aware", "--tokenizer", "bytes",
			"--kv-event-transport", "nats", "--nats-server", url,
			"--embedded-etcd-listen", "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t)), "--embedded-etcd-dir", filepath.Join(t.TempDir(), "etcd")},
		{"infera", "serve", "--listen", "127.0.0.1:0", "--request-transport", "nats", "--nats-server", url,
			"--embedded-etcd-listen", "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t)), "--embedded-etcd-dir", filepath.Join(t.TempDir(), "etcd")},
		{"infera", "worker", "--engine", "sim", "--request-transport", "nats", "--nats-server", url,
			"--etcd-endpoints", "http://127.0.0.1:" + strconv.Itoa(testkit.FreePort(t)), "--", "--model", "m"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		msg := strings.ToLower(stderr.String())
		if code == 0 || !strings.Contains(msg, "cannot connect to nats") || !strings.Contains(msg, "authorization") {
			t.Errorf("%s: exit %d\n%s", args[1], code, stderr.String())
		}
		if strings.Contains(stderr.String(), "wrongpw") {
			t.Errorf("%s: the password is in the output", args[1])
		}
	}
}
