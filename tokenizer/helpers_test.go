package tokenizer

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// moduleRoot walks up from the package directory to the directory of go.mod.
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// tokenizerDir returns testdata/tokenizers/<model> under the module root. The
// files are fetched by `make tokenizers`, never by tests; a missing directory
// fails the test unless INFERA_SKIP_TOKENIZER_PARITY=1.
func tokenizerDir(t testing.TB, model string) string {
	t.Helper()
	dir := filepath.Join(moduleRoot(t), "testdata", "tokenizers", model)
	if _, err := os.Stat(filepath.Join(dir, fileTokenizer)); err != nil {
		if os.Getenv("INFERA_SKIP_TOKENIZER_PARITY") == "1" {
			t.Skipf("tokenizer files for %s missing and INFERA_SKIP_TOKENIZER_PARITY=1", model)
		}
		t.Fatalf("tokenizer files for %s missing in %s: run make tokenizers (or set INFERA_SKIP_TOKENIZER_PARITY=1 to skip)", model, dir)
	}
	return dir
}

var (
	loadedMu sync.Mutex
	loaded   = map[string]*HF{}
)

// loadModel loads a fixture tokenizer once per test binary: parsing a 10 MiB
// tokenizer.json under the race detector takes seconds.
func loadModel(t testing.TB, model string) *HF {
	t.Helper()
	dir := tokenizerDir(t, model)
	loadedMu.Lock()
	defer loadedMu.Unlock()
	if tk, ok := loaded[model]; ok {
		return tk
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatalf("load %s: %v", model, err)
	}
	loaded[model] = tk
	return tk
}

// goldenPath prefers the shared fixtures beside the repository and falls back
// to the copy in testdata/.
func goldenPath(t testing.TB, model, file string) string {
	t.Helper()
	shared := filepath.Join(moduleRoot(t), "..", "shared", "fixtures", "tokenizers", model, file)
	if _, err := os.Stat(shared); err == nil {
		return shared
	}
	return filepath.Join("testdata", model, file)
}

type goldenCase struct {
	Text     string          `json:"text"`
	IDs      []uint32        `json:"ids"`
	Messages json.RawMessage `json:"messages"`
}

func readGolden(t testing.TB, path string) []goldenCase {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open golden: %v", err)
	}
	defer f.Close()
	var out []goldenCase
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var c goldenCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("%s line %d: %v", path, len(out)+1, err)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s is empty", path)
	}
	return out
}
