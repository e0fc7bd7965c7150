// Package discovery owns the fleet registry in etcd: the worker record (wire
// compatible with Infera fleets), the registrar that keeps a worker's record
// alive under a lease (each etcd call in short tries, so that one sent to a
// member that stopped answering is sent again, to the next member, well
// within the TTL), the fleet watcher that turns etcd state into immutable
// snapshots (resuming a broken watch, or one whose member stopped answering
// on it, from its last revision on another member, and holding, for
// Watcher.SetOutageGrace, the removals that an etcd outage may have caused
// while workers re-register), the kvd registry
// (KVDRecord: a kvd's host, peer listener and transport, kept by
// KVDRegistrar on the registrar's lease code and read by KVDWatcher on the
// watcher's list/watch loop), and the embedded single-node etcd used when
// no cluster is given.
//
// Concurrency: a Registrar (KVDRegistrar) and a Watcher (KVDWatcher) are
// each driven by one goroutine (their Run method) owned by the caller;
// Snapshot and KVDSnapshot values are immutable and published through an
// atomic pointer, so readers never lock.
package discovery
