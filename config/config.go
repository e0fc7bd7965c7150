package config

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// ErrInvalid is wrapped by every validation error returned from a Validate method.
var ErrInvalid = errors.New("invalid configuration")

// EnvName returns the environment variable bound to a flag: INFERA_ followed by
// the flag name in upper snake case ("max-body-bytes" → "INFERA_MAX_BODY_BYTES").
func EnvName(flag string) string {
	return "INFERA_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Problems collects validation failures so that Validate can report all of
// them in one error instead of stopping at the first.
type Problems struct {
	list []string
}

// Addf records one problem.
func (p *Problems) Addf(format string, args ...any) {
	p.list = append(p.list, fmt.Sprintf(format, args...))
}

// Err returns nil when nothing was recorded, otherwise one error wrapping
// ErrInvalid that lists every problem.
func (p *Problems) Err() error {
	if len(p.list) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(p.list, "; "))
}

// The flag constructors below bind a flag to a destination field, attach its
// INFERA_* environment variable and show the default in --help, so every role
// declares its flags the same way.

// String declares a string flag.
func String(name, usage string, dest *string, def string) *cli.StringFlag {
	*dest = def
	return &cli.StringFlag{Name: name, Usage: usage, EnvVars: []string{EnvName(name)}, Value: def, Destination: dest, DefaultText: unsetText(def == "")}
}

// Int declares an int flag.
func Int(name, usage string, dest *int, def int) *cli.IntFlag {
	*dest = def
	return &cli.IntFlag{Name: name, Usage: usage, EnvVars: []string{EnvName(name)}, Value: def, Destination: dest}
}

// Int64 declares an int64 flag.
func Int64(name, usage string, dest *int64, def int64) *cli.Int64Flag {
	*dest = def
	return &cli.Int64Flag{Name: name, Usage: usage, EnvVars: []string{EnvName(name)}, Value: def, Destination: dest}
}

// Float declares a float64 flag.
func Float(name, usage string, dest *float64, def float64) *cli.Float64Flag {
	*dest = def
	return &cli.Float64Flag{Name: name, Usage: usage, EnvVars: []string{EnvName(name)}, Value: def, Destination: dest}
}

// Bool declares a bool flag.
func Bool(name, usage string, dest *bool, def bool) *cli.BoolFlag {
	*dest = def
	return &cli.BoolFlag{Name: name, Usage: usage, EnvVars: []string{EnvName(name)}, Value: def, Destination: dest}
}

// Duration declares a time.Duration flag. It takes a Go duration ("1m30s")
// or a bare number of seconds ("30"), as Infera's Python flags do.
func Duration(name, usage string, dest *time.Duration, def time.Duration) *cli.GenericFlag {
	*dest = def
	return &cli.GenericFlag{Name: name, Usage: usage, EnvVars: []string{EnvName(name)}, Value: durationValue{dest}, DefaultText: def.String()}
}

// StringSlice declares a repeatable (or comma-separated) string flag.
// The parsed values are copied into dest by Finish.
func StringSlice(name, usage string, def []string) *cli.StringSliceFlag {
	return &cli.StringSliceFlag{Name: name, Usage: usage, EnvVars: []string{EnvName(name)}, Value: cli.NewStringSlice(def...), DefaultText: unsetText(len(def) == 0)}
}

// unsetText makes --help say "(default: unset)" for an empty default, which
// urfave/cli would otherwise omit, so every flag documents its default.
func unsetText(empty bool) string {
	if empty {
		return "unset"
	}
	return ""
}

// SplitList flattens comma-separated entries of a string slice flag and drops
// empty ones, so "--x a,b --x c" and INFERA_X="a,b,c" mean the same.
func SplitList(values []string) []string {
	var out []string
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	return out
}

// Log configures logging for every role.
type Log struct {
	Level  string // debug, info, warn, error
	Format string // json or console
}

// Flags returns the logging flags.
func (l *Log) Flags() []cli.Flag {
	return []cli.Flag{
		String("log-level", "log level: debug, info, warn, error", &l.Level, "info"),
		String("log-format", "log format: json or console", &l.Format, "json"),
	}
}

// Validate records logging problems into p.
func (l *Log) Validate(p *Problems) {
	switch l.Level {
	case "debug", "info", "warn", "error":
	default:
		p.Addf("--log-level %q: want debug, info, warn or error", l.Level)
	}
	switch l.Format {
	case "json", "console":
	default:
		p.Addf("--log-format %q: want json or console", l.Format)
	}
}

// Etcd is the etcd client configuration shared by serve and worker.
type Etcd struct {
	Endpoints   []string
	Prefix      string
	DialTimeout time.Duration
	Username    string
	Password    string
	CertFile    string
	KeyFile     string
	CAFile      string
}

// Flags returns the etcd client flags. Endpoints are read from the context
// with Finish because urfave/cli has no slice destination.
func (e *Etcd) Flags() []cli.Flag {
	return []cli.Flag{
		StringSlice("etcd-endpoints", "etcd endpoints (host:port or URL), comma-separated", nil),
		String("etcd-prefix", "key prefix of worker records", &e.Prefix, "/infera/workers/"),
		Duration("etcd-dial-timeout", "etcd dial timeout", &e.DialTimeout, 5*time.Second),
		String("etcd-username", "etcd username", &e.Username, ""),
		String("etcd-password", "etcd password", &e.Password, ""),
		String("etcd-cert", "etcd client TLS certificate file", &e.CertFile, ""),
		String("etcd-key", "etcd client TLS key file", &e.KeyFile, ""),
		String("etcd-ca", "etcd server CA file", &e.CAFile, ""),
	}
}

// Finish copies slice flags out of the parsed command line.
func (e *Etcd) Finish(c *cli.Context) {
	e.Endpoints = SplitList(c.StringSlice("etcd-endpoints"))
	e.Prefix = withSlash(e.Prefix) // as Infera does
}

// Validate records etcd problems into p.
func (e *Etcd) Validate(p *Problems) {
	if !strings.HasPrefix(e.Prefix, "/") || !strings.HasSuffix(e.Prefix, "/") {
		p.Addf("--etcd-prefix %q: must start and end with /", e.Prefix)
	}
	if e.DialTimeout <= 0 {
		p.Addf("--etcd-dial-timeout must be positive")
	}
	if (e.CertFile == "") != (e.KeyFile == "") {
		p.Addf("--etcd-cert and --etcd-key must be given together")
	}
}
