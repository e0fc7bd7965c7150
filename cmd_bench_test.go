package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

func TestBenchPlotArgs(t *testing.T) {
	cases := []struct {
		args      []string
		files     []string
		out, head string
	}{
		{[]string{"a.json", "b.json", "-o", "x.svg"}, []string{"a.json", "b.json"}, "x.svg", "T"},
		{[]string{"--output=y.svg", "a.json", "--title", "cmp"}, []string{"a.json"}, "y.svg", "cmp"},
		{[]string{"a.json", "--", "-weird.json"}, []string{"a.json", "-weird.json"}, "d.svg", "T"},
	}
	for _, tc := range cases {
		cfg := config.BenchPlot{Output: "d.svg", Title: "T"}
		files, err := plotArgs(&cfg, tc.args)
		if err != nil || !slices.Equal(files, tc.files) || cfg.Output != tc.out || cfg.Title != tc.head {
			t.Errorf("plotArgs(%q) = %q, %+v, %v", tc.args, files, cfg, err)
		}
	}
	for _, bad := range [][]string{{"a.json", "-x"}, {"a.json", "-o"}} {
		if _, err := plotArgs(&config.BenchPlot{}, bad); !errors.Is(err, config.ErrInvalid) {
			t.Errorf("plotArgs(%q): err = %v, want ErrInvalid", bad, err)
		}
	}
}

// TestBenchDeadURLThenPlot: a bench against a closed port ends at once with a
// report of connect errors and exit code 1; its JSON can still be plotted.
func TestBenchDeadURLThenPlot(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	_ = l.Close()
	dir := t.TempDir()
	report := filepath.Join(dir, "dead.json")
	var out, errOut bytes.Buffer
	code := run([]string{"infera", "bench", "--url", url, "--model", "m", "--requests", "10", "--progress=false",
		"--json", report, "--plot", filepath.Join(dir, "dead.svg")}, &out, &errOut)
	if code != exitFailure {
		t.Fatalf("exit %d, want %d; stderr: %s", code, exitFailure, errOut.String())
	}
	if !strings.Contains(out.String(), "connect") || !strings.Contains(errOut.String(), "every request failed") {
		t.Fatalf("stdout %q stderr %q", out.String(), errOut.String())
	}
	svg := filepath.Join(dir, "cmp.svg")
	if code := run([]string{"infera", "bench", "plot", report, report, "-o", svg}, io.Discard, &errOut); code != 0 {
		t.Fatalf("bench plot exit %d: %s", code, errOut.String())
	}
	data, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	for {
		if _, err := dec.Token(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("plot is not XML: %v", err)
		}
	}
	if code := run([]string{"infera", "bench", "--endpoint", "nope"}, io.Discard, io.Discard); code != exitConfig {
		t.Fatalf("bad flag: exit %d, want %d", code, exitConfig)
	}
	if code := run([]string{"infera", "bench", "plot"}, io.Discard, io.Discard); code != exitConfig {
		t.Fatalf("plot without files: exit %d, want %d", code, exitConfig)
	}
}
