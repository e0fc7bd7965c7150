package upstream

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/internal/epoll"
)

// ErrShuttingDown is returned by Dial once the Set is closed.
var ErrShuttingDown = errors.New("upstream: router is shutting down")

// Progress is the worker's progress accounting, given to a connection when
// it is dialed; nil: untracked.
type Progress interface {
	// Progress stamps the worker's progress after a read returned bytes
	// (now: unix ns).
	Progress(now int64)
	// StallTick is how often an unwatched read wakes to check for a
	// stall; 0: stall detection is off. It is asked once, by Dial.
	StallTick() time.Duration
	// GiveUp reports an error that ends an unwatched read waiting since
	// start (the worker is confirmed stalled), or nil to keep waiting.
	GiveUp(now, start time.Time) error
}

// Owner is the unary exchange using a connection.
type Owner interface {
	// CanRetry reports whether the exchange may still go elsewhere: an
	// exchange with no retry left keeps waiting on a stalled worker.
	CanRetry() bool
}

// Watcher is what a watched connection asks of the stream reading it, from
// inside Read on the reader's own goroutine.
type Watcher interface {
	// BeforeRead returns the hard deadline of the next read and the
	// heartbeat cadence (0: no heartbeats now).
	BeforeRead(now time.Time) (hard time.Time, beat time.Duration)
	// Heartbeat runs after a beat of silence; an error ends the read.
	Heartbeat() error
	// NoteReadTimeout reports that a read hit its hard deadline.
	NoteReadTimeout()
}

// WatchSlot holds a connection's watcher (an atomic pointer to it swaps the
// watcher without an allocation).
type WatchSlot struct{ Watcher }

// Dial connects to addr within connectTimeout and wraps the connection so
// that every read and write gets its own deadline: an engine may stream for
// many minutes, but must never go silent for longer than timeout.
// (fasthttp's ReadTimeout would instead bound the whole response, cutting
// long generations.) Bytes read are p's progress.
func Dial(set *Set, addr string, connectTimeout, timeout time.Duration, p Progress) (*Conn, error) {
	d := net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	dc := &Conn{Conn: c, timeout: timeout, set: set, prog: p}
	if p != nil {
		dc.tick = p.StallTick()
	}
	dc.held.Init(c)
	if !set.add(dc) {
		_ = c.Close()
		return nil, ErrShuttingDown
	}
	return dc, nil
}

// Conn is an upstream connection with a per-operation idle timeout.
//
// Two more bounds apply on top. A deadline an exchange sets (Exchange.Do:
// the first-byte and request timeouts of one attempt) caps every operation
// until it is cleared. And while a stream watches the connection (Watch),
// reads follow its deadlines and, whenever the worker is silent for a
// heartbeat interval, the watcher runs from inside Read — the reading
// goroutine is the stream's own, so nothing runs concurrently — and a
// failed heartbeat ends the read.
type Conn struct {
	net.Conn
	timeout time.Duration
	set     *Set
	once    sync.Once
	prog    Progress      // nil: not tracked
	tick    time.Duration // prog.StallTick(), 0: none
	// owner is the unary exchange on it, read and written only on that
	// exchange's goroutine; nil otherwise.
	owner Owner

	readHard  atomic.Int64 // unix ns; 0: none
	writeHard atomic.Int64
	// The deadlines last set on Conn, by its reading and its writing
	// goroutine: a timeout or tick ends up to 1/epoll.SlackDiv of its
	// wait late, a hard deadline (fasthttp's first-byte and request
	// deadlines, a stream's) up to 1/epoll.HardSlackDiv and at most
	// epoll.HardSlackMax (epoll.Deadline).
	readSet, writeSet epoll.Deadline
	watch             atomic.Pointer[WatchSlot] // the stream reading it, if watched

	// hold: writes are held (HoldWrites) until the next read sends them;
	// both on the exchange's goroutine.
	hold bool
	held epoll.Held

	// br and bw are the connection's own reader and writer for its
	// exchanges (buffers), made on its first: an exchange on it takes no
	// pooled ones (sync.Pool Get, Reset, Put on every request). On the
	// exchange's goroutine only.
	br *bufio.Reader
	bw *bufio.Writer
}

// buffers returns c's reader and writer for a new exchange, made on the
// first with readSize and writeSize bytes (fasthttp's defaults when not
// above zero) and reset on every one: what a past answer left unread is
// dropped, and a writer's past error forgotten, as with pooled ones.
func (c *Conn) buffers(readSize, writeSize int) (*bufio.Reader, *bufio.Writer) {
	if c.br == nil {
		c.br = bufio.NewReaderSize(c, bufSize(readSize, defaultReadBufferSize))
		c.bw = bufio.NewWriterSize(c, bufSize(writeSize, defaultWriteBufferSize))
		return c.br, c.bw
	}
	c.br.Reset(c)
	c.bw.Reset(c)
	return c.br, c.bw
}

