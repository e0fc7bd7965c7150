package anthropic_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infera/infera/anthropic"
	"github.com/infera/infera/openai"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// goldenFiles lists the inputs of dir (every file not itself a golden).
func goldenFiles(t *testing.T, dir string) []string {
	t.Helper()
	all, err := filepath.Glob(filepath.Join("testdata", dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	var in []string
	for _, f := range all {
		if !strings.Contains(filepath.Base(f), ".golden") {
			in = append(in, f)
		}
	}
	if len(in) == 0 {
		t.Fatalf("no inputs in testdata/%s", dir)
	}
	return in
}

// goldenPath is the golden of input f: name.golden.ext.
func goldenPath(f string) string {
	ext := filepath.Ext(f)
	return strings.TrimSuffix(f, ext) + ".golden" + ext
}

func checkGolden(t *testing.T, f string, got []byte) {
	t.Helper()
	g := goldenPath(f)
	if *update {
		if err := os.WriteFile(g, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(g)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s:\n got %s\nwant %s", f, got, want)
	}
}

// TestGoldenRequests: each Anthropic request translates to its golden
// OpenAI chat body, which is valid JSON the router's scanner accepts.
func TestGoldenRequests(t *testing.T) {
	for _, f := range goldenFiles(t, "requests") {
		in, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := anthropic.AppendChatRequest(nil, bytes.TrimSpace(in))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !json.Valid(out) {
			t.Fatalf("%s: invalid JSON %s", f, out)
		}
		var scan openai.Request
		if err := openai.Scan(out, &scan); err != nil {
			t.Fatalf("%s: openai.Scan: %v", f, err)
		}
		checkGolden(t, f, append(out, '\n'))
	}
}

// TestGoldenResponses: each engine chat completion translates to its
// golden Anthropic message.
func TestGoldenResponses(t *testing.T) {
	for _, f := range goldenFiles(t, "responses") {
		in, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out, err := anthropic.AppendMessage(nil, bytes.TrimSpace(in))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !json.Valid(out) {
			t.Fatalf("%s: invalid JSON %s", f, out)
		}
		checkGolden(t, f, append(out, '\n'))
	}
}

// translateStream runs a whole SSE stream through a Stream, event by
// event as the relay's pump hands them over.
func translateStream(s *anthropic.Stream, in []byte) []byte {
	var out []byte
	for len(in) > 0 {
		k := openai.NextEvent(in)
		if k < 0 {
			k = len(in)
		}
		out = s.Event(out, in[:k])
		in = in[k:]
	}
	return out
}

// TestGoldenStreams: each engine SSE stream translates to its golden
// Anthropic event stream, whose every data line is valid JSON naming its
// event.
func TestGoldenStreams(t *testing.T) {
	for _, f := range goldenFiles(t, "streams") {
		in, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var s anthropic.Stream
		out := translateStream(&s, in)
		checkEventStream(t, f, out)
		checkGolden(t, f, out)
	}
}

// checkEventStream checks Anthropic SSE framing: "event: X" then
// "data: {…"type":"X"…}" and a blank line.
func checkEventStream(t *testing.T, name string, out []byte) {
	t.Helper()
	for ev := range strings.SplitSeq(strings.TrimSuffix(string(out), "\n\n"), "\n\n") {
		lines := strings.Split(ev, "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "event: ") || !strings.HasPrefix(lines[1], "data: ") {
			t.Fatalf("%s: bad event %q", name, ev)
		}
		var v struct{ Type string }
		if err := json.Unmarshal([]byte(lines[1][len("data: "):]), &v); err != nil || v.Type != lines[0][len("event: "):] {
			t.Fatalf("%s: event %q: %v", name, ev, err)
		}
	}
}
