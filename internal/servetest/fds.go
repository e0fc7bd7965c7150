package servetest

import (
	"io"
	"os"
	"syscall"
	"testing"
	"time"
)

// ExhaustFDs lowers the process's RLIMIT_NOFILE to a few more than the
// descriptors open now, dials until dial fails (the server's accepts then
// fail with EMFILE while connections wait in its backlog), holds that for
// a moment, then restores the limit and closes the connections. A server
// under test must still be serving afterwards. Not for parallel tests.
func ExhaustFDs(t testing.TB, dial func() (io.Closer, error)) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = uint64(len(ents) + 8)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var conns []io.Closer
	defer func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
			t.Errorf("restore RLIMIT_NOFILE: %v", err)
		}
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 64 {
		c, err := dial()
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	if len(conns) == 64 {
		t.Fatal("dials never ran out of descriptors")
	}
	time.Sleep(200 * time.Millisecond) // the server's accepts meet EMFILE and back off
}
