// Package kvdtest runs an in-process kvd (RAM only, no arena) on a Unix
// socket of its own for other packages' tests: the router's prewarm, the
// simulator's second-level cache, the worker's start-up probe.
//
// Concurrency: Start is called from the test goroutine; the daemon's
// serve goroutine ends, and its store closes, in the test's cleanup.
package kvdtest
