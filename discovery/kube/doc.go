// Package kube is the Kubernetes discovery backend: a worker writes its
// discovery record (the same JSON as the etcd value) into its own Pod's
// annotation infera.amd.com/worker-info with a merge patch, and the server
// lists and watches Pods by label selector and turns them into the same
// discovery.Snapshot the etcd watcher publishes, so the router reads one
// fleet view whichever backend feeds it. Its Scaler reads and patches the
// replicas of the InferaDeployment custom resource the server belongs to
// (GET/POST /v1/admin/scale, --enable-scaling-api) with the reference's
// answers.
//
// It speaks plain HTTPS to the API server (merge-patch a Pod, list and
// watch Pods; get and merge-patch the custom resource) rather than
// k8s.io/client-go; docs/architecture.md says why.
//
// Concurrency: a Registrar and a Watcher are each driven by one goroutine
// (their Run method) owned by the caller and stop when its context ends;
// snapshots are immutable and published through an atomic pointer. A
// Scaler is safe for concurrent use (each call makes its own requests).
package kube
