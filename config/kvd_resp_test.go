package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestKVDRESPAndL4Flags(t *testing.T) {
	k, err := parseKVD(t)
	if err != nil || k.RESPListen != "" || len(k.L4Redis) != 0 || k.RESPRetention != "short" || k.L4TTL != 24*time.Hour || k.L4Prefix != "infera:kv:" || k.RESPLoops != 1 {
		t.Fatalf("defaults: %v %+v", err, k)
	}
	for in, want := range map[string]string{"6380": "127.0.0.1:6380", ":6380": "127.0.0.1:6380", "0.0.0.0:6380": "0.0.0.0:6380"} {
		if k, err := parseKVD(t, "--resp-listen", in); err != nil || k.RESPListen != want {
			t.Errorf("--resp-listen %s: %v %q", in, err, k.RESPListen)
		}
	}
	t.Setenv("INFERA_RESP_PASSWORD", "pw")
	t.Setenv("INFERA_L4_REDIS", "redis://a:1,rediss://u:p@b:2/3")
	k, err = parseKVD(t, "--resp-user", "lmcache")
	if err != nil || k.RESPPassword != "pw" || k.RESPUser != "lmcache" || len(k.L4Redis) != 2 || k.L4Redis[1] != "rediss://u:p@b:2/3" {
		t.Fatalf("env: %v %+v", err, k)
	}
	if k, err := parseKVD(t, "--resp-loops", "4"); err != nil || k.RESPLoops != 4 {
		t.Errorf("--resp-loops 4: %v %d", err, k.RESPLoops)
	}
	t.Setenv("INFERA_RESP_PASSWORD", "")
	_, err = parseKVD(t, "--resp-listen", "nope", "--resp-loops", "0", "--resp-retention", "forever", "--resp-user", "u", "--l4-redis", "http://x",
		"--l4-ttl", "-1s", "--l4-write-queue", "0", "--l4-timeout", "0")
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err %v", err)
	}
	for _, f := range []string{"--resp-listen", "--resp-loops", "--resp-retention", "--resp-user", "--l4-redis", "--l4-ttl", "--l4-write-queue", "--l4-timeout"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("%s not reported: %v", f, err)
		}
	}
}

func TestKVDRESPOutputFlags(t *testing.T) {
	k, err := parseKVD(t)
	if err != nil || k.RESPMaxOutput != 1<<30 || k.RESPOutputTimeout != time.Minute {
		t.Fatalf("defaults: %v %d %v", err, k.RESPMaxOutput, k.RESPOutputTimeout)
	}
	t.Setenv("INFERA_RESP_MAX_OUTPUT_BYTES", "64MiB")
	if k, err := parseKVD(t, "--resp-output-timeout", "0"); err != nil || k.RESPMaxOutput != 64<<20 || k.RESPOutputTimeout != 0 {
		t.Fatalf("env and 0: %v %d %v", err, k.RESPMaxOutput, k.RESPOutputTimeout)
	}
	_, err = parseKVD(t, "--resp-max-output-bytes", "1KiB", "--resp-output-timeout", "-1s")
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--resp-max-output-bytes") || !strings.Contains(err.Error(), "--resp-output-timeout") {
		t.Fatalf("bad values: %v", err)
	}
}