// fasthttp's HostClient buffer sizes when its ReadBufferSize and
// WriteBufferSize are not set.
const (
	defaultReadBufferSize  = 4096
	defaultWriteBufferSize = 4096
)

// bufSize is size, or def when size is not above zero.
func bufSize(size, def int) int {
	if size <= 0 {
		return def
	}
	return size
}

// HoldWrites makes c hold what is written next (up to epoll.MaxHeld
// bytes) until the next Read, which sends it from inside its wait for the
// answer (epoll.Held): right after a request, a read that tries the socket
// first nearly always finds nothing. For the exchange's goroutine; the
// Read must follow (Exchange.Do's answer).
func (c *Conn) HoldWrites() { c.hold = true }

// holdRequest appends req where c holds its writes (epoll.Held.HoldSpace),
// where Exchange.do would write it into c's writer and Hold copy it from
// there again: the request is framed once, where it waits for the Read
// that sends it. false: nothing was appended (req only writes itself, c
// does not hold, or it would not be held): req is written as before.
func (c *Conn) holdRequest(req RequestWriter) bool {
	n := req.MaxRequestLen()
	if n == 0 || !c.hold {
		return false
	}
	b, ok := c.held.HoldSpace(n)
	if !ok {
		return false
	}
	c.held.SetHeld(req.AppendRequest(b))
	return true
}

// Holding reports whether c holds written bytes not sent yet.
func (c *Conn) Holding() bool { return c.held.Holding() }

// SetOwner sets (nil: clears) the unary exchange using c.
func (c *Conn) SetOwner(o Owner) { c.owner = o }

// Watch makes s's watcher (nil: none) watch c's reads.
func (c *Conn) Watch(s *WatchSlot) { c.watch.Store(s) }

// capExact returns the earlier of t and the hard deadline h (unix ns, 0:
// none), and whether h won.
func capExact(t time.Time, h int64) (time.Time, bool) {
	if h != 0 && h < t.UnixNano() {
		return time.Unix(0, h), true
	}
	return t, false
}

func (c *Conn) Read(p []byte) (int, error) {
	now := time.Now()
	sw := c.watch.Load()
	if sw == nil {
		return c.readUnwatched(p, now)
	}
	hard, every := sw.BeforeRead(now)
	// The first try's beat is every from now, decided without making
	// it (time.Time's Add and Before are calls, on every read); after
	// a wake, the beat is kept as a time.
	isBeat := every > 0 && every < hard.Sub(now)
	tick := every
	var beat time.Time
	for {
		// A beat's deadline may wake the read early (SetTick): the beat
		// is then only waited for again.
		var err error
		if isBeat {
			err = c.readSet.SetTick(c.Conn, false, tick, now)
		} else {
			err = c.readSet.Set(c.Conn, false, hard, now, true)
		}
		if err != nil {
			return 0, err
		}
		n, waited, err := c.read(p)
		if n > 0 || err == nil {
			c.progress(n, now, waited)
			return n, err
		}
		if !isBeat || !IsTimeout(err) {
			if IsTimeout(err) {
				sw.NoteReadTimeout()
			}
			return n, err
		}
		if beat.IsZero() {
			beat = now.Add(every)
		}
		if now = time.Now(); now.Before(beat) {
			tick, isBeat = beat.Sub(now), beat.Before(hard)
			continue
		}
		if herr := sw.Heartbeat(); herr != nil {
			return 0, herr
		}
		beat = beat.Add(every)
		now = time.Now()
		tick, isBeat = beat.Sub(now), beat.Before(hard)
	}
}

// progress stamps the worker's progress after a read of n bytes that
// began at now. A read that did not wait found the bytes there when its
// system call ran, right after now (only the deadline's bookkeeping comes
// between): now is when they came to within that, never later, and the
// stall window (and the router's own 5 ms grain between stamps) dwarfs
// it, so the clock is not read again. A read that waited may have waited
// up to its deadline: the time is read after it.
func (c *Conn) progress(n int, now time.Time, waited bool) {
	if n > 0 && c.prog != nil {
		if waited {
			now = time.Now()
		}
		c.prog.Progress(now.UnixNano())
	}
}

