package sim

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"

	"github.com/infera/infera/zmtp"
)

// The KV-event sockets speak ZMTP 3.0 through go-zeromq/zmq4's handshake
// (zmq4.Open on a net.Conn we accepted) and frame messages themselves. zmq4's
// Socket types are not used: its PUB socket leaves a writer goroutine running
// after Close, and its sockets queue without bound. Here a PUB connection is
// a reader and a writer goroutine over the shared event ring, and a replay
// (ROUTER) connection one goroutine; all of them end when Close closes the
// listeners and connections.

// KV-event socket errors.
var (
	ErrKVEndpoint = zmtp.ErrBadEndpoint
	ErrZMTP       = zmtp.ErrProtocol
)

const (
	// maxInboundFrame bounds what a subscriber or replay client may send
	// (subscriptions, replay requests, commands); anything larger is not a
	// conversation these sockets have, and the connection is dropped.
	maxInboundFrame = 64 << 10
	// maxInboundFrames bounds the parts of one inbound message.
	maxInboundFrames = 8
	// maxSubscriptions bounds one connection's subscription prefixes.
	maxSubscriptions = 1024
	// maxEventConns bounds concurrent connections per socket.
	maxEventConns = 256
	// handshakeTimeout bounds the ZMTP greeting and READY exchange.
	handshakeTimeout = 5 * time.Second
	// writeTimeout drops a peer that stops reading for this long.
	writeTimeout = 30 * time.Second
	// maxWriteChunk bounds the bytes one connection copies out of the ring
	// per lock, so a subscriber catching up does not hold the ring.
	maxWriteChunk = 1 << 20
)

// replayEnd is the terminating sequence of a replay answer: vLLM sends -1 as
// a signed 8-byte integer.
const replayEnd = zmtp.ReplayEnd

// ringSlot is one buffered batch.
type ringSlot struct {
	seq     uint64
	payload []byte
	dropped bool      // buffered for replay but never published (tests)
	at      time.Time // when pushed (for --kv-events-delay)
}

// eventRing numbers batches and keeps the last len(slots) of them, within
// maxRingBytes. It is the replay buffer and, through per-connection cursors,
// every subscriber's send queue: a subscriber that falls behind the ring's
// tail skips ahead (ZMQ's high-water-mark drop) and recovers the gap through
// replay if it still can.
type eventRing struct {
	mu     sync.Mutex
	cond   sync.Cond
	slots  []ringSlot
	head   uint64 // next sequence number
	tail   uint64 // oldest sequence number held
	bytes  int    // buffer capacity held by all slots
	max    int    // byte budget (maxRingBytes; tests lower it)
	closed bool
}

// maxRingBytes bounds the memory of buffered batches: a zero-latency run
// drains thousands of requests into large batches, and --kv-events-buffer
// of them must not grow into gigabytes.
const maxRingBytes = 256 << 20

func newEventRing(n int) *eventRing {
	r := &eventRing{slots: make([]ringSlot, n), max: maxRingBytes}
	r.cond.L = &r.mu
	return r
}

// push appends a batch (copied) under the next sequence number and wakes the
// connections. A batch is replayable from the moment it can be published.
func (r *eventRing) push(payload []byte, dropped bool) {
	r.mu.Lock()
	if r.head-r.tail == uint64(len(r.slots)) {
		r.tail++ // the oldest batch's slot is the one reused below
	}
	s := r.slotLocked(r.head)
	r.bytes -= cap(s.payload)
	if cap(s.payload) > 64<<10 && cap(s.payload) > 4*len(payload) {
		s.payload = nil // do not pin a huge batch's buffer for a small one
	}
	// Over the byte budget, the oldest batches leave the replay window and
	// free their buffers.
	for r.bytes+max(cap(s.payload), len(payload)) > r.max && r.tail < r.head {
		old := r.slotLocked(r.tail)
		r.bytes -= cap(old.payload)
		old.payload = nil
		r.tail++
	}
	s.payload = append(s.payload[:0], payload...)
	s.seq, s.dropped, s.at = r.head, dropped, time.Now()
	r.bytes += cap(s.payload)
	r.head++
	r.mu.Unlock()
	r.cond.Broadcast()
}

// tailLocked is the oldest sequence number still buffered.
func (r *eventRing) tailLocked() uint64 { return r.tail }

func (r *eventRing) slotLocked(seq uint64) *ringSlot {
	return &r.slots[seq%uint64(len(r.slots))]
}

func (r *eventRing) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cond.Broadcast()
}

