package engines

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/infera/infera/internal/testkit"
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

// logMessages lists the message and component of every entry, for failure
// reports.
func logMessages(t testing.TB, b *testkit.LogSink) string {
	t.Helper()
	var sb strings.Builder
	for _, e := range b.Entries(t) {
		fmt.Fprintf(&sb, "%v %v: %v\n", e["component"], e["level"], e["message"])
	}
	return sb.String()
}

func newTestLogger(t testing.TB) (zerolog.Logger, *testkit.LogSink) {
	if t != nil {
		t.Helper()
	}
	b := &testkit.LogSink{}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return zerolog.New(b).Level(zerolog.DebugLevel).With().Timestamp().Logger(), b
}
