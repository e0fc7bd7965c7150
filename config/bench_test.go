package config

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// parseBench runs a real cli parse of the bench flags.
func parseBench(t *testing.T, args ...string) Bench {
	t.Helper()
	var b Bench
	app := &cli.App{
		Flags: b.Flags(),
		Action: func(c *cli.Context) error {
			b.Finish(c)
			return nil
		},
	}
	if err := app.Run(append([]string{"bench"}, args...)); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return b
}

func TestBenchDefaultsValid(t *testing.T) {
	b := parseBench(t)
	if err := b.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if !slices.Equal(b.URLs, []string{"http://127.0.0.1:8000"}) || !b.Stream || b.Requests != 200 || b.Concurrency != 16 {
		t.Fatalf("defaults %+v", b)
	}
}

func TestBenchEnvAndURLs(t *testing.T) {
	t.Setenv("INFERA_URL", "http://a:1,http://b:2")
	t.Setenv("INFERA_STREAM", "false")
	b := parseBench(t, "--workload", "shared-prefix", "--concurrency", "3")
	if !slices.Equal(b.URLs, []string{"http://a:1", "http://b:2"}) || b.Stream || b.Concurrency != 3 || b.Workload != "shared-prefix" {
		t.Fatalf("parsed %+v", b)
	}
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestBenchValidateReportsAll(t *testing.T) {
	b := parseBench(t, "--url", "ftp://x", "--endpoint", "embeddings", "--requests", "0", "--concurrency", "0",
		"--rate", "-1", "--len-spread", "1", "--workload", "trace", "--trace-time-scale", "-2", "--log-level", "loud")
	err := b.Validate()
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"--url", "--endpoint", "--concurrency", "--rate", "--len-spread", "--trace FILE",
		"--trace-time-scale", "--log-level"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	endless := parseBench(t, "--requests", "0")
	if err := endless.Validate(); err == nil || !strings.Contains(err.Error(), "--duration") {
		t.Fatalf("endless run accepted: %v", err)
	}
	timed := parseBench(t, "--workload", "trace", "--trace", "t.jsonl", "--rate", "3")
	if err := timed.Validate(); err == nil ||
		!strings.Contains(err.Error(), "--trace-time-scale 0") {
		t.Fatalf("rate with trace timestamps accepted: %v", err)
	}
}

func TestBenchPlotFlags(t *testing.T) {
	var p BenchPlot
	app := &cli.App{Flags: p.Flags(), Action: func(*cli.Context) error { return nil }}
	if err := app.Run([]string{"plot", "-o", "x.svg"}); err != nil {
		t.Fatal(err)
	}
	if p.Output != "x.svg" || p.Title == "" || p.Validate() != nil {
		t.Fatalf("plot config %+v", p)
	}
	p.Output = ""
	if !errors.Is(p.Validate(), ErrInvalid) {
		t.Fatal("empty output accepted")
	}
}

// TestBenchTraceReplaysWhole: --workload trace without --requests replays
// the whole trace (Requests 0); an explicit --requests still bounds it.
func TestBenchTraceReplaysWhole(t *testing.T) {
	if b := parseBench(t, "--workload", "trace", "--trace", "x.jsonl"); b.Requests != 0 {
		t.Fatalf("trace without --requests: Requests = %d, want 0 (whole trace)", b.Requests)
	}
	if b := parseBench(t, "--workload", "trace", "--trace", "x.jsonl", "--trace-limit", "50"); b.Requests != 0 || b.TraceLimit != 50 {
		t.Fatalf("trace with --trace-limit: %+v", b)
	}
	if b := parseBench(t, "--workload", "trace", "--trace", "x.jsonl", "--requests", "30"); b.Requests != 30 {
		t.Fatalf("trace with --requests 30: Requests = %d", b.Requests)
	}
	if b := parseBench(t, "--workload", "random"); b.Requests != 200 {
		t.Fatalf("random: Requests = %d, want the default 200", b.Requests)
	}
}
