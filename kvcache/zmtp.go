package kvcache

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// We speak ZMTP through zmq4's connection-level API (zmq4.Open on a net.Conn
// we dial ourselves) rather than its Socket type: the socket runs its own
// reader, reaper and redial goroutines that cannot be cancelled mid-dial and
// may block on an unread queue at Close, while a bare Conn read in our own
// goroutine stops the moment we close the net.Conn. Dialing ourselves also
// gives the handshake a deadline and lets limitConn cap frame sizes, which
// zmq4 would otherwise allocate at whatever size the peer announces.

// zmtpGreetingLen is the fixed ZMTP 3.x greeting (signature, version,
// mechanism, as-server, filler).
const zmtpGreetingLen = 64

// parseTCPEndpoint checks a ZMQ endpoint tcp://host:port and returns
// host:port for net.Dial.
func parseTCPEndpoint(endpoint string) (string, error) {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("%w: %q: want tcp://host:port", ErrBadEndpoint, endpoint)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %w", ErrBadEndpoint, endpoint, err)
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

// RankEndpoint returns the endpoint data-parallel rank publishes on: the base
// endpoint's port plus rank (DESIGN §7), as vLLM offsets its publishers.
func RankEndpoint(endpoint string, rank int) (string, error) {
	hostport, err := parseTCPEndpoint(endpoint)
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

// dialZMTP connects to endpoint and completes the ZMTP handshake as a socket
// of type typ within timeout. The returned net.Conn is what to close to stop
// the connection (and unblock a pending RecvMsg).
func dialZMTP(ctx context.Context, endpoint string, typ zmq4.SocketType, timeout time.Duration, maxFrame int64) (*zmq4.Conn, net.Conn, error) {
	addr, err := parseTCPEndpoint(endpoint)
	if err != nil {
		return nil, nil, err
	}
	d := net.Dialer{Timeout: timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	if err := nc.SetDeadline(time.Now().Add(timeout)); err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("handshake deadline %s: %w", endpoint, err)
	}
	// Closing the conn is the only way to interrupt zmq4's blocking handshake.
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	zc, err := zmq4.Open(&limitConn{Conn: nc, max: uint64(maxFrame), greeting: zmtpGreetingLen},
		null.Security(), typ, nil, false, nil)
	if !stop() {
		nc.Close()
		return nil, nil, ctx.Err()
	}
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("zmtp handshake %s: %w", endpoint, err)
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("clear deadline %s: %w", endpoint, err)
	}
	return zc, nc, nil
}

// limitConn tracks ZMTP framing on the read side and fails the read that
// completes a frame header announcing more than max bytes, before zmq4
// allocates the body.
type limitConn struct {
	net.Conn
	max uint64

	greeting int    // greeting bytes still to pass through
	state    uint8  // what the next byte is
	sizeLeft int    // size bytes still to read
	size     uint64 // size being assembled
	bodyLeft uint64 // body bytes still to pass through
}

const (
	lcFlags uint8 = iota
	lcSize
	lcBody
)

func (c *limitConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if ferr := c.scan(p[:n]); ferr != nil {
			return 0, ferr
		}
	}
	return n, err
}

func (c *limitConn) scan(p []byte) error {
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
			const longFlag = 0x02
			c.sizeLeft = 1
			if p[0]&longFlag != 0 {
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
				if c.size > c.max {
					return fmt.Errorf("%w: %d bytes announced, limit %d", ErrFrameTooLarge, c.size, c.max)
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

// Replay wire format (vLLM's ZmqEventPublisher replay socket, ROUTER side):
// the client (DEALER) sends [b"", start_seq as 8-byte big-endian]; the server
// answers with one message [b"", seq (8-byte BE), payload] per buffered batch
// whose seq >= start, in order, then the terminator [b"", 0xFF×8 (-1), b""].
const replayEndSeq = ^uint64(0)

func beUint64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }
