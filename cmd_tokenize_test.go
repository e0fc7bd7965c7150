package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/tokenizer"
)

// runTokenizeApp runs `infera tokenize args...` with stdin and returns its
// exit code, stdout and stderr.
func runTokenizeApp(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	app := newApp(&stdout, &stderr)
	app.Reader = strings.NewReader(stdin)
	code := 0
	if err := app.Run(append([]string{"infera", "tokenize"}, args...)); err != nil {
		code = exitFailure
		stderr.WriteString(err.Error())
	}
	return code, stdout.String(), stderr.String()
}

type tokenizeOut struct {
	IDs    []uint32 `json:"ids"`
	Hashes []string `json:"hashes"`
	Line   int      `json:"line"`
	Error  string   `json:"error"`
}

func decodeLines(t *testing.T, out string) []tokenizeOut {
	t.Helper()
	var res []tokenizeOut
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var o tokenizeOut
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatalf("output line %q: %v", l, err)
		}
		res = append(res, o)
	}
	return res
}

func TestTokenizeBytes(t *testing.T) {
	code, out, stderr := runTokenizeApp(t, `{"text":"hello world!"}`+"\n\n"+
		`{"messages":[{"role":"user","content":"hi"}]}`+"\n",
		"--tokenizer", "bytes", "--chat", "--block-size", "4")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	res := decodeLines(t, out)
	if len(res) != 2 {
		t.Fatalf("output %q", out)
	}
	if got := string(u32bytes(res[0].IDs)); got != "hello world!" {
		t.Fatalf("ids %v", res[0].IDs)
	}
	want := kvcache.AppendBlockHashes(nil, res[0].IDs, 4)
	if len(res[0].Hashes) != 3 || res[0].Hashes[0] != hex16(want[0]) || res[0].Hashes[2] != hex16(want[2]) {
		t.Fatalf("hashes %v, want %x", res[0].Hashes, want)
	}
	chat, _ := tokenizer.Bytes{}.RenderChat([]byte(`[{"role":"user","content":"hi"}]`))
	if got := string(u32bytes(res[1].IDs)); got != chat {
		t.Fatalf("chat ids render %q, want %q", got, chat)
	}
	if len(res[1].Hashes) != len(chat)/4 {
		t.Fatalf("chat hashes %d", len(res[1].Hashes))
	}
}

func TestTokenizeBadLines(t *testing.T) {
	in := strings.Join([]string{
		`{"text":"ok"}`,
		`not json`,
		`{"messages":[{"role":"user","content":"x"}]}`, // no --chat
		`{"txt":"typo"}`,
		`{"text":"a","messages":[]}`,
		`{"text":"fine"}`,
	}, "\n")
	code, out, stderr := runTokenizeApp(t, in, "--tokenizer", "bytes")
	if code == 0 || !strings.Contains(stderr, "4 of the input lines") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	res := decodeLines(t, out)
	if len(res) != 6 || res[0].Error != "" || res[5].Error != "" || len(res[5].IDs) != 4 {
		t.Fatalf("output %q", out)
	}
	for i, want := range map[int]string{1: "line 2:", 2: "needs --chat", 3: "unknown field", 4: "not both"} {
		if res[i].Line != i+1 || !strings.Contains(res[i].Error, want) {
			t.Errorf("line %d: %+v, want %q", i+1, res[i], want)
		}
	}
	// A missing tokenizer is a configuration error.
	var stdout, errOut bytes.Buffer
	if got := run([]string{"infera", "tokenize"}, &stdout, &errOut); got != exitConfig {
		t.Fatalf("no --tokenizer: exit %d (%s)", got, errOut.String())
	}
}

func TestTokenizeHFDir(t *testing.T) {
	dir := filepath.Join("testdata", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skip("testdata/tokenizers/qwen3 missing (make tokenizers)")
	}
	tok, err := tokenizer.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	msgs := `[{"role":"user","content":"What is a KV cache?"}]`
	code, out, stderr := runTokenizeApp(t, `{"messages":`+msgs+`}`, "--tokenizer", dir, "--chat", "--block-size", "16")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	text, err := tok.RenderChat([]byte(msgs))
	if err != nil {
		t.Fatal(err)
	}
	want := tok.Encode(text)
	res := decodeLines(t, out)
	if len(res) != 1 || len(res[0].IDs) != len(want) || res[0].IDs[0] != want[0] {
		t.Fatalf("ids %v, want %v", res[0].IDs, want)
	}
}

func u32bytes(ids []uint32) []byte {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return b
}

func hex16(h uint64) string { return string(appendHash(nil, h)[1:17]) }