// handshake runs the ZMTP 3.0 greeting and NULL-security READY exchange as a
// server socket of type typ, within handshakeTimeout and with handshake
// frames bounded by maxInboundFrame. Afterwards zmtp.Reader applies the
// same bound to what the peer sends.
func handshake(nc net.Conn, typ zmq4.SocketType) error {
	_, err := zmtp.Handshake(context.Background(), nc, typ, true, handshakeTimeout, maxInboundFrame)
	return err
}

// eventOpts configures the event sockets (config.Sim's KVEvents fields).
type eventOpts struct {
	endpoint, replay, topic string
	// connect: dial endpoint (a central SUB listener) instead of binding it.
	connect bool
	// delay: publish each batch this long after it was pushed.
	delay time.Duration
}

// eventSockets owns the PUB and replay listeners and their connections.
type eventSockets struct {
	ring  *eventRing
	topic []byte
	log   zerolog.Logger
	delay time.Duration
	quit  chan struct{} // closed by close

	pubLn, replayLn     net.Listener // pubLn nil in connect mode
	pubAddr, replayAddr string       // bound endpoints (connect mode: the dialed one)

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	subs  int // PUB connections with a matching subscription
	done  bool
	wg    sync.WaitGroup
}

// startEventSockets binds the configured endpoints and starts accepting.
// replayEndpoint may be empty.
func startEventSockets(ctx context.Context, ring *eventRing, o eventOpts, log zerolog.Logger) (*eventSockets, error) {
	es := &eventSockets{ring: ring, topic: []byte(o.topic), log: log, delay: o.delay, quit: make(chan struct{}),
		conns: make(map[net.Conn]struct{})}
	var err error
	if o.connect {
		if _, err := zmtp.DialAddr(o.endpoint); err != nil {
			return nil, err
		}
		es.pubAddr = o.endpoint
	} else {
		if es.pubLn, err = zmtp.Listen(ctx, o.endpoint); err != nil {
			return nil, err
		}
		es.pubAddr = zmtp.BoundEndpoint(o.endpoint, es.pubLn)
	}
	if o.replay != "" {
		if es.replayLn, err = zmtp.Listen(ctx, o.replay); err != nil {
			if es.pubLn != nil {
				es.pubLn.Close()
			}
			return nil, err
		}
		es.replayAddr = zmtp.BoundEndpoint(o.replay, es.replayLn)
	}
	if o.connect {
		es.wg.Go(func() { es.connectLoop(o.endpoint) })
	} else {
		es.wg.Go(func() { es.accept(es.pubLn, es.servePub) })
	}
	if es.replayLn != nil {
		es.wg.Go(func() { es.accept(es.replayLn, es.serveReplay) })
	}
	return es, nil
}

// connectLoop is the connect-only publisher: it dials the subscriber's
// listener, serves that connection as a PUB peer until it fails, and dials
// again with backoff, until close.
func (es *eventSockets) connectLoop(endpoint string) {
	addr, _ := zmtp.DialAddr(endpoint)
	var delay time.Duration
	for {
		d := net.Dialer{Timeout: handshakeTimeout}
		nc, err := d.Dial("tcp", addr)
		if err == nil {
			es.mu.Lock()
			if es.done {
				es.mu.Unlock()
				nc.Close()
				return
			}
			es.conns[nc] = struct{}{}
			es.mu.Unlock()
			delay = 0
			if _, err = zmtp.Handshake(context.Background(), nc, zmq4.Pub, false, handshakeTimeout, maxInboundFrame); err == nil {
				es.servePubConn(nc)
			}
			es.forget(nc)
		}
		if err != nil {
			es.log.Debug().Err(err).Str("endpoint", endpoint).Msg("kv events connect failed")
		}
		delay = min(max(2*delay, 50*time.Millisecond), time.Second)
		select {
		case <-es.quit:
			return
		case <-time.After(delay):
		}
	}
}

// endpoint and replayEndpoint return the bound addresses ("" when none).
func (es *eventSockets) endpoint() string { return es.pubAddr }

func (es *eventSockets) replayEndpoint() string { return es.replayAddr }

// subscribers is how many PUB connections currently receive batches.
func (es *eventSockets) subscribers() int {
	es.ring.mu.Lock()
	defer es.ring.mu.Unlock()
	return es.subs
}

// close stops accepting, closes every connection and waits for every
// goroutine.
func (es *eventSockets) close() {
	close(es.quit)
	if es.pubLn != nil {
		es.pubLn.Close()
	}
	if es.replayLn != nil {
		es.replayLn.Close()
	}
	es.mu.Lock()
	es.done = true
	for nc := range es.conns {
		nc.Close()
	}
	es.mu.Unlock()
	es.ring.close()
	es.wg.Wait()
}

