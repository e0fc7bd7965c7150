package epoll

import (
	"math"
	"net"
	"time"
)

// Deadline slack. Setting a socket's deadline costs a runtime timer update
// and two clock reads, and a busy connection would pay it on every read and
// write (fasthttp sets a client connection's read deadline three times a
// request and its write deadline once). So a Deadline sets a deadline a
// little later than wanted, and keeps the one already set while it is no
// earlier than wanted and no later than that slack: a deadline by
// 1/SlackDiv of its wait (an idle timeout of 2 min ends up to 7.5 s late,
// a stall tick of 500 ms up to ~31 ms), a hard one by 1/HardSlackDiv of
// its wait and at most HardSlackMax.
const (
	SlackDiv     = 16
	HardSlackDiv = 64
	HardSlackMax = 20 * time.Millisecond
)

// noDeadline is Deadline.set for "none": a socket without a deadline.
const noDeadline = math.MaxInt64

// Deadline is a socket's read or write deadline as last set through it,
// so that Set skips the runtime when the one set may stand for the one
// wanted. The zero Deadline knows nothing of the socket's (Set sets it).
// It is used by one goroutine at a time, as the socket's reads (or
// writes) are.
type Deadline struct {
	set int64 // unix ns of the deadline on the socket; 0: unknown; noDeadline: none
}

// Set sets c's read deadline (write: its write deadline) to dl, zero for
// none, unless the one already set may stand for it (see SlackDiv); now
// is the time the wait begins, hard asks for the smaller slack.
func (d *Deadline) Set(c net.Conn, write bool, dl, now time.Time, hard bool) error {
	want, slack := int64(noDeadline), int64(0)
	if !dl.IsZero() {
		want = dl.UnixNano()
		slack = (want - now.UnixNano()) / SlackDiv
		if hard {
			slack = min(slack*SlackDiv/HardSlackDiv, int64(HardSlackMax))
		}
		slack = max(slack, 0)
	}
	if have := d.set; have >= want && have-want <= slack {
		return nil
	}
	var set time.Time // none
	if want != noDeadline {
		set = dl.Add(time.Duration(slack))
	}
	var err error
	if write {
		err = c.SetWriteDeadline(set)
	} else {
		err = c.SetReadDeadline(set)
	}
	if err != nil {
		d.set = 0
		return err
	}
	d.set = want + slack
	return nil
}

// Forget makes d unknowing: the socket's deadline was set around it, and
// the next Set sets it whatever it is.
func (d *Deadline) Forget() { d.set = 0 }
