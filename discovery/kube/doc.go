// Package kube is the Kubernetes discovery backend: a worker writes its
// discovery record (the same JSON as the etcd value) into its own Pod's
// annotation infera.amd.com/worker-info with a merge patch, and the server
// lists and watches Pods by label selector and turns them into the same
// discovery.Snapshot the etcd watcher publishes, so the router reads one
// fleet view whichever backend feeds it.
//
// It speaks plain HTTPS to the API server (three calls: merge-patch a Pod,
// list Pods, watch Pods) rather than k8s.io/client-go; docs/architecture.md
// says why.
//
// Concurrency: a Registrar and a Watcher are each driven by one goroutine
// (their Run method) owned by the caller and stop when its context ends;
// snapshots are immutable and published through an atomic pointer.
package kube
