package archtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// rules maps a package path relative to the module ("" for the root) to
// the packages it may import; a nil set with everything true allows all.
type rule struct {
	everything bool
	allowed    map[string]bool
}

var backticked = regexp.MustCompile("`([^`]+)`")

// parseTable reads the "| package | owns | may import |" table.
func parseTable(t *testing.T, doc []byte) map[string]rule {
	t.Helper()
	rules := map[string]rule{}
	in := false
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "| package | owns | may import |") {
			in = true
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if len(rules) > 0 {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 || strings.HasPrefix(strings.TrimSpace(cells[0]), "---") {
			continue
		}
		last := cells[len(cells)-1]
		// Names in parentheses are test-only imports, not rules.
		if i := strings.Index(last, "("); i >= 0 {
			last = last[:i]
		}
		r := rule{everything: strings.TrimSpace(last) == "everything", allowed: map[string]bool{}}
		for _, m := range backticked.FindAllStringSubmatch(last, -1) {
			r.allowed[m[1]] = true
		}
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			name := m[1]
			if strings.HasSuffix(name, ".go") {
				name = "" // main.go, cmd_*.go: the root package
			}
			rules[name] = r
		}
	}
	if len(rules) == 0 {
		t.Fatal("docs/architecture.md: no \"may import\" table found")
	}
	return rules
}

type listed struct {
	ImportPath string
	Imports    []string
	Module     *struct{ Path string }
}

// TestImportRules fails when a package's non-test code imports an Infera
// package its row in docs/architecture.md does not allow, or when a
// package has no row.
func TestImportRules(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	rules := parseTable(t, doc)

	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Module", "./...")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	var module string
	n := 0
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Module == nil {
			continue
		}
		module = p.Module.Path
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		n++
		r, ok := rules[rel]
		if !ok {
			t.Errorf("package %q has no row in docs/architecture.md's \"may import\" table", p.ImportPath)
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			dep := strings.TrimPrefix(imp, module+"/")
			if !r.everything && !r.allowed[dep] {
				allowed := make([]string, 0, len(r.allowed))
				for a := range r.allowed {
					allowed = append(allowed, a)
				}
				slices.Sort(allowed)
				t.Errorf("%s imports %s; docs/architecture.md allows only %v", p.ImportPath, dep, allowed)
			}
		}
	}
	if n < 10 {
		t.Fatalf("go list found %d packages of the module; want them all", n)
	}
}
