// Package servetest runs a test's in-process server (router, simulator,
// kvd, RESP listener) on a listener for the length of the test.
//
// It owns one goroutine per server: it starts in Run and ends in the
// test's cleanup, which cancels the server's context and waits for its
// Serve to return, so goleak finds nothing left. Cleanups registered
// before Run run after the server has stopped.
package servetest
