// Package etcdtest starts an embedded single-node etcd for tests, on free
// ports in a per-test directory, and stops it when the test ends.
//
// Concurrency: Start may be called from parallel tests; each call owns its
// own server, data directory and ports, and t.Cleanup stops the server.
package etcdtest