func (es *eventSockets) accept(ln net.Listener, serve func(net.Conn)) {
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off and keep
			// serving, as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), 100*time.Millisecond)
			es.log.Warn().Err(err).Dur("retry_in", delay).Msg("kv events accept failed")
			time.Sleep(delay)
			continue
		}
		delay = 0
		es.mu.Lock()
		if es.done || len(es.conns) >= maxEventConns {
			es.mu.Unlock()
			nc.Close()
			continue
		}
		es.conns[nc] = struct{}{}
		es.mu.Unlock()
		es.wg.Go(func() {
			defer es.forget(nc)
			serve(nc)
		})
	}
}

func (es *eventSockets) forget(nc net.Conn) {
	nc.Close()
	es.mu.Lock()
	delete(es.conns, nc)
	es.mu.Unlock()
}

// pubConn is one subscriber. The fields below wmu are guarded by the ring's
// mutex.
type pubConn struct {
	nc  net.Conn
	wmu sync.Mutex // one writer of whole messages at a time (batches, PONG)

	subs       map[string]int // subscription prefix → count, as ZMQ counts them
	subscribed bool           // some prefix matches the topic
	cursor     uint64         // next sequence number to send
	gone       bool
}

func (pc *pubConn) write(b []byte) error {
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	if err := pc.nc.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return err
	}
	_, err := pc.nc.Write(b)
	return err
}

// servePub runs one subscriber: this goroutine reads its subscriptions and
// commands, a second one sends it batches.
func (es *eventSockets) servePub(nc net.Conn) {
	if err := handshake(nc, zmq4.Pub); err != nil {
		es.log.Debug().Err(err).Str("peer", nc.RemoteAddr().String()).Msg("kv events subscriber rejected")
		return
	}
	es.servePubConn(nc)
}

// servePubConn serves one subscriber after the handshake, whichever side
// dialed.
func (es *eventSockets) servePubConn(nc net.Conn) {
	pc := &pubConn{nc: nc, subs: make(map[string]int)}
	var wg sync.WaitGroup
	wg.Go(func() { es.sendBatches(pc) })
	err := es.readSubscriptions(pc)
	r := es.ring
	r.mu.Lock()
	if pc.subscribed {
		es.subs--
	}
	pc.gone, pc.subscribed = true, false
	r.mu.Unlock()
	r.cond.Broadcast()
	nc.Close() // unblocks a pending write
	wg.Wait()
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		es.log.Debug().Err(err).Str("peer", nc.RemoteAddr().String()).Msg("kv events subscriber dropped")
	}
}

// readSubscriptions applies subscribe (0x01 prefix) and cancel (0x00 prefix)
// messages, and ZMTP 3.1 SUBSCRIBE/CANCEL commands, until the connection
// fails; it returns why.
func (es *eventSockets) readSubscriptions(pc *pubConn) error {
	zr := zmtp.Reader{R: bufio.NewReaderSize(pc.nc, 4096), MaxFrame: maxInboundFrame, MaxFrames: maxInboundFrames}
	var frames [][]byte
	var scratch []byte
	for {
		var cmd bool
		var err error
		frames, scratch, cmd, err = zr.ReadMsg(frames, scratch)
		if err != nil {
			return err
		}
		if len(frames) != 1 {
			continue // multipart messages mean nothing to a PUB socket
		}
		f := frames[0]
		var sub bool
		var prefix []byte
		switch {
		case cmd:
			if pong := zmtp.PongFor(f); pong != nil {
				if err := pc.write(pong); err != nil {
					return err
				}
				continue
			}
			switch {
			case len(f) >= 10 && string(f[:10]) == "\x09SUBSCRIBE":
				sub, prefix = true, f[10:]
			case len(f) >= 7 && string(f[:7]) == "\x06CANCEL":
				prefix = f[7:]
			default:
				continue
			}
		case len(f) >= 1 && f[0] <= 1:
			sub, prefix = f[0] == 1, f[1:]
		default:
			continue
		}
		es.subscribe(pc, string(prefix), sub)
	}
}

