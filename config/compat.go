package config

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// This file makes a Python Infera deployment's command lines and
// environment work unchanged: its flag names and INFERA_* variables are
// aliases of ours, and durations accept its bare numbers of seconds. The
// full mapping is the table in docs/operations.md ("Moving from Python
// Infera").

// ParseDuration reads a Go duration ("1m30s", "250ms") or, as Infera's
// Python flags and variables are written, a bare number of seconds ("30",
// "2.5"). Negative values parse; callers validate ranges.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%w: duration %q: want a number of seconds or a Go duration such as 30s", ErrInvalid, s)
	}
	if secs := f * float64(time.Second); secs > math.MaxInt64 || secs < math.MinInt64 {
		return 0, fmt.Errorf("%w: duration %q out of range", ErrInvalid, s)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// durationValue is the cli.Generic behind every Duration flag.
type durationValue struct{ d *time.Duration }

func (v durationValue) Set(s string) error {
	d, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

func (v durationValue) String() string {
	if v.d == nil {
		return ""
	}
	return v.d.String()
}

// inferaAlias is what Python Infera calls one of our flags.
type inferaAlias struct {
	names []string // extra flag names
	envs  []string // extra environment variables
}

// inferaAliases maps our flag names to Infera's names for the same setting.
// Flags Infera spells like us (--etcd-prefix, --router-policy,
// --request-max-retries, --drain-timeout, …) need no entry.
var inferaAliases = map[string]inferaAlias{
	"etcd-endpoints":       {names: []string{"etcd-endpoint"}, envs: []string{"INFERA_ETCD_ENDPOINT"}},
	"breaker-cooldown":     {names: []string{"breaker-cooldown-s"}, envs: []string{"INFERA_BREAKER_COOLDOWN_S"}},
	"breaker-max-cooldown": {names: []string{"breaker-max-cooldown-s"}, envs: []string{"INFERA_BREAKER_MAX_COOLDOWN_S"}},
	"tokenizer":            {names: []string{"router-tokenizer-path"}, envs: []string{"INFERA_ROUTER_TOKENIZER_PATH"}},
	"ready-timeout":        {envs: []string{"INFERA_ENGINE_READY_TIMEOUT", "INFERA_ATOM_READY_TIMEOUT"}},
	"no-kv-events":         {names: []string{"no-enable-kv-events"}},
	// serve's --kvd-socket-path, the worker's --infera-kvd-socket.
	"kvd-socket": {names: []string{"kvd-socket-path", "infera-kvd-socket"}, envs: []string{"INFERA_KVD_SOCKET_PATH"}},
}

// withInferaAliases adds Infera's names and variables to the flags that
// have them. Ours come first, so ours win when both are set.
func withInferaAliases(flags []cli.Flag) []cli.Flag {
	for _, f := range flags {
		a, ok := inferaAliases[f.Names()[0]]
		if !ok {
			continue
		}
		switch f := f.(type) {
		case *cli.StringFlag:
			f.Aliases, f.EnvVars = append(f.Aliases, a.names...), append(f.EnvVars, a.envs...)
		case *cli.StringSliceFlag:
			f.Aliases, f.EnvVars = append(f.Aliases, a.names...), append(f.EnvVars, a.envs...)
		case *cli.GenericFlag:
			f.Aliases, f.EnvVars = append(f.Aliases, a.names...), append(f.EnvVars, a.envs...)
		case *cli.BoolFlag:
			f.Aliases, f.EnvVars = append(f.Aliases, a.names...), append(f.EnvVars, a.envs...)
		default:
			panic(fmt.Sprintf("config: no Infera alias support for flag type %T", f))
		}
	}
	return flags
}

// serveInferaFlags are Infera's --host and --port, which together mean our
// --listen.
func serveInferaFlags(host *string, port *int) []cli.Flag {
	return []cli.Flag{
		String("host", "Infera's name for the host of --listen (with --port); --listen wins when both are set", host, ""),
		Int("port", "Infera's name for the port of --listen (with --host; 0 = keep --listen's port)", port, 0),
	}
}

// finishListen applies --host/--port (Infera's) to listen unless --listen
// itself was given.
func finishListen(c *cli.Context, listen *string, host string, port int) {
	if c.IsSet("listen") || (!c.IsSet("host") && !c.IsSet("port")) {
		return
	}
	h, p, err := net.SplitHostPort(*listen)
	if err != nil {
		return // Validate reports the bad --listen
	}
	if c.IsSet("host") {
		h = host
	}
	if c.IsSet("port") {
		p = strconv.Itoa(port)
	}
	*listen = net.JoinHostPort(h, p)
}

// finishEnableKVEvents applies Infera's --enable-kv-events (a boolean
// defaulting to true; --no-enable-kv-events is an alias of our
// --no-kv-events) unless --no-kv-events was given.
func finishEnableKVEvents(c *cli.Context, noKVEvents *bool, enable bool) {
	if c.IsSet("enable-kv-events") && !c.IsSet("no-kv-events") {
		*noKVEvents = !enable
	}
}

// withSlash appends the trailing "/" Infera adds to an etcd prefix.
func withSlash(prefix string) string {
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		return prefix + "/"
	}
	return prefix
}
