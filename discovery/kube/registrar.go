package kube

import (
	"context"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
)

// ReassertInterval is how often a worker rewrites its annotation.
const ReassertInterval = 30 * time.Second

// Namespace resolves the Pods' namespace: the flag, else POD_NAMESPACE,
// else the credentials' namespace, else "default".
func Namespace(flag string, c Config) string {
	for _, ns := range []string{flag, os.Getenv("POD_NAMESPACE"), c.Namespace} {
		if ns = strings.TrimSpace(ns); ns != "" {
			return ns
		}
	}
	return "default"
}

// Registrar keeps a worker's record in its own Pod's annotation. Its
// methods may be called from any goroutine; Run is driven by one owner.
type Registrar struct {
	cli      *Client
	ns, pod  string
	interval time.Duration
	log      zerolog.Logger

	mu  sync.Mutex
	rec discovery.Record
}

// NewRegistrar returns a registrar of rec on Pod namespace/podName.
func NewRegistrar(cli *Client, namespace, podName string, rec discovery.Record, log zerolog.Logger) *Registrar {
	return &Registrar{cli: cli, ns: namespace, pod: podName, rec: rec, interval: ReassertInterval, log: log}
}

// Register writes the annotation once.
func (r *Registrar) Register(ctx context.Context) error {
	r.mu.Lock()
	rec := r.rec
	r.mu.Unlock()
	p, err := AnnotationPatch(&rec)
	if err != nil {
		return err
	}
	return r.cli.PatchPod(ctx, r.ns, r.pod, p)
}

// SetStatus rewrites the annotation with a new status (kept for the
// re-assertions that follow).
func (r *Registrar) SetStatus(ctx context.Context, st discovery.Status) error {
	r.mu.Lock()
	r.rec.Status = st
	r.mu.Unlock()
	return r.Register(ctx)
}

// Revoke clears the annotation: the worker leaves every server's fleet.
func (r *Registrar) Revoke(ctx context.Context) error {
	return r.cli.PatchPod(ctx, r.ns, r.pod, []byte(ClearPatch))
}

// Record returns the record as last written.
func (r *Registrar) Record() discovery.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec
}

// Run re-asserts the annotation every 30 s until ctx ends (a cleared or
// overwritten annotation heals). Write failures are logged and retried at
// the next tick. It does not clear the annotation: Revoke does.
func (r *Registrar) Run(ctx context.Context) error {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := r.Register(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn().Err(err).Str("pod", r.pod).Msg("kube: re-assert worker annotation")
			}
		}
	}
}
