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

// The timeouts frontConn applies itself (a keep-alive request's headers
// and answer, the idle wait) allocate nothing either.
func TestFrontTimeoutsAllocs(t *testing.T) {
	c, _ := testkit.TCPPair(t)
	fd := &frontDoor{own: frontTimeouts{on: true, header: time.Second, idle: time.Minute, write: time.Second}}
	fc := &frontConn{Conn: c, fd: fd}
	fc.answerDone()
	if n := testing.AllocsPerRun(100, func() {
		fc.requestBegins()
		if fc.beforeRead() != nil || fc.beforeWrite() != nil {
			t.Fatal("deadline not set")
		}
		fc.answerDone()
		if fc.beforeRead() != nil {
			t.Fatal("deadline not set")
		}
	}); n != 0 {
		t.Fatalf("%.1f allocations a request, want 0", n)
	}
	if fc.dl.readRel || fc.dl.read.IsZero() {
		t.Fatal("the idle wait's deadline was not taken from the read's start")
	}
}
