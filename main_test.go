package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestHelpDocumentsEveryFlag: `infera <command> --help` lists every flag of
// every subcommand with its default and its INFERA_* environment variable.
func TestHelpDocumentsEveryFlag(t *testing.T) {
	app := newApp(&bytes.Buffer{}, &bytes.Buffer{})
	var walk func(path []string, cmds []*cli.Command)
	walk = func(path []string, cmds []*cli.Command) {
		for _, cmd := range cmds {
			full := append(append([]string{}, path...), cmd.Name)
			var out bytes.Buffer
			help := newApp(&out, &out)
			if err := help.Run(append(append([]string{"infera"}, full...), "--help")); err != nil {
				t.Fatalf("infera %s --help: %v", strings.Join(full, " "), err)
			}
			text := out.String()
			for _, flag := range cmd.Flags {
				name := flag.Names()[0]
				if !strings.Contains(text, "--"+name) && !strings.Contains(text, "-"+name+" ") {
					t.Errorf("infera %s --help does not list --%s", strings.Join(full, " "), name)
					continue
				}
				line := flagLine(text, name)
				if !strings.Contains(line, "(default: ") {
					t.Errorf("infera %s --help: --%s has no default: %q", strings.Join(full, " "), name, line)
				}
				env := "$INFERA_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
				if !strings.Contains(line, env) {
					t.Errorf("infera %s --help: --%s lacks %s: %q", strings.Join(full, " "), name, env, line)
				}
			}
			walk(full, cmd.Subcommands)
		}
	}
	walk(nil, app.Commands)
}

// flagLine returns the help line (with continuation lines) describing flag.
func flagLine(help, name string) string {
	// Only the OPTIONS section lists flags; a description may mention one too.
	if i := strings.Index(help, "OPTIONS:"); i >= 0 {
		help = help[i:]
	}
	lines := strings.Split(help, "\n")
	for i, l := range lines {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "--"+name+" ") || strings.HasPrefix(trimmed, "--"+name+",") || trimmed == "--"+name ||
			strings.HasPrefix(trimmed, "-"+name+" ") {
			out := l
			for j := i + 1; j < len(lines) && strings.HasPrefix(lines[j], "      ") && !strings.HasPrefix(strings.TrimSpace(lines[j]), "-"); j++ {
				out += " " + strings.TrimSpace(lines[j])
			}
			return out
		}
	}
	return ""
}

func TestVersionCommand(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"infera", "version"}, &out, &out); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	if !strings.HasPrefix(out.String(), "infera ") {
		t.Fatalf("version output %q", out.String())
	}
}
