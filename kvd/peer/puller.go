package peer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/transport"
)

// ErrUnavailable: the source could not be asked or read (it is gone, or
// died mid-pull): the keys are misses.
var ErrUnavailable = errors.New("peer: source unavailable")

// PullStats are one pull's counts.
type PullStats struct {
	Asked, Located, Pulled, Torn int
	Bytes                        int64
}

// PullerStats are a Puller's totals.
type PullerStats struct {
	Pulls, Failed, Located, Pulled, Torn, Bytes int64
}

// Puller reads blocks from other kvds' arenas.
type Puller struct {
	eng    transport.Engine
	secret []byte

	mu      sync.Mutex // one pull at a time uses the scratch region
	scratch *transport.Region
	inOrder bool // eng runs a batch's ops in order (transport.Ordered)
	req     []byte
	body    []byte
	resp    Response
	ops     []transport.Op
	blocks  []block
	conns   map[string]net.Conn // control connections, kept between pulls
	source  net.Addr            // local address of control connections (nil: the system's choice)

	pulls, failed, located, pulled, torn, bytes atomic.Int64
}

// NewPuller registers a scratch region of scratchBytes on eng (a block
// larger than it, with its header, is never pulled).
func NewPuller(eng transport.Engine, scratchBytes int, secret []byte) (*Puller, error) {
	r, err := eng.Register("kvd-peer-scratch", make([]byte, scratchBytes))
	if err != nil {
		return nil, fmt.Errorf("peer: register the scratch region: %w", err)
	}
	o, ok := eng.(transport.Ordered)
	return &Puller{eng: eng, secret: secret, scratch: r, inOrder: ok && o.InOrder()}, nil
}

// Close closes the kept control connections and deregisters the scratch
// region (the engine is its owner's).
func (p *Puller) Close() error {
	p.mu.Lock()
	for a, c := range p.conns {
		c.Close()
		delete(p.conns, a)
	}
	p.mu.Unlock()
	return p.eng.Deregister(p.scratch)
}

// SetSource makes the puller's control connections come from ip (any
// port): a source kvd fenced by the kvd registry (ServerOptions.Registered)
// serves only connections from registered hosts, and on a multi-homed host,
// or several "hosts" on one loopback, the system's choice may be another
// address. The zero Addr restores the system's choice.
func (p *Puller) SetSource(ip netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ip.IsValid() {
		p.source = &net.TCPAddr{IP: ip.AsSlice()}
	} else {
		p.source = nil
	}
}

// Stats returns the totals.
func (p *Puller) Stats() PullerStats {
	return PullerStats{Pulls: p.pulls.Load(), Failed: p.failed.Load(), Located: p.located.Load(), Pulled: p.pulled.Load(),
		Torn: p.torn.Load(), Bytes: p.bytes.Load()}
}

// Pull asks the kvd whose control listener is addr for keys of a
// namespace and reads every block it holds in its arena; got receives each
// verified value (the slice is valid during the call only). Keys the
// source does not hold, blocks rewritten during the read, and every key of
// a batch whose transfer failed are misses; an error says why the pull
// stopped (ctx's deadline bounds it all).
func (p *Puller) Pull(ctx context.Context, addr string, model, compat []byte, keys [][]byte, got func(key, value []byte)) (PullStats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pulls.Add(1)
	st, err := p.pull(ctx, addr, model, compat, keys, got)
	if err != nil {
		p.failed.Add(1)
	}
	p.located.Add(int64(st.Located))
	p.pulled.Add(int64(st.Pulled))
	p.torn.Add(int64(st.Torn))
	p.bytes.Add(st.Bytes)
	return st, err
}

