// Package natstest runs a real nats-server (Debian's package, found on
// PATH) with JetStream for tests: started on a free loopback port with its
// store in a temporary directory, paused with SIGSTOP and resumed with
// SIGCONT for outage tests, killed and restarted on the same port and
// store, stopped at the test's cleanup. A missing nats-server fails the
// test (CI installs Debian's nats-server).
//
// A separate process rather than the embedded github.com/nats-io/nats-server/v2:
// an outage is a stopped process (SIGSTOP holds the sockets open and silent,
// which is what a hung broker looks like and what no in-process server can
// do), the server's module and its dependencies stay out of go.mod, and
// nothing of the server can end up in the infera binary.
//
// Concurrency: a Server is used from the test goroutine only.
package natstest
