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
	at int64 // unix ns of the deadline on the socket; 0: unknown; noDeadline: none
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
	if d.keeps(want, slack, want) {
		return nil
	}
	var set time.Time // none
	if want != noDeadline {
		set = dl.Add(time.Duration(slack))
	}
	return d.set(c, write, set, want+slack)
}

// SetTick sets c's read deadline (write: its write deadline) for a
// periodic wake-up every tick from now, one that may come early: the
// waiting loop checks the time itself when it wakes (a stall tick, a
// stream's heartbeat). So
// beside the late slack of Set it keeps a deadline already set that comes
// early, as long as it is at least half a tick from now: a busy connection
// sets its deadline about every half tick instead of every 1/SlackDiv of
// one, and a wait still wakes at least every tick and its slack.
func (d *Deadline) SetTick(c net.Conn, write bool, tick time.Duration, now time.Time) error {
	from, slack := now.UnixNano(), max(tick/SlackDiv, 0)
	want := from + int64(tick)
	if d.keeps(want, int64(slack), from+int64(tick/2)) {
		return nil
	}
	return d.set(c, write, now.Add(tick+slack), want+int64(slack))
}

// keeps reports whether the deadline set may stand for want (unix ns;
// noDeadline: none): it lies from earliest to want+slack.
func (d *Deadline) keeps(want, slack, earliest int64) bool {
	have := d.at
	return have >= earliest && have-want <= slack
}

// set sets the socket's deadline to t (zero: none), at in unix ns.
func (d *Deadline) set(c net.Conn, write bool, t time.Time, at int64) error {
	var err error
	if write {
		err = c.SetWriteDeadline(t)
	} else {
		err = c.SetReadDeadline(t)
	}
	if err != nil {
		d.at = 0
		return err
	}
	d.at = at
	return nil
}

// Forget makes d unknowing: the socket's deadline was set around it, and
// the next Set sets it whatever it is.
func (d *Deadline) Forget() { d.at = 0 }