func (es *eventSockets) subscribe(pc *pubConn, prefix string, sub bool) {
	r := es.ring
	r.mu.Lock()
	if sub {
		if _, ok := pc.subs[prefix]; ok || len(pc.subs) < maxSubscriptions {
			pc.subs[prefix]++
		}
	} else if n := pc.subs[prefix]; n > 1 {
		pc.subs[prefix] = n - 1
	} else {
		delete(pc.subs, prefix)
	}
	was := pc.subscribed
	pc.subscribed = false
	for p := range pc.subs {
		if strings.HasPrefix(string(es.topic), p) {
			pc.subscribed = true
			break
		}
	}
	switch {
	case pc.subscribed && !was:
		// Like a ZMQ PUB, deliver only what is published after the
		// subscription took effect.
		pc.cursor = r.head
		es.subs++
	case !pc.subscribed && was:
		es.subs--
	}
	r.mu.Unlock()
	r.cond.Broadcast()
}

// sendBatches writes batches to one subscriber as the ring fills.
func (es *eventSockets) sendBatches(pc *pubConn) {
	r := es.ring
	var out []byte
	for {
		r.mu.Lock()
		for !r.closed && !pc.gone && (!pc.subscribed || pc.cursor == r.head) {
			r.cond.Wait()
		}
		if r.closed || pc.gone {
			r.mu.Unlock()
			return
		}
		if t := r.tailLocked(); pc.cursor < t {
			pc.cursor = t // fell a whole ring behind: these are lost to it
		}
		out = out[:0]
		var wait time.Duration
		for pc.cursor < r.head && len(out) < maxWriteChunk {
			s := r.slotLocked(pc.cursor)
			if es.delay > 0 {
				if wait = time.Until(s.at.Add(es.delay)); wait > 0 {
					break
				}
			}
			if !s.dropped {
				out = zmtp.AppendSeqMsg(out, es.topic, s.seq, s.payload)
			}
			pc.cursor++
		}
		r.mu.Unlock()
		if len(out) > 0 {
			if err := pc.write(out); err != nil {
				pc.nc.Close() // the reader sees it and ends the connection
				return
			}
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-es.quit:
				t.Stop()
				return
			case <-t.C:
			}
		}
		if cap(out) > 4*maxWriteChunk {
			out = nil
		}
	}
}

// serveReplay answers replay requests on one connection (vLLM's replay
// socket protocol, kvcache/doc.go): request [b"", start seq (8-byte BE)];
// answer [b"", seq, payload] per buffered batch with seq >= start, in
// order, then [b"", 0xFF×8, b""]. A request for a sequence older than the
// buffer gets what the buffer still holds, so the client sees that the
// first batch is later than it asked for.
func (es *eventSockets) serveReplay(nc net.Conn) {
	if err := handshake(nc, zmq4.Router); err != nil {
		es.log.Debug().Err(err).Str("peer", nc.RemoteAddr().String()).Msg("kv events replay client rejected")
		return
	}
	zr := zmtp.Reader{R: bufio.NewReaderSize(nc, 512), MaxFrame: maxInboundFrame, MaxFrames: maxInboundFrames}
	var frames [][]byte
	var scratch, out []byte
	for {
		var cmd bool
		var err error
		frames, scratch, cmd, err = zr.ReadMsg(frames, scratch)
		if err != nil {
			return
		}
		if cmd {
			if pong := zmtp.PongFor(frames[0]); pong != nil {
				if _, err := nc.Write(pong); err != nil {
					return
				}
			}
			continue
		}
		var start []byte
		switch {
		case len(frames) == 2 && len(frames[0]) == 0 && len(frames[1]) == 8:
			start = frames[1]
		case len(frames) == 1 && len(frames[0]) == 8:
			start = frames[0] // a client that skipped the delimiter
		default:
			continue // malformed requests are ignored, as vLLM does
		}
		if out, err = es.replay(nc, binary.BigEndian.Uint64(start), out); err != nil {
			return
		}
	}
}

// replay streams buffered batches from seq onwards, then the terminator.
func (es *eventSockets) replay(nc net.Conn, seq uint64, out []byte) ([]byte, error) {
	r := es.ring
	for {
		out = out[:0]
		r.mu.Lock()
		if t := r.tailLocked(); seq < t {
			seq = t
		}
		// Batches pushed while we stream are included: the answer ends
		// at whatever head is when the buffer has been drained.
		for seq < r.head && len(out) < maxWriteChunk {
			s := r.slotLocked(seq)
			out = zmtp.AppendSeqMsg(out, nil, s.seq, s.payload)
			seq++
		}
		end := seq == r.head
		r.mu.Unlock()
		if end {
			out = zmtp.AppendSeqMsg(out, nil, replayEnd, nil)
		}
		if err := nc.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
			return out, err
		}
		if _, err := nc.Write(out); err != nil {
			return out, err
		}
		if end {
			if cap(out) > 4*maxWriteChunk {
				out = nil
			}
			return out, nil
		}
	}
}
