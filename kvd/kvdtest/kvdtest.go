package kvdtest

import (
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/kvd"
)

// Start runs a kvd holding up to maxBytes in RAM and returns its socket
// path and store (for the test to look into).
func Start(t testing.TB, maxBytes int64) (string, *kvd.Store) {
	t.Helper()
	st, err := kvd.NewStore(kvd.StoreOptions{MaxBytes: maxBytes, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close) // after the server has stopped: cleanups run last-in first-out
	path := filepath.Join(t.TempDir(), "kvd.sock")
	ln, err := kvd.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	servetest.Run(t, "kvd", ln, kvd.NewServer(st, kvd.ServerOptions{Log: zerolog.Nop()}).Serve)
	return path, st
}
