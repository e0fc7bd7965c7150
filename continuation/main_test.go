package continuation_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp refreshes its Date header from one process-wide
		// goroutine started on first use and never stopped.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// fasthttp's worker-pool cleaner notices Serve's end only after
		// its idle sleep (MaxIdleWorkerDuration) and then exits by itself.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	)
}