// readUnwatched is a read outside a watched stream: response headers, a
// unary answer, a probe. With stall detection on it wakes every stall tick,
// and gives up once Progress.GiveUp says so: nothing of the answer reached
// the client yet, so the request can go elsewhere, and closing the
// connection tells the engine to drop it.
func (c *Conn) readUnwatched(p []byte, now time.Time) (int, error) {
	// The read's deadline is the idle timeout from now, or fasthttp's
	// when earlier (exact). The first try decides between it and a
	// tick without making it as a time (time.Time's Add and Before are
	// calls, on every read): a tick comes first when shorter than the
	// timeout, or before fasthttp's deadline in unix ns, as comparing
	// the times would find.
	at, capAt, tick := now.UnixNano(), c.readHard.Load(), c.tick
	exact := capAt != 0 && capAt < at+int64(c.timeout)
	isTick := tick > 0 && (!exact && tick < c.timeout || exact && at+int64(tick) < capAt)
	start := now
	var hard time.Time // made when set, or after a wake
	for {
		// A stall tick may wake the read early (SetTick): GiveUp checks
		// the time waited itself, so an early tick only checks early,
		// and ticks still come at least every tick and its slack.
		var err error
		if isTick {
			err = c.readSet.SetTick(c.Conn, false, tick, now)
		} else {
			if hard.IsZero() {
				hard = readDeadline(start, c.timeout, capAt, exact)
			}
			err = c.readSet.Set(c.Conn, false, hard, now, exact)
		}
		if err != nil {
			return 0, err
		}
		n, waited, err := c.read(p)
		if n > 0 || err == nil || !isTick || !IsTimeout(err) {
			c.progress(n, now, waited)
			return n, err
		}
		now = time.Now()
		if gerr := c.prog.GiveUp(now, start); gerr != nil && (c.owner == nil || c.owner.CanRetry()) {
			// A unary exchange with no retry left keeps waiting instead.
			return 0, gerr
		}
		if hard.IsZero() {
			hard = readDeadline(start, c.timeout, capAt, exact)
		}
		isTick = now.Add(tick).Before(hard)
	}
}

// readDeadline is an unwatched read's deadline: timeout from start, or
// the cap (unix ns) when exact.
func readDeadline(start time.Time, timeout time.Duration, capAt int64, exact bool) time.Time {
	if exact {
		return time.Unix(0, capAt)
	}
	return start.Add(timeout)
}

// read reads from the socket, first sending what c holds (HoldWrites).
// With nothing held the read is still Held's: a raw system call that, as
// Go's read, tries the socket first and waits while it has nothing, but
// without the runtime's syscall bookkeeping, which wakes the runtime's
// monitor thread (a futex call and a thread woken) when the process was
// idle, as it is between the tokens of a paced stream, one read each.
// waited: the read may have waited (Held.Waited; a read not Held's may
// always have).
func (c *Conn) read(p []byte) (n int, waited bool, err error) {
	c.hold = false
	if !c.held.Holding() {
		if !c.held.Ready() {
			n, err = c.Conn.Read(p)
			return n, true, err
		}
		n, _, err = c.held.Read(p)
		return n, c.held.Waited(), epoll.OpError(c.Conn, err)
	}
	n, rest, err := c.held.Read(p)
	if err != nil {
		return 0, true, epoll.OpError(c.Conn, err)
	}
	if len(rest) > 0 {
		// The socket took part of the request (it was full): the rest
		// is written as any write is, then the answer read as usual.
		if _, err := c.Write(rest); err != nil {
			return 0, true, err
		}
		n, err = c.Conn.Read(p)
		return n, true, err
	}
	return n, c.held.Waited(), nil
}

func (c *Conn) Write(p []byte) (int, error) {
	if c.hold {
		if c.held.Hold(p) {
			return len(p), nil
		}
		// Too large to hold (or no socket): what is held goes first,
		// then the rest as it comes.
		c.hold = false
		if c.held.Holding() {
			if _, err := c.Write(c.held.Take()); err != nil {
				return 0, err
			}
		}
	}
	now := time.Now()
	dl, exact := capExact(now.Add(c.timeout), c.writeHard.Load())
	if err := c.writeSet.Set(c.Conn, true, dl, now, exact); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// SetReadDeadline records fasthttp's deadline as a cap: Read sets the
// real one.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.readHard.Store(unixOrZero(t))
	return nil
}

// SetWriteDeadline records fasthttp's deadline as a cap, like
// SetReadDeadline.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.writeHard.Store(unixOrZero(t))
	return nil
}

// SetDeadline sets both caps.
func (c *Conn) SetDeadline(t time.Time) error {
	c.readHard.Store(unixOrZero(t))
	c.writeHard.Store(unixOrZero(t))
	return nil
}

func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Close closes the connection and drops it from its Set.
func (c *Conn) Close() error {
	c.once.Do(func() { c.set.remove(c) })
	return c.Conn.Close()
}

// IsTimeout reports whether err is a timeout.
func IsTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
