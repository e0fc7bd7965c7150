package kvcache

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// zmq4 v0.17.0's PUB socket starts a writer goroutine that its Close
		// never stops (pubMWriter.run waits on a cond nobody signals). Only
		// TestSubscriberWithZmq4PubSocket creates one, to prove interop with
		// that socket type; the package itself never uses zmq4's Socket.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	)
}
