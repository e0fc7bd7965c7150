package router

import (
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

// Recording a client deadline and setting it when a read or write begins
// allocates nothing, whether the socket's deadline is kept or set.
func TestFrontDeadlinesAllocs(t *testing.T) {
	c, _ := testkit.TCPPair(t)
	fc := &frontConn{Conn: c}
	now := time.Now()
	near, far := now.Add(time.Minute), now.Add(time.Hour)
	i := 0
	if n := testing.AllocsPerRun(100, func() {
		i++
		dl := near // kept: within the slack of the one set
		if i%4 == 0 {
			dl = far // set, then near is earlier: set again
		}
		_ = fc.SetReadDeadline(dl)
		_ = fc.SetWriteDeadline(dl)
		if fc.beforeRead() != nil || fc.beforeWrite() != nil {
			t.Fatal("deadline not set")
		}
	}); n != 0 {
		t.Fatalf("%.1f allocations per deadline, want 0", n)
	}
}