func (p *Puller) pull(ctx context.Context, addr string, model, compat []byte, keys [][]byte, got func(key, value []byte)) (PullStats, error) {
	st := PullStats{Asked: len(keys)}
	if err := p.locate(ctx, addr, model, compat, keys); err != nil {
		return st, err
	}
	if len(p.resp.Entries) != len(keys) {
		return st, fmt.Errorf("%w: %d entries for %d keys", ErrProtocol, len(p.resp.Entries), len(keys))
	}
	buf := p.scratch.Bytes()
	remote := p.resp.Region
	// Batches that fit the scratch region: each block's header and
	// payload, then room for the headers read again. Blocks in nearby
	// slots (uniform KV blocks fill their slots, a page apart) are read
	// with one op that spans the few bytes between them too: a gap costs
	// less than another request and response.
	for i := 0; i < len(keys); {
		p.ops, p.blocks = p.ops[:0], p.blocks[:0]
		used := 0
		for ; i < len(keys); i++ {
			e := p.resp.Entries[i]
			if !e.Found {
				continue
			}
			need := headerBytes + int(e.Length)
			if need+headerBytes > len(buf) { // never fits: a miss
				continue
			}
			b := block{key: i, local: uint64(used), remote: e.Offset - headerBytes, n: uint64(need)}
			last := len(p.ops) - 1
			extend := false
			if last >= 0 {
				end := p.ops[last].RemoteOff + p.ops[last].Len
				if b.remote >= end && b.remote-end <= maxGap {
					b.local += b.remote - end
					extend = true
				}
			}
			if int(b.local)+need+headerBytes*(len(p.blocks)+1) > len(buf) {
				break
			}
			st.Located++
			p.blocks = append(p.blocks, b)
			if extend {
				p.ops[last].Len = b.remote + b.n - p.ops[last].RemoteOff
			} else {
				p.ops = append(p.ops, transport.Op{Kind: transport.Read, Local: p.scratch, LocalOff: b.local,
					Remote: remote, RemoteOff: b.remote, Len: b.n})
			}
			used = int(b.local + b.n)
		}
		if len(p.blocks) == 0 {
			continue
		}
		n := len(p.blocks)
		// The seqlock's second look: every header again, after the
		// payloads. An engine that runs a batch's ops in order takes them
		// in the same batch (no second round trip); any other gets them
		// as a batch of their own once the payloads have landed.
		data := len(p.ops)
		for j, b := range p.blocks {
			p.ops = append(p.ops, transport.Op{Kind: transport.Read, Local: p.scratch, LocalOff: uint64(used + j*headerBytes),
				Remote: remote, RemoteOff: b.remote, Len: headerBytes})
		}
		if p.inOrder {
			if err := transport.Transfer(ctx, p.eng, p.ops); err != nil {
				return st, fmt.Errorf("%w: read %d blocks from %s: %w", ErrUnavailable, n, remote.Peer, err)
			}
		} else {
			if err := transport.Transfer(ctx, p.eng, p.ops[:data]); err != nil {
				return st, fmt.Errorf("%w: read %d blocks from %s: %w", ErrUnavailable, n, remote.Peer, err)
			}
			if err := transport.Transfer(ctx, p.eng, p.ops[data:]); err != nil {
				return st, fmt.Errorf("%w: re-read %d headers from %s: %w", ErrUnavailable, n, remote.Peer, err)
			}
		}
		for j, b := range p.blocks {
			e := p.resp.Entries[b.key]
			before := buf[b.local : b.local+headerBytes]
			after := buf[used+j*headerBytes : used+(j+1)*headerBytes]
			v1, l1 := binary.LittleEndian.Uint32(before), binary.LittleEndian.Uint32(before[4:])
			v2 := binary.LittleEndian.Uint32(after)
			if v1 != e.Version || v2 != e.Version || v1%2 != 0 || l1 != e.Length {
				st.Torn++
				continue
			}
			value := buf[b.local+headerBytes : b.local+b.n]
			st.Pulled++
			st.Bytes += int64(len(value))
			got(keys[b.key], value)
		}
	}
	return st, nil
}

// maxGap is the most bytes between two blocks on the source that one read
// spans rather than splitting into two ops.
const maxGap = 4 << 10

// block is one located block in a batch: its key, where it lands in the
// scratch region and where it lies on the source (header included).
type block struct {
	key           int
	local, remote uint64
	n             uint64
}

// locate sends the request and reads the answer into p.resp, on the kept
// connection to addr (dialled again once if it went stale).
func (p *Puller) locate(ctx context.Context, addr string, model, compat []byte, keys [][]byte) error {
	var err error
	if p.req, err = AppendRequest(p.req[:0], &Request{Secret: p.secret, Model: model, Compat: compat, Keys: keys}); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		c, kept := p.conns[addr]
		if !kept {
			d := net.Dialer{LocalAddr: p.source}
			if c, err = d.DialContext(ctx, "tcp", addr); err != nil {
				return fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			if p.conns == nil {
				p.conns = map[string]net.Conn{}
			}
			p.conns[addr] = c
		}
		err = p.exchange(ctx, c)
		if err == nil {
			break
		}
		c.Close()
		delete(p.conns, addr)
		if !kept || attempt > 0 || ctx.Err() != nil || errors.Is(err, ErrProtocol) {
			return err
		}
	}
	switch p.resp.Status {
	case statusOK:
		return nil
	case statusDenied:
		return ErrDenied
	}
	return fmt.Errorf("%w: the source refused the request", ErrProtocol)
}

// exchange writes p.req on c and reads the response into p.resp.
func (p *Puller) exchange(ctx context.Context, c net.Conn) error {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(30 * time.Second)
	}
	_ = c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write(p.req); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return fmt.Errorf("%w: %d-byte response", ErrProtocol, n)
	}
	if cap(p.body) < int(n) {
		p.body = make([]byte, n)
	}
	p.body = p.body[:n]
	if _, err := io.ReadFull(c, p.body); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return ParseResponse(p.body, &p.resp)
}
