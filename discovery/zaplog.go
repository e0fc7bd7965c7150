package discovery

import (
	"slices"
	"strings"
	"sync/atomic"

	"github.com/rs/zerolog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapCore forwards the zap logs of etcd's client and embedded server into
// our zerolog logger, so that a process writes one log stream in one format.
// Only entries at min or above pass: etcd logs every retry at warn and
// below, which would drown our own state-change lines.
type zapCore struct {
	log    zerolog.Logger
	min    zapcore.Level
	fields []zapcore.Field
	// quiet, when set and true, demotes entries to debug: the embedded
	// server reports its own orderly shutdown (closed listeners) as errors.
	quiet *atomic.Bool
}

func newZapLogger(log zerolog.Logger, min zapcore.Level, quiet *atomic.Bool) *zap.Logger {
	return zap.New(&zapCore{log: log, min: min, quiet: quiet})
}

func (c *zapCore) Enabled(l zapcore.Level) bool { return l >= c.min }

func (c *zapCore) With(fields []zapcore.Field) zapcore.Core {
	clone := *c
	clone.fields = append(slices.Clip(c.fields), fields...)
	return &clone
}

func (c *zapCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *zapCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	level := zerologLevel(e.Level)
	if c.quiet != nil && c.quiet.Load() {
		level = zerolog.DebugLevel
	}
	ev := c.log.WithLevel(level)
	if e.LoggerName != "" {
		ev = ev.Str("etcd_logger", e.LoggerName)
	}
	for _, k := range keys {
		// etcd uses kebab-case keys; ours are snake_case.
		ev = ev.Interface(strings.ReplaceAll(k, "-", "_"), enc.Fields[k])
	}
	ev.Msg(e.Message)
	return nil
}

func (c *zapCore) Sync() error { return nil }

func zerologLevel(l zapcore.Level) zerolog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return zerolog.DebugLevel
	case l == zapcore.InfoLevel:
		return zerolog.InfoLevel
	case l == zapcore.WarnLevel:
		return zerolog.WarnLevel
	default:
		// DPanic, Panic and Fatal are reported as errors; zap itself still
		// panics or exits after writing, as etcd expects.
		return zerolog.ErrorLevel
	}
}
