package router

import "testing"

// A unary answer whose head lines the relay writes (relayhead.go): the
// lines go where fasthttp puts the first headers after Content-Length,
// before the connection's line, whichever fasthttp wrote, and the body
// follows in the same write.
func TestUnaryAnswerWriteTo(t *testing.T) {
	const (
		head  = "HTTP/1.1 200 OK\r\nServer: infera\r\nDate: d\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
		lines = "X-Request-Id: r1\r\nX-Infera-Request-Id: r1\r\nX-Infera-Worker: w1\r\n"
	)
	for _, conn := range []string{"", "Connection: keep-alive\r\n", "Connection: close\r\n"} {
		rc := &recordConn{}
		fc := &frontConn{Conn: rc}
		u := &fc.una
		u.c = fc
		u.lines = appendHeadLines(u.lines[:0], []byte("r1"), workerHeadLine([]byte("w1")), "")
		u.body = append(u.body[:0], "{}"...)
		fc.holdHead()
		mustWrite(t, fc, "earlier answer"+head+conn+"\r\n")
		if len(rc.writes) != 0 {
			t.Fatalf("the head went out before its lines: %q", rc.writes)
		}
		n, err := u.WriteTo(nil)
		if err != nil || n != 2 {
			t.Fatalf("WriteTo: %d, %v", n, err)
		}
		want := "earlier answer" + head + lines + conn + "\r\n{}"
		if len(rc.writes) != 1 || rc.writes[0] != want {
			t.Fatalf("with %q: writes %q, want %q", conn, rc.writes, want)
		}
		if fc.hold.buf != nil || fc.hold.on || fc.hold.head {
			t.Fatal("the connection still holds after the answer")
		}
	}
}

// TestUnaryAnswerWriteToAllocs: a unary answer's head lines and body cost
// no allocation.
func TestUnaryAnswerWriteToAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	cc := &countConn{}
	fc := &frontConn{Conn: cc}
	u := &fc.una
	u.c = fc
	id, worker := []byte("0123456789abcdef-0123456789abcdef"), workerHeadLine([]byte("127.0.0.1:8000"))
	head := []byte("HTTP/1.1 200 OK\r\nServer: infera\r\nDate: d\r\nContent-Type: application/json\r\nContent-Length: 300\r\n\r\n")
	u.body = make([]byte, 300)
	run := func() {
		u.lines = appendHeadLines(u.lines[:0], id, worker, "")
		fc.holdHead()
		_, _ = fc.Write(head)
		_, _ = u.WriteTo(nil)
	}
	run()
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("a unary answer's head lines allocate %.1f times, want 0", n)
	}
	if cc.writes != 102 {
		t.Fatalf("%d writes for 102 answers, want one each", cc.writes)
	}
}
