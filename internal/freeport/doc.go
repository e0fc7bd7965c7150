// Package freeport hands out the free TCP ports a process chooses for
// servers it starts or configures (an engine's HTTP and KV-event ports, an
// embedded etcd's client and peer ports). A port found free is free only
// until its server binds it, and the kernel may give the same port to the
// next request for a free one in between; the ledger here remembers every
// block handed out for a few minutes, so that one process never hands out
// the same port twice in that time.
//
// Concurrency: Claim and Pick are safe for concurrent use (one mutex).
package freeport
