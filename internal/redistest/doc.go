// Package redistest runs a real redis-server for kvd's tests: started on
// a free loopback port in a temporary directory, killed and restarted on
// the same port for outage tests, stopped at the test's cleanup. A missing
// redis-server fails the test (CI installs Debian's redis-server).
//
// Concurrency: a Server is used from the test goroutine only.
package redistest
