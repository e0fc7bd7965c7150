// Package e2e holds the end-to-end tests: real `infera` processes (serve,
// worker, sim) built from this module, talking over loopback HTTP and an
// embedded etcd. The package has no non-test code besides this file.
//
// Concurrency: each test owns the processes it starts and stops them in
// t.Cleanup; tests in this package do not run in parallel with each other.
package e2e
