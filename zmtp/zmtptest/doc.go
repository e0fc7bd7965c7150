// Package zmtptest provides the engine side of KV-event streams for tests:
// Publisher, a vLLM-style PUB endpoint on zmq4's connection API (zmq4's own
// PUB socket leaks a goroutine on Close), and Replay, a vLLM-style replay
// server on a real zmq4 ROUTER socket. kvcache, router and simulator tests
// share them.
//
// Concurrency: every method is safe for concurrent use; both close with
// the test (t.Cleanup) and leave no goroutine behind.
package zmtptest
