package kube

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
)

// ReassertInterval is how often a worker rewrites its annotation.
const ReassertInterval = 30 * time.Second

// Registrar keeps a worker's record in its own Pod's annotation.
type Registrar struct {
	cli      *Client
	ns, pod  string
	patch    []byte
	interval time.Duration
	log      zerolog.Logger
}

// NewRegistrar validates the record and prepares its patch.
func NewRegistrar(cli *Client, namespace, podName string, rec discovery.Record, log zerolog.Logger) (*Registrar, error) {
	p, err := AnnotationPatch(&rec)
	if err != nil {
		return nil, err
	}
	return &Registrar{cli: cli, ns: namespace, pod: podName, patch: p, interval: ReassertInterval, log: log}, nil
}

// Register writes the annotation once.
func (r *Registrar) Register(ctx context.Context) error {
	return r.cli.PatchPod(ctx, r.ns, r.pod, r.patch)
}

// Run re-asserts the annotation every 30 s until ctx ends, then clears it
// (with a fresh 5 s deadline). Write failures are logged and retried at the
// next tick.
func (r *Registrar) Run(ctx context.Context) error {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return r.cli.PatchPod(cctx, r.ns, r.pod, []byte(ClearPatch))
		case <-t.C:
			if err := r.Register(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn().Err(err).Str("pod", r.pod).Msg("kube: re-assert worker annotation")
			}
		}
	}
}
