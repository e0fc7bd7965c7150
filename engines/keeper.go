package engines

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/kube"
)

// ErrNoPodName: the kubernetes backend needs POD_NAME (downward API) to
// patch the worker's own Pod.
var ErrNoPodName = errors.New("engines: --discovery-backend kubernetes needs POD_NAME (downward API)")

// recordKeeper keeps the worker's record where servers discover it: an etcd
// key under a lease (discovery.Registrar) or the worker Pod's annotation
// (kube.Registrar).
type recordKeeper interface {
	Register(ctx context.Context) error
	Run(ctx context.Context) error
	SetStatus(ctx context.Context, st discovery.Status) error
	Revoke(ctx context.Context) error
}

// kubeKeeper prepares the kubernetes backend before the engine starts, so
// that missing credentials or POD_NAME fail fast; the returned function
// builds the keeper of a record, close releases the client.
func kubeKeeper(cfg *config.Worker, log zerolog.Logger) (func(discovery.Record) recordKeeper, func(), error) {
	pod := os.Getenv("POD_NAME")
	if pod == "" {
		return nil, nil, ErrNoPodName
	}
	kc, err := kube.LoadConfig(cfg.Kube.Kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("engines: kubernetes credentials: %w", err)
	}
	cli, err := kube.NewClient(kc)
	if err != nil {
		return nil, nil, fmt.Errorf("engines: %w", err)
	}
	ns := kube.Namespace(cfg.Kube.Namespace, kc)
	log.Info().Str("pod", pod).Str("namespace", ns).Str("api_server", kc.Server).Msg("worker registers through its Pod annotation")
	return func(rec discovery.Record) recordKeeper {
		return kube.NewRegistrar(cli, ns, pod, rec, log)
	}, cli.Close, nil
}
