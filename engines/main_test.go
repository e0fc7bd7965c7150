package engines

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The test binary doubles as a tiny engine for the worker tests: the sim
	// adapter runs `<engine-bin> sim <args>`, and with this variable set the
	// binary serves /health and /metrics instead of running tests.
	if mode := os.Getenv(fakeEngineEnv); mode != "" {
		os.Exit(runFakeEngine(mode, os.Args[1:]))
	}
	if pidPath := os.Getenv(supervisorEnv); pidPath != "" {
		os.Exit(runSupervisor(pidPath))
	}
	goleak.VerifyTestMain(m)
}

// logBuffer collects JSON log lines from concurrent writers.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// entries parses every complete log line written so far.
func (b *logBuffer) entries(t testing.TB) []map[string]any {
	t.Helper()
	b.mu.Lock()
	data := b.buf.String()
	b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(data, "\n") {
		if line == "" {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// find returns the log entries whose message equals msg.
func (b *logBuffer) find(t testing.TB, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, e := range b.entries(t) {
		if e["message"] == msg {
			out = append(out, e)
		}
	}
	return out
}

// messages lists the message and component of every entry, for failure
// reports.
func (b *logBuffer) messages(t testing.TB) string {
	t.Helper()
	var sb strings.Builder
	for _, e := range b.entries(t) {
		fmt.Fprintf(&sb, "%v %v: %v\n", e["component"], e["level"], e["message"])
	}
	return sb.String()
}

func newTestLogger(t testing.TB) (zerolog.Logger, *logBuffer) {
	if t != nil {
		t.Helper()
	}
	b := &logBuffer{}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return zerolog.New(b).Level(zerolog.DebugLevel).With().Timestamp().Logger(), b
}

// eventually polls cond until it holds, failing the test after a generous
// deadline; it never asserts on timing, only bounds a hang.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
