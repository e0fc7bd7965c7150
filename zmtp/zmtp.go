package zmtp

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// Sentinel errors.
var (
	// ErrBadEndpoint: an endpoint is not tcp://host:port (with a dialable
	// host where one is dialed).
	ErrBadEndpoint = errors.New("zmtp: bad endpoint")
	// ErrFrameTooLarge: a peer announced a frame above the limit.
	ErrFrameTooLarge = errors.New("zmtp: frame too large")
	// ErrProtocol: a peer broke the protocol (handshake, framing, limits).
	ErrProtocol = errors.New("zmtp: protocol error")
)

// Frame flags (ZMTP 3.0 §frames).
const (
	FlagMore    = 0x01
	FlagLong    = 0x02
	FlagCommand = 0x04
)

// GreetingLen is the fixed ZMTP 3.x greeting: signature, version,
// mechanism, as-server, filler.
const GreetingLen = 64

// Replay wire format (vLLM's ZmqEventPublisher replay socket, ROUTER side):
// the client (DEALER) sends [b"", start_seq as 8-byte big-endian]; the
// server answers with one message [b"", seq (8-byte BE), payload] per
// buffered batch whose seq >= start, in order, then the terminator
// [b"", ReplayEnd, b""]. ReplayEnd is -1 as a signed 8-byte integer.
const ReplayEnd = ^uint64(0)

// Seq decodes an 8-byte big-endian sequence frame.
func Seq(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

// splitEndpoint checks the tcp://host:port form and splits it.
func splitEndpoint(endpoint string) (rest, host, port string, err error) {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", "", "", fmt.Errorf("%w: %q: want tcp://host:port", ErrBadEndpoint, endpoint)
	}
	host, port, err = net.SplitHostPort(rest)
	if err != nil {
		return "", "", "", fmt.Errorf("%w: %q: %w", ErrBadEndpoint, endpoint, err)
	}
	return rest, host, port, nil
}

// DialAddr checks a ZMQ endpoint tcp://host:port a peer can dial and
// returns host:port for net.Dial.
func DialAddr(endpoint string) (string, error) {
	rest, host, port, err := splitEndpoint(endpoint)
	if err != nil {
		return "", err
	}
	// A bind address (tcp://*:5557) is what engines are configured with; the
	// registry must carry an address a router can dial.
	if host == "" || host == "*" {
		return "", fmt.Errorf("%w: %q: host is a bind wildcard", ErrBadEndpoint, endpoint)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("%w: %q: bad port", ErrBadEndpoint, endpoint)
	}
	return rest, nil
}

// RankEndpoint returns the endpoint data-parallel rank publishes on: the
// base endpoint's port plus rank, as vLLM offsets its publishers.
func RankEndpoint(endpoint string, rank int) (string, error) {
	hostport, err := DialAddr(endpoint)
	if err != nil {
		return "", err
	}
	host, port, _ := net.SplitHostPort(hostport)
	p, _ := strconv.Atoi(port)
	if rank < 0 || p+rank > 65535 {
		return "", fmt.Errorf("%w: %q: rank %d past the port range", ErrBadEndpoint, endpoint, rank)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+rank)), nil
}

// Listen binds a ZMQ tcp:// endpoint; host * means every interface.
func Listen(ctx context.Context, endpoint string) (net.Listener, error) {
	_, host, port, err := splitEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if host == "*" {
		host = ""
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", endpoint, err)
	}
	return ln, nil
}

