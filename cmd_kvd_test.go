package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/kvd"
)

// TestKVDCommand runs the daemon as `infera kvd` does, fills it through
// the client library, and reads it back with `infera kvd stat` (human and
// --json) and the admin /metrics endpoint.
func TestKVDCommand(t *testing.T) {
	var cfg config.KVD
	cfg.Flags()
	cfg.Socket = filepath.Join(t.TempDir(), "run", "kvd.sock")
	cfg.MaxBytesText, cfg.ArenaText, cfg.AdminListen = "8MiB", "4MiB", "127.0.0.1:0"
	cfg.ArenaMlock = false
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- runKVD(ctx, cfg, zerolog.Nop(), ready) }()
	var admin string
	select {
	case admin = <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(cfg.Socket); !os.IsNotExist(err) {
			t.Error("socket left behind:", err)
		}
	}()
	cl, err := kvd.Dial(ctx, cfg.Socket, kvd.ClientOptions{SharedArena: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ns := kvd.Namespace{Model: "m"}
	for i := range 3 {
		if ok, reason, err := cl.Set(ns, []byte{byte(i), 0, 0, 0, 0, 0, 0, 1}, bytes.Repeat([]byte{byte(i)}, 1000), kvd.SetOptions{}); !ok || err != nil {
			t.Fatal(reason, err)
		}
	}
	cl.Get(ns, []byte("missing!"), nil)

	var out bytes.Buffer
	if code := run([]string{"infera", "kvd", "stat", "--socket", cfg.Socket, "--json"}, &out, &out); code != 0 {
		t.Fatalf("stat --json: exit %d: %s", code, out.String())
	}
	var st struct {
		ServerID string `json:"server_id"`
		kvd.StatsCounters
	}
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if st.Entries != 3 || st.HostBytes != 3000 || st.MissesTotal != 1 || st.ServerID != cl.ServerID {
		t.Fatalf("stat: %+v", st)
	}
	out.Reset()
	if code := run([]string{"infera", "kvd", "stat", "--socket", cfg.Socket}, &out, &out); code != 0 || !strings.Contains(out.String(), "entries    3") {
		t.Fatalf("stat: exit %d: %s", code, out.String())
	}
	out.Reset()
	if code := run([]string{"infera", "kvd", "stat", "--socket", cfg.Socket + ".none"}, &out, &out); code == 0 {
		t.Fatal("stat of a missing socket succeeded")
	}
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `infera_kvd_entries{placement="arena"} 3`) {
		t.Fatalf("metrics:\n%s", body)
	}
}

func TestKVDCommandRejectsBadFlags(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"infera", "kvd", "--max-bytes", "lots", "--socket", filepath.Join(t.TempDir(), "k.sock")}, &out, &out); code != exitConfig {
		t.Fatalf("exit %d: %s", code, out.String())
	}
}
