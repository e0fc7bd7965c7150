package peer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// The hint exchange: a router (or any client holding the secret) tells a
// kvd on host H to pull keys of a namespace from the kvd at Source (host
// G) and may wait, at most Wait, for the pull to finish, so that the
// request it is about to send to H's engine finds the blocks in H's RAM.
// It travels on the same control listener as locate requests, with its
// own magic:
//
//	request: [u32 length] "IKPH" | version u8 | secret, model, compat,
//	         source (u16 length + bytes each) | deadline_ms u32 | wait_ms u32 |
//	         key count u32 | keys (u16 length + bytes each)
//	reply:   [u32 length] "IKPA" | version u8 | status u8 | done u8 | pulled u32
//
// A kvd started without a prefetcher, or a source that is not host:port,
// is answered statusBad; a wrong secret statusDenied.

// Hint limits.
const (
	// MaxHintDeadline bounds how long pulled blocks stay pinned.
	MaxHintDeadline = 10 * time.Minute
	// MaxHintWait bounds how long a hint's sender may be kept waiting.
	MaxHintWait    = 5 * time.Second
	maxSourceBytes = 255
)

var (
	hintMagic  = [4]byte{'I', 'K', 'P', 'H'}
	replyMagic = [4]byte{'I', 'K', 'P', 'A'}
)

// Hint asks a kvd to pull Keys from the kvd at Source.
type Hint struct {
	Secret        []byte
	Model, Compat []byte
	Source        string
	Keys          [][]byte
	// Deadline is how long the pulled blocks stay in RAM (and bounds the
	// pull); Wait how long the reply may wait for the pull (0: at once).
	Deadline, Wait time.Duration
}

// HintReply is a kvd's answer to a hint.
type HintReply struct {
	Status uint8
	// Done: the pull finished within the hint's Wait; Pulled blocks
	// arrived.
	Done   bool
	Pulled uint32
}

// AppendHint appends h as one frame.
func AppendHint(dst []byte, h *Hint) ([]byte, error) {
	if len(h.Keys) > MaxKeys || len(h.Secret) > MaxNameBytes || len(h.Model) > MaxNameBytes || len(h.Compat) > MaxNameBytes ||
		checkSource(h.Source) != nil || h.Deadline <= 0 || h.Deadline > MaxHintDeadline || h.Wait < 0 || h.Wait > MaxHintWait {
		return dst, ErrProtocol
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = append(dst, hintMagic[:]...)
	dst = append(dst, wireVersion)
	dst = appendBytes16(dst, h.Secret)
	dst = appendBytes16(dst, h.Model)
	dst = appendBytes16(dst, h.Compat)
	dst = appendBytes16(dst, []byte(h.Source))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(h.Deadline.Milliseconds()))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(h.Wait.Milliseconds()))
	return appendKeysFrame(dst, start, h.Keys)
}

// ParseHint reads a hint body; its byte slices alias body.
func ParseHint(body []byte, h *Hint) error {
	d := decoder{b: body}
	if m := d.take(4); m == nil || [4]byte(m) != hintMagic || d.u8() != wireVersion {
		return ErrProtocol
	}
	h.Secret, h.Model, h.Compat = d.bytes16(MaxNameBytes), d.bytes16(MaxNameBytes), d.bytes16(MaxNameBytes)
	h.Source = string(d.bytes16(maxSourceBytes))
	dl, wait := time.Duration(d.u32())*time.Millisecond, time.Duration(d.u32())*time.Millisecond
	n := d.u32()
	if d.bad || n > MaxKeys || dl <= 0 || dl > MaxHintDeadline || wait > MaxHintWait || checkSource(h.Source) != nil {
		return ErrProtocol
	}
	h.Deadline, h.Wait = dl, wait
	var err error
	h.Keys, err = d.keys(h.Keys[:0], n)
	return err
}

// appendHintReply appends r as one frame.
func appendHintReply(dst []byte, r HintReply) []byte {
	done := byte(0)
	if r.Done {
		done = 1
	}
	dst = binary.LittleEndian.AppendUint32(dst, 11)
	dst = append(dst, replyMagic[:]...)
	dst = append(dst, wireVersion, r.Status, done)
	return binary.LittleEndian.AppendUint32(dst, r.Pulled)
}