// BoundEndpoint is the configured endpoint with the listener's real port
// (the configured one may be 0); its host is kept, "*" included.
func BoundEndpoint(endpoint string, ln net.Listener) string {
	host, _, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
	addr, ok := ln.Addr().(*net.TCPAddr)
	if err != nil || !ok {
		return "tcp://" + ln.Addr().String()
	}
	if host == "*" {
		return "tcp://*:" + strconv.Itoa(addr.Port)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

// Handshake runs the ZMTP 3.0 greeting and NULL-security READY exchange on
// nc as a socket of type typ (server: the accepting side) within timeout,
// reading through a LimitConn of maxFrame. Cancelling ctx closes nc, the
// only way to interrupt zmq4's blocking handshake. The returned Conn reads
// through the same limit; a server that frames its own messages may ignore
// it and read nc directly.
func Handshake(ctx context.Context, nc net.Conn, typ zmq4.SocketType, server bool, timeout time.Duration, maxFrame uint64) (*zmq4.Conn, error) {
	if err := nc.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("handshake deadline: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	zc, err := zmq4.Open(&LimitConn{Conn: nc, Max: maxFrame, greeting: GreetingLen}, null.Security(), typ, nil, server, nil)
	if !stop() {
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("%w: handshake: %w", ErrProtocol, err)
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("clear deadline: %w", err)
	}
	return zc, nil
}

// Dial connects to endpoint and completes the handshake as a client socket
// of type typ within timeout. The returned net.Conn is what to close to stop
// the connection (and unblock a pending RecvMsg).
func Dial(ctx context.Context, endpoint string, typ zmq4.SocketType, timeout time.Duration, maxFrame uint64) (*zmq4.Conn, net.Conn, error) {
	addr, err := DialAddr(endpoint)
	if err != nil {
		return nil, nil, err
	}
	d := net.Dialer{Timeout: timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	zc, err := Handshake(ctx, nc, typ, false, timeout, maxFrame)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("%s: %w", endpoint, err)
	}
	return zc, nc, nil
}

// LimitConn tracks ZMTP framing on the read side (after the greeting) and
// fails the read that completes a frame header announcing more than Max
// bytes, before zmq4 allocates the body.
type LimitConn struct {
	net.Conn
	Max uint64

	greeting int    // greeting bytes still to pass through
	state    uint8  // what the next byte is
	sizeLeft int    // size bytes still to read
	size     uint64 // size being assembled
	bodyLeft uint64 // body bytes still to pass through
}

// NewLimitConn wraps nc from the start of its greeting.
func NewLimitConn(nc net.Conn, max uint64) *LimitConn {
	return &LimitConn{Conn: nc, Max: max, greeting: GreetingLen}
}

const (
	lcFlags uint8 = iota
	lcSize
	lcBody
)

func (c *LimitConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if ferr := c.Scan(p[:n]); ferr != nil {
			return 0, ferr
		}
	}
	return n, err
}

// Scan follows bytes read from the connection; it is what Read applies.
func (c *LimitConn) Scan(p []byte) error {
	for len(p) > 0 {
		switch {
		case c.greeting > 0:
			k := min(c.greeting, len(p))
			c.greeting -= k
			p = p[k:]
		case c.state == lcBody:
			k := min(c.bodyLeft, uint64(len(p)))
			c.bodyLeft -= k
			p = p[k:]
			if c.bodyLeft == 0 {
				c.state = lcFlags
			}
		case c.state == lcFlags:
			c.sizeLeft = 1
			if p[0]&FlagLong != 0 {
				c.sizeLeft = 8
			}
			c.size = 0
			c.state = lcSize
			p = p[1:]
		default: // lcSize
			c.size = c.size<<8 | uint64(p[0])
			c.sizeLeft--
			p = p[1:]
			if c.sizeLeft == 0 {
				if c.size > c.Max {
					return fmt.Errorf("%w: %d bytes announced, limit %d", ErrFrameTooLarge, c.size, c.Max)
				}
				c.bodyLeft = c.size
				c.state = lcBody
				if c.size == 0 {
					c.state = lcFlags
				}
			}
		}
	}
	return nil
}

// AppendFrame appends one ZMTP frame.
func AppendFrame(b []byte, flags byte, body []byte) []byte {
	if len(body) > 255 {
		b = append(b, flags|FlagLong)
		b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
	} else {
		b = append(b, flags, byte(len(body)))
	}
	return append(b, body...)
}

// AppendSeqMsg appends a three-part message [first, seq, payload]: a
// published batch (first is the topic) or a replayed one (first is empty).
func AppendSeqMsg(b, first []byte, seq uint64, payload []byte) []byte {
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	b = AppendFrame(b, FlagMore, first)
	b = AppendFrame(b, FlagMore, sb[:])
	return AppendFrame(b, 0, payload)
}

// MaxFramesLimit is the largest Reader.MaxFrames honoured.
const MaxFramesLimit = 64

// Reader reads messages from a connection after the handshake, bounded:
// no frame above MaxFrame bytes, no message of more than MaxFrames parts
// (at most MaxFramesLimit).
type Reader struct {
	R         *bufio.Reader
	MaxFrame  uint64
	MaxFrames int
}

// ReadMsg reads one message (or command, cmd true), appending its frames'
// bodies to scratch; frames alias the returned scratch. It allocates only
// to grow frames or scratch.
func (z *Reader) ReadMsg(frames [][]byte, scratch []byte) ([][]byte, []byte, bool, error) {
	frames, scratch = frames[:0], scratch[:0]
	maxFrames := min(z.MaxFrames, MaxFramesLimit)
	var offs [MaxFramesLimit + 1]int
	cmd := false
	for {
		flags, err := z.R.ReadByte()
		if err != nil {
			return nil, scratch, false, err
		}
		var size uint64
		if flags&FlagLong != 0 {
			var lb [8]byte
			if _, err := io.ReadFull(z.R, lb[:]); err != nil {
				return nil, scratch, false, err
			}
			size = binary.BigEndian.Uint64(lb[:])
		} else {
			c, err := z.R.ReadByte()
			if err != nil {
				return nil, scratch, false, err
			}
			size = uint64(c)
		}
		if size > z.MaxFrame {
			return nil, scratch, false, fmt.Errorf("%w: inbound frame of %d bytes", ErrProtocol, size)
		}
		if len(frames) == maxFrames {
			return nil, scratch, false, fmt.Errorf("%w: inbound message of more than %d frames", ErrProtocol, maxFrames)
		}
		start := len(scratch)
		scratch = slices.Grow(scratch, int(size))[:start+int(size)]
		if _, err := io.ReadFull(z.R, scratch[start:]); err != nil {
			return nil, scratch, false, err
		}
		offs[len(frames)] = start
		frames = append(frames, nil)
		cmd = cmd || flags&FlagCommand != 0
		if flags&FlagMore == 0 || flags&FlagCommand != 0 {
			offs[len(frames)] = len(scratch)
			break
		}
	}
	for i := range frames {
		frames[i] = scratch[offs[i]:offs[i+1]:offs[i+1]]
	}
	return frames, scratch, cmd, nil
}

// PongFor builds the PONG command frame answering a PING command body
// (name-length, name, TTL, context), or nil when the command is not a PING.
func PongFor(cmd []byte) []byte {
	if len(cmd) < 1 || len(cmd) < 1+int(cmd[0]) || string(cmd[1:1+int(cmd[0])]) != "PING" {
		return nil
	}
	body := cmd[1+int(cmd[0]):]
	var ctx []byte
	if len(body) >= 2 {
		ctx = body[2:]
	}
	pong := append([]byte{4}, "PONG"...)
	return AppendFrame(nil, FlagCommand, append(pong, ctx...))
}
