// Package etcdtest starts etcd for tests: an embedded single-node etcd
// (Start, StartRestartable) on free ports in a per-test directory, and a
// cluster of real etcd server processes (StartCluster) whose members a
// test can SIGKILL. Each is stopped when the test ends.
//
// Concurrency: Start and StartCluster may be called from parallel tests;
// each call owns its own servers, data directories and ports, and
// t.Cleanup stops them. A Cluster's methods are called from the test
// goroutine.
package etcdtest
