// Package testkit holds the small helpers many packages' tests share:
// Eventually polls a condition until a deadline, FreePort and FreeAddr find
// a free loopback port, FreePortPair two adjacent ones, TCPPair gives both
// ends of a loopback TCP connection, LogSink is a log destination the code
// under test and the test may use at once, and CA issues the certificates
// of a test's TLS servers and clients (etcd, kube-apiserver, a worker behind
// TLS) for the loopback host.
//
// Concurrency: Eventually runs on the test goroutine; a LogSink may be
// written and read from any number of goroutines; a CA may issue from any.
package testkit
