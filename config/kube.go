package config

import (
	"github.com/urfave/cli/v2"
)

// Discovery backends.
const (
	DiscoveryEtcd       = "etcd"
	DiscoveryKubernetes = "kubernetes"
)

// Kube selects the discovery backend and, for kubernetes, how to reach the
// API server (in-cluster credentials, else a kubeconfig).
type Kube struct {
	Backend    string // etcd | kubernetes
	Namespace  string // Pods' namespace; empty: POD_NAMESPACE, the service account's, else default
	Selector   string // serve: label selector of the worker Pods (required for kubernetes)
	Kubeconfig string // out-of-cluster credentials; empty: in-cluster, $KUBECONFIG, ~/.kube/config
	// EnableScaling (serve): GET/POST /v1/admin/scale reads and patches the
	// InferaDeployment named by the server Pod's infera.amd.com/deployment label.
	EnableScaling bool
}

// Flags returns the backend flags; serve adds the label selector.
func (k *Kube) Flags(serve bool) []cli.Flag {
	fs := []cli.Flag{
		String("discovery-backend", "where workers register: etcd (a record under a lease) or kubernetes (the worker Pod's infera.amd.com/worker-info annotation)", &k.Backend, DiscoveryEtcd),
		withDefaultText(String("k8s-namespace", "namespace of the worker Pods (kubernetes backend)", &k.Namespace, ""), "POD_NAMESPACE, else the service account's namespace, else default"),
		withDefaultText(String("kubeconfig", "kubeconfig for out-of-cluster use (kubernetes backend)", &k.Kubeconfig, ""), "in-cluster service account, else $KUBECONFIG, else ~/.kube/config"),
	}
	if serve {
		fs = append(fs, String("k8s-label-selector", "label selector of the worker Pods the server watches (required with --discovery-backend kubernetes)", &k.Selector, ""),
			Bool("enable-scaling-api", "serve GET/POST /v1/admin/scale: read and set the replicas of this server's InferaDeployment (found from its Pod's infera.amd.com/deployment label; needs POD_NAME, Kubernetes credentials and RBAC to get/patch inferadeployments); off: 403", &k.EnableScaling, false))
	}
	return fs
}

// Validate reports flag problems.
func (k *Kube) Validate(p *Problems, serve bool) {
	switch k.Backend {
	case DiscoveryEtcd:
	case DiscoveryKubernetes:
		if serve && k.Selector == "" {
			p.Addf("--discovery-backend kubernetes needs --k8s-label-selector")
		}
	default:
		p.Addf("--discovery-backend %q: want etcd or kubernetes", k.Backend)
	}
}
