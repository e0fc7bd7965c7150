package config

import (
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// runFlags parses args with flags and returns Validate's verdict.
func runFlags(t *testing.T, flags []cli.Flag, finish func(*cli.Context), validate func() error, args ...string) error {
	t.Helper()
	app := &cli.App{Flags: flags, Action: func(c *cli.Context) error {
		finish(c)
		return validate()
	}}
	return app.Run(append([]string{"x"}, args...))
}

func TestKVDSocketFlags(t *testing.T) {
	var s Serve
	if err := runFlags(t, s.Flags(), s.Finish, s.Validate, "--kvd-socket-path", "/run/infera/kvd.sock"); err != nil || s.KVDSocket != "/run/infera/kvd.sock" {
		t.Fatalf("serve --kvd-socket-path: %q %v", s.KVDSocket, err)
	}
	s = Serve{}
	if err := runFlags(t, s.Flags(), s.Finish, s.Validate, "--kvd-socket", "relative.sock"); err == nil || !strings.Contains(err.Error(), "--kvd-socket") {
		t.Fatalf("serve relative socket: %v", err)
	}
	t.Setenv("INFERA_KVD_SOCKET", "/run/k.sock")
	var w Worker
	if err := runFlags(t, w.Flags(), w.Finish, w.Validate, "--engine", "sim"); err != nil || w.KVDSocket != "/run/k.sock" {
		t.Fatalf("worker INFERA_KVD_SOCKET: %q %v", w.KVDSocket, err)
	}
	var sim Sim
	if err := runFlags(t, sim.Flags(), sim.Finish, sim.Validate); err != nil || sim.KVD.Socket != "/run/k.sock" ||
		sim.KVD.CompatKey != "tp0of1_pp0of1" || sim.KVD.Retention != "long" || sim.KVD.BlockBytes != 64<<10 {
		t.Fatalf("sim kvd defaults: %+v %v", sim.KVD, err)
	}
	sim = Sim{}
	err := runFlags(t, sim.Flags(), sim.Finish, sim.Validate, "--kvd-block-bytes", "8", "--kvd-retention", "forever",
		"--kvd-load-ms-per-block", "-1", "--kvd-timeout", "0")
	for _, want := range []string{"--kvd-block-bytes", "--kvd-retention", "--kvd-load-ms-per-block", "--kvd-timeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("sim bad kvd flags: %v, want %s named", err, want)
		}
	}
}
