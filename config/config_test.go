package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{
		"max-body-bytes": "INFERA_MAX_BODY_BYTES",
		"port":           "INFERA_PORT",
		"etcd-endpoints": "INFERA_ETCD_ENDPOINTS",
	} {
		if got := EnvName(flag); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", flag, got, want)
		}
	}
}

func TestProblemsReportsAll(t *testing.T) {
	var p Problems
	if p.Err() != nil {
		t.Fatal("empty Problems must be nil")
	}
	p.Addf("first %d", 1)
	p.Addf("second")
	err := p.Err()
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("error %v does not wrap ErrInvalid", err)
	}
	if !strings.Contains(err.Error(), "first 1") || !strings.Contains(err.Error(), "second") {
		t.Fatalf("error %q lacks a problem", err)
	}
}

// TestPrecedence checks flag > env > default on a real cli parse.
func TestPrecedence(t *testing.T) {
	cases := []struct {
		name string
		env  string
		args []string
		want time.Duration
	}{
		{"default", "", nil, 3 * time.Second},
		{"env", "7s", nil, 7 * time.Second},
		{"flag beats env", "7s", []string{"--drain-window", "9s"}, 9 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("INFERA_DRAIN_WINDOW", tc.env)
			}
			var got time.Duration
			app := &cli.App{
				Flags:  []cli.Flag{Duration("drain-window", "test", &got, 3*time.Second)},
				Action: func(*cli.Context) error { return nil },
			}
			if err := app.Run(append([]string{"x"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSplitList(t *testing.T) {
	got := SplitList([]string{"a, b", "", "c"})
	if strings.Join(got, "|") != "a|b|c" {
		t.Fatalf("got %q", got)
	}
}

func TestLogAndEtcdValidate(t *testing.T) {
	var p Problems
	(&Log{Level: "loud", Format: "xml"}).Validate(&p)
	(&Etcd{Prefix: "workers", DialTimeout: 0, CertFile: "c"}).Validate(&p)
	err := p.Err()
	if err == nil {
		t.Fatal("want an error")
	}
	for _, want := range []string{"--log-level", "--log-format", "--etcd-prefix", "--etcd-dial-timeout", "--etcd-cert"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}
