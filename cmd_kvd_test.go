package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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
	cfg.RESPListen = "127.0.0.1:0" // its counters join /metrics
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	admin, cancel, done := startKVD(t, cfg)
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(cfg.Socket); !os.IsNotExist(err) {
			t.Error("socket left behind:", err)
		}
	}()
	cl, err := kvd.Dial(t.Context(), cfg.Socket, kvd.ClientOptions{SharedArena: true})
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
	// Per-class use: the 1000-byte values share the 1024-byte class.
	if fmt.Sprint(st.ClassSlotBytes, st.ClassUsedSlots, st.ClassValueBytes) != "[1024] [3] [3000]" {
		t.Fatalf("stat classes: %+v", st)
	}
	out.Reset()
	if code := run([]string{"infera", "kvd", "stat", "--socket", cfg.Socket}, &out, &out); code != 0 || !strings.Contains(out.String(), "entries    3") || !strings.Contains(out.String(), "class    1024 B  pages 1  slots 3/256 used  values 3000 bytes") {
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
	if !strings.Contains(string(body), `infera_kvd_entries{placement="arena"} 3`) ||
		!strings.Contains(string(body), `infera_kvd_resp_output_disconnects_total{reason="stalled"} 0`) ||
		!strings.Contains(string(body), "infera_kvd_resp_connections 0") {
		t.Fatalf("metrics:\n%s", body)
	}
}

// startKVD runs the daemon as `infera kvd` does until it is ready, and
// returns the admin address it reported, what stops it and where its
// result arrives.
func startKVD(t *testing.T, cfg config.KVD) (admin string, stop context.CancelFunc, done chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	ready := make(chan string, 1)
	done = make(chan error, 1)
	go func() { done <- runKVD(ctx, cfg, zerolog.Nop(), ready) }()
	select {
	case admin = <-ready:
	case err := <-done:
		cancel()
		t.Fatal(err)
	}
	return admin, cancel, done
}

func TestKVDCommandRejectsBadFlags(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"infera", "kvd", "--max-bytes", "lots", "--socket", filepath.Join(t.TempDir(), "k.sock")}, &out, &out); code != exitConfig {
		t.Fatalf("exit %d: %s", code, out.String())
	}
}

// TestKVDRestartDurability (acceptance 3, through the daemon): long blocks
// written before a graceful restart are all served after it, from L3; the
// short ones were RAM-only and are gone.
func TestKVDRestartDurability(t *testing.T) {
	var cfg config.KVD
	cfg.Flags()
	dir := t.TempDir()
	cfg.Socket = filepath.Join(dir, "kvd.sock")
	cfg.MaxBytesText, cfg.ArenaText, cfg.AdminListen = "4MiB", "4MiB", ""
	cfg.ArenaMlock = false
	cfg.LongPath = filepath.Join(dir, "l3")
	cfg.LongBytesText, cfg.SlotBytesText, cfg.ContainerBytesText = "4MiB", "8KiB", "1MiB"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ns := kvd.Namespace{Model: "m", CompatKey: "tp0of1"}
	val := func(i int) []byte { return bytes.Repeat([]byte{byte(i), byte(i >> 8), 0xA5}, 1000) }
	k := func(i int) []byte { return []byte{0, 0, 0, 0, 0, 0, byte(i >> 8), byte(i)} }
	_, cancel, done := startKVD(t, cfg)
	cl, err := kvd.Dial(t.Context(), cfg.Socket, kvd.ClientOptions{SharedArena: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	for i := range n {
		ret := "long"
		if i%5 == 0 {
			ret = "short"
		}
		if ok, reason, err := cl.Set(ns, k(i), val(i), kvd.SetOptions{Retention: ret}); !ok || err != nil {
			t.Fatal(reason, err)
		}
	}
	cl.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	cfg.SkipSelfCheck = true
	_, cancel, done = startKVD(t, cfg)
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	cl, err = kvd.Dial(t.Context(), cfg.Socket, kvd.ClientOptions{SharedArena: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	st, _ := cl.Stats()
	if st.Entries != 0 || st.LongBytes < int64(n*4/5*3000) {
		t.Fatalf("after restart: %+v", st)
	}
	for i := range n {
		got, ret, ok, err := cl.Get(ns, k(i), nil)
		if err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 {
			if ok {
				t.Fatalf("short entry %d survived the restart", i)
			}
			continue
		}
		if !ok || !bytes.Equal(got, val(i)) || ret != kvd.RetentionLong {
			t.Fatalf("long entry %d after restart: ok=%v ret=%v", i, ok, ret)
		}
	}
}
