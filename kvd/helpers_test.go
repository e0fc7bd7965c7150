package kvd

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/kvd/tablespace"
)

// daemon is an in-process kvd on a temporary socket.
type daemon struct {
	store *Store
	srv   *Server
	path  string
}

type daemonOpts struct {
	arenaBytes int64 // 0: no arena
	maxBytes   int64
	long       LongStore
	serverOpt  ServerOptions
	storeOpt   func(*StoreOptions)
}

func startDaemon(t testing.TB, o daemonOpts) *daemon {
	t.Helper()
	if o.maxBytes == 0 {
		o.maxBytes = max(o.arenaBytes, 1<<20)
	}
	so := StoreOptions{MaxBytes: o.maxBytes, Long: o.long, LongNotFound: tablespace.ErrNotFound, Log: zerolog.Nop()}
	if o.arenaBytes > 0 {
		a, _, err := OpenArena(o.arenaBytes, false, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		so.Arena = a
	}
	if o.storeOpt != nil {
		o.storeOpt(&so)
	}
	st, err := NewStore(so)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kvd.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(st, o.serverOpt)
	t.Cleanup(st.Close) // after the server has stopped: cleanups run last-in first-out
	servetest.Run(t, "kvd", ln, srv.Serve)
	return &daemon{store: st, srv: srv, path: path}
}

func dial(t testing.TB, d *daemon, o ClientOptions) *Client {
	t.Helper()
	if o.ClientID == "" {
		o.ClientID = t.Name()
	}
	c, err := Dial(context.Background(), d.path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newTablespace opens a small real L3 tablespace in a temporary directory.
func newTablespace(t testing.TB) *tablespace.Tablespace {
	t.Helper()
	ts, err := tablespace.Open(tablespace.Config{Paths: []string{t.TempDir()}, Bytes: 4 << 20, SlotBytes: 8 << 10,
		ContainerBytes: 1 << 20, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ts.Close(); err != nil {
			t.Error(err)
		}
	})
	return ts
}
