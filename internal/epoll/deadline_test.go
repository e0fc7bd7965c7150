package epoll_test

import (
	"net"
	"testing"
	"time"

	"github.com/infera/infera/internal/epoll"
	"github.com/infera/infera/internal/testkit"
)

// deadlineCounter is a real connection that records the deadlines set on it.
type deadlineCounter struct {
	net.Conn
	reads, writes int
	last          time.Time
}

func (c *deadlineCounter) SetReadDeadline(t time.Time) error {
	c.reads++
	c.last = t
	return c.Conn.SetReadDeadline(t)
}

func (c *deadlineCounter) SetWriteDeadline(t time.Time) error {
	c.writes++
	c.last = t
	return c.Conn.SetWriteDeadline(t)
}

// A deadline is set a slack later than wanted, and a later wish within
// that slack keeps it; a hard one gets at most HardSlackMax.
func TestDeadlineSlackKeepsANearDeadline(t *testing.T) {
	a, _ := testkit.TCPPair(t)
	c := &deadlineCounter{Conn: a}
	var d epoll.Deadline
	now := time.Now()
	if err := d.Set(c, false, now.Add(16*time.Second), now, false); err != nil {
		t.Fatal(err)
	}
	if want := now.Add(17 * time.Second); c.reads != 1 || !c.last.Equal(want) {
		t.Fatalf("%d sets, last %v; want 1 at %v (1/16 slack)", c.reads, c.last, want)
	}
	if err := d.Set(c, false, now.Add(16*time.Second+time.Millisecond), now.Add(time.Millisecond), false); err != nil || c.reads != 1 {
		t.Fatalf("a wish within the slack set the deadline again (%d sets, %v)", c.reads, err)
	}
	if err := d.Set(c, false, now.Add(16*time.Second), now, true); err != nil {
		t.Fatal(err)
	}
	if want := now.Add(16*time.Second + epoll.HardSlackMax); c.reads != 2 || !c.last.Equal(want) {
		t.Fatalf("%d sets, hard deadline at %v; want 2, at %v", c.reads, c.last, want)
	}
	if c.writes != 0 {
		t.Fatalf("%d write deadlines set for read ones", c.writes)
	}
}

// An earlier deadline, none after one, one after none, and anything after
// Forget are set; none twice is set once.
func TestDeadlineSetsWhatTheSlackCannotCover(t *testing.T) {
	a, _ := testkit.TCPPair(t)
	c := &deadlineCounter{Conn: a}
	var d epoll.Deadline
	now := time.Now()
	steps := []struct {
		dl   time.Time
		sets int
	}{
		{now.Add(time.Minute), 1},
		{now.Add(time.Second), 2},       // earlier
		{time.Time{}, 3},                // none
		{time.Time{}, 3},                // none again: kept
		{now.Add(time.Second), 4},       // one after none
		{now.Add(time.Second + 1), 4},   // within the slack
		{now.Add(-time.Millisecond), 5}, // already past: set, so the wait fails at once
	}
	for i, s := range steps {
		if err := d.Set(c, true, s.dl, now, false); err != nil {
			t.Fatal(err)
		}
		if c.writes != s.sets {
			t.Fatalf("step %d (%v): %d sets, want %d", i, s.dl, c.writes, s.sets)
		}
	}
	d.Forget()
	if err := d.Set(c, true, now.Add(-time.Millisecond), now, false); err != nil || c.writes != 6 {
		t.Fatalf("after Forget: %d sets (%v), want 6", c.writes, err)
	}
}

// A deadline already past when set makes the next read fail with a
// timeout, even when a later one was set before.
func TestDeadlinePastEndsTheRead(t *testing.T) {
	a, _ := testkit.TCPPair(t)
	var d epoll.Deadline
	now := time.Now()
	if err := d.Set(a, false, now.Add(time.Hour), now, false); err != nil {
		t.Fatal(err)
	}
	if err := d.Set(a, false, now.Add(-time.Millisecond), time.Now(), false); err != nil {
		t.Fatal(err)
	}
	_, err := a.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("read: %v, want a timeout", err)
	}
}

// A tick's deadline is kept while it comes no earlier than half a tick
// from now and no later than the tick and its slack; outside that it is
// set again, a tick and its slack from now.
func TestDeadlineTickKeepsAnEarlyDeadline(t *testing.T) {
	a, _ := testkit.TCPPair(t)
	c := &deadlineCounter{Conn: a}
	var d epoll.Deadline
	const tick = 160 * time.Millisecond
	slack := tick / epoll.SlackDiv
	now := time.Now()
	steps := []struct {
		after time.Duration // from now
		sets  int
	}{
		{0, 1},
		{tick / 4, 1},           // the deadline is 3/4 tick + slack away: kept (Set would set it)
		{tick/2 + slack, 1},     // exactly half a tick away: kept
		{tick/2 + slack + 1, 2}, // less than half a tick away: set
		{tick/2 + slack + 2, 2},
	}
	for i, s := range steps {
		at := now.Add(s.after)
		if err := d.SetTick(c, false, tick, at); err != nil {
			t.Fatal(err)
		}
		if c.reads != s.sets {
			t.Fatalf("step %d (+%v): %d sets, want %d", i, s.after, c.reads, s.sets)
		}
		if i == 0 || s.sets != steps[i-1].sets {
			if want := at.Add(tick + slack); !c.last.Equal(want) {
				t.Fatalf("step %d: set %v, want %v", i, c.last, want)
			}
		}
	}
	// A deadline later than the tick and its slack (an idle timeout set
	// before) is set again.
	if err := d.Set(c, false, now.Add(time.Minute), now, false); err != nil || c.reads != 3 {
		t.Fatalf("%d sets, %v", c.reads, err)
	}
	if err := d.SetTick(c, false, tick, now); err != nil || c.reads != 4 {
		t.Fatalf("a tick after a later deadline: %d sets, %v; want 4", c.reads, err)
	}
}
