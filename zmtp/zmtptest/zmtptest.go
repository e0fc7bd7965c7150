package zmtptest

import (
	"context"
	"encoding/binary"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/infera/infera/zmtp"
)

// SeqBytes encodes seq as an 8-byte big-endian frame.
func SeqBytes(seq uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	return b[:]
}

// Publisher accepts subscribers, waits for each one's subscription and
// publishes [topic, seq, payload] to all of them, like vLLM's publisher.
type Publisher struct {
	topic []byte
	ln    net.Listener
	subs  chan struct{}
	mu    sync.Mutex
	conns []*zmq4.Conn
	raws  []net.Conn
	wg    sync.WaitGroup
	once  sync.Once
}

// NewPublisher listens on addr (host:port, port 0 for any) and publishes
// under topic; it closes with the test.
func NewPublisher(t testing.TB, addr, topic string) *Publisher {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &Publisher{topic: []byte(topic), ln: ln, subs: make(chan struct{}, 16)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Endpoint is the tcp:// endpoint to subscribe to.
func (p *Publisher) Endpoint() string { return "tcp://" + p.ln.Addr().String() }

func (p *Publisher) accept() {
	defer p.wg.Done()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			return
		}
		zc, err := zmq4.Open(nc, null.Security(), zmq4.Pub, nil, true, nil)
		if err != nil {
			nc.Close()
			continue
		}
		// Wait for the subscription message (0x01 + prefix).
		msg, err := zc.RecvMsg()
		if err != nil || len(msg.Frames) != 1 || len(msg.Frames[0]) == 0 || msg.Frames[0][0] != 1 {
			nc.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, zc)
		p.raws = append(p.raws, nc)
		p.mu.Unlock()
		p.subs <- struct{}{}
	}
}

// WaitSubscriber waits for the next subscriber to have subscribed.
func (p *Publisher) WaitSubscriber(t testing.TB) {
	t.Helper()
	select {
	case <-p.subs:
	case <-time.After(15 * time.Second):
		t.Fatal("no subscriber connected")
	}
}

// Publish sends [topic, seq, payload] to every subscriber.
func (p *Publisher) Publish(seq uint64, payload []byte) {
	p.PublishFrames(p.topic, SeqBytes(seq), payload)
}

// PublishFrames sends one message of frames to every subscriber; errors
// are dropped, as PUB sockets do.
func (p *Publisher) PublishFrames(frames ...[]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.SendMsg(zmq4.NewMsgFrom(frames...))
	}
}

// DropSubscribers closes every subscriber connection (the listener stays).
func (p *Publisher) DropSubscribers() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, nc := range p.raws {
		nc.Close()
	}
	p.conns, p.raws = nil, nil
}

// Close stops the listener and every connection and waits for the accept
// loop; it is idempotent.
func (p *Publisher) Close() {
	p.once.Do(func() {
		p.ln.Close()
		p.DropSubscribers()
		p.wg.Wait()
	})
}

// Replay is a vLLM-style replay server: it answers [identity, "", start]
// with every buffered batch whose seq >= start, then the terminator.
type Replay struct {
	sock     zmq4.Socket
	mu       sync.Mutex
	buf      map[uint64][]byte
	requests []uint64
	topic    []byte // SetFraming: a topic frame before each seq
	end      []byte // SetFraming: the terminator's payload
	wg       sync.WaitGroup
}

// SetFraming makes the answers carry a topic frame before the sequence
// ([identity, "", topic, seq, payload]) when topic is not nil, and the
// terminator carry endPayload instead of an empty frame: quirks of
// publishers that reuse their live framing for replies.
func (r *Replay) SetFraming(topic, endPayload []byte) {
	r.mu.Lock()
	r.topic, r.end = topic, endPayload
	r.mu.Unlock()
}

// NewReplay listens on a free loopback port; it closes with the test.
func NewReplay(t testing.TB) *Replay {
	t.Helper()
	r := &Replay{sock: zmq4.NewRouter(context.Background()), buf: make(map[uint64][]byte)}
	if err := r.sock.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	r.wg.Add(1)
	go r.serve()
	t.Cleanup(func() {
		r.sock.Close()
		r.wg.Wait()
	})
	return r
}

// Endpoint is the tcp:// endpoint to send replay requests to.
func (r *Replay) Endpoint() string { return "tcp://" + r.sock.Addr().String() }

// Add buffers a batch.
func (r *Replay) Add(seq uint64, payload []byte) {
	r.mu.Lock()
	r.buf[seq] = payload
	r.mu.Unlock()
}

// Starts returns the start sequences of the requests received so far.
func (r *Replay) Starts() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.requests)
}

func (r *Replay) serve() {
	defer r.wg.Done()
	for {
		msg, err := r.sock.Recv()
		if err != nil {
			return
		}
		// [identity, "", start_seq]: anything else is ignored, as vLLM does.
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, start := msg.Frames[0], zmtp.Seq(msg.Frames[2])
		r.mu.Lock()
		r.requests = append(r.requests, start)
		var seqs []uint64
		for s := range r.buf {
			if s >= start {
				seqs = append(seqs, s)
			}
		}
		slices.Sort(seqs)
		out := make([][]byte, len(seqs))
		for i, s := range seqs {
			out[i] = r.buf[s]
		}
		topic, end := r.topic, r.end
		r.mu.Unlock()
		frames := func(seq uint64, payload []byte) zmq4.Msg {
			if topic != nil {
				return zmq4.NewMsgFrom(id, []byte{}, topic, SeqBytes(seq), payload)
			}
			return zmq4.NewMsgFrom(id, []byte{}, SeqBytes(seq), payload)
		}
		for i, s := range seqs {
			_ = r.sock.Send(frames(s, out[i]))
		}
		if end == nil {
			end = []byte{}
		}
		_ = r.sock.Send(frames(zmtp.ReplayEnd, end))
	}
}

// Dial connects a client socket of type typ to endpoint with zmq4's raw
// handshake (no Infera limits, as a third-party peer would) and a 10 s
// deadline on the whole conversation; the connection closes with the test.
func Dial(t testing.TB, endpoint string, typ zmq4.SocketType) *zmq4.Conn {
	t.Helper()
	addr, err := zmtp.DialAddr(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if err := nc.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	zc, err := zmq4.Open(nc, null.Security(), typ, nil, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return zc
}

// RequestReplay asks a replay socket for every batch from start and
// returns the sequences and payloads answered before the terminator,
// failing the test on a malformed reply.
func RequestReplay(t testing.TB, endpoint string, start uint64) ([]uint64, [][]byte) {
	t.Helper()
	zc := Dial(t, endpoint, zmq4.Dealer)
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, SeqBytes(start))); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	var payloads [][]byte
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[0]) != 0 || len(msg.Frames[1]) != 8 {
			t.Fatalf("replay reply %q", msg.Frames)
		}
		seq := zmtp.Seq(msg.Frames[1])
		if seq == zmtp.ReplayEnd {
			if len(msg.Frames[2]) != 0 {
				t.Error("replay end marker with a payload")
			}
			return seqs, payloads
		}
		seqs = append(seqs, seq)
		payloads = append(payloads, msg.Frames[2])
	}
}