// ParseHintReply reads a hint reply body.
func ParseHintReply(body []byte, r *HintReply) error {
	d := decoder{b: body}
	if m := d.take(4); m == nil || [4]byte(m) != replyMagic || d.u8() != wireVersion {
		return ErrProtocol
	}
	r.Status = d.u8()
	done := d.u8()
	r.Pulled = d.u32()
	if d.bad || len(d.b) != 0 || done > 1 || r.Status > statusBad {
		return ErrProtocol
	}
	r.Done = done == 1
	return nil
}

// checkSource accepts host:port with a numeric port.
func checkSource(s string) error {
	if s == "" || len(s) > maxSourceBytes {
		return ErrProtocol
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return ErrProtocol
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return ErrProtocol
	}
	return nil
}

// HintFunc queues the pull a hint asks for and waits at most wait for it
// (ServerOptions.Hint; Prefetcher.HintWait is one). The slices alias the
// request: it copies what it keeps.
type HintFunc func(source string, model, compat []byte, keys [][]byte, deadline, wait time.Duration) (pulled int, done bool)

// Hinter sends hints to kvds' control listeners on kept connections (one
// per kvd, at most one exchange on it at a time). Safe for concurrent use.
type Hinter struct {
	secret []byte

	mu     sync.Mutex
	idle   map[string]net.Conn
	closed bool
}

// NewHinter returns a hinter whose hints carry secret.
func NewHinter(secret []byte) *Hinter { return &Hinter{secret: secret, idle: map[string]net.Conn{}} }

// ErrHinterClosed: Send after Close.
var ErrHinterClosed = errors.New("peer: hinter closed")

// Send sends h (its Secret is the hinter's) to the kvd whose control
// listener is addr and returns its reply; ctx bounds the exchange, which
// lasts at most about h.Wait once connected.
func (s *Hinter) Send(ctx context.Context, addr string, h Hint) (HintReply, error) {
	h.Secret = s.secret
	req, err := AppendHint(nil, &h)
	if err != nil {
		return HintReply{}, err
	}
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return HintReply{}, ErrHinterClosed
		}
		c, kept := s.idle[addr]
		delete(s.idle, addr)
		s.mu.Unlock()
		if !kept {
			var d net.Dialer
			if c, err = d.DialContext(ctx, "tcp", addr); err != nil {
				return HintReply{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
		}
		r, err := hintExchange(ctx, c, req)
		if err == nil {
			s.mu.Lock()
			if _, busy := s.idle[addr]; busy || s.closed {
				c.Close()
			} else {
				s.idle[addr] = c
			}
			s.mu.Unlock()
			switch r.Status {
			case statusOK:
				return r, nil
			case statusDenied:
				return r, ErrDenied
			}
			return r, fmt.Errorf("%w: the kvd refused the hint", ErrProtocol)
		}
		c.Close()
		if !kept || attempt > 0 || ctx.Err() != nil || errors.Is(err, ErrProtocol) {
			return HintReply{}, err
		}
	}
}

func hintExchange(ctx context.Context, c net.Conn, req []byte) (HintReply, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(MaxHintWait + 5*time.Second)
	}
	_ = c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write(req); err != nil {
		return HintReply{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var b [4 + 15]byte
	if _, err := io.ReadFull(c, b[:4]); err != nil {
		return HintReply{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	n := binary.LittleEndian.Uint32(b[:4])
	if n != 11 {
		return HintReply{}, fmt.Errorf("%w: %d-byte hint reply", ErrProtocol, n)
	}
	if _, err := io.ReadFull(c, b[4:4+n]); err != nil {
		return HintReply{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var r HintReply
	return r, ParseHintReply(b[4:4+n], &r)
}

// Close closes the kept connections.
func (s *Hinter) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for a, c := range s.idle {
		c.Close()
		delete(s.idle, a)
	}
}
