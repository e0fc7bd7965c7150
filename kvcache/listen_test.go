package kvcache

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/zmtp"
)

// connectingPublisher is an engine publisher that only connects: it dials
// the router's listener as a ZMTP PUB peer and writes [topic, seq, payload]
// messages once the listener has subscribed.
type connectingPublisher struct {
	nc    net.Conn
	topic []byte
}

func dialListener(t *testing.T, endpoint, topic string) *connectingPublisher {
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
	zc, err := zmtp.Handshake(context.Background(), nc, zmq4.Pub, false, 5*time.Second, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	// The listener subscribes to everything right after the handshake.
	msg, err := zc.RecvMsg()
	if err != nil || len(msg.Frames) != 1 || len(msg.Frames[0]) != 1 || msg.Frames[0][0] != 1 {
		t.Fatalf("subscription %v %v", msg, err)
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	return &connectingPublisher{nc: nc, topic: []byte(topic)}
}

func (p *connectingPublisher) publish(t *testing.T, seq uint64, payload []byte) {
	t.Helper()
	if _, err := p.nc.Write(zmtp.AppendSeqMsg(nil, p.topic, seq, payload)); err != nil {
		t.Fatal(err)
	}
}

// TestSubscriberListenerConnectingPublisher: two engines connect to one
// listener and publish under their workers' topics; each worker's blocks go
// to its own index entry, a topic of no followed worker is dropped, and a
// reconnecting engine that restarted its sequence clears its worker.
func TestSubscriberListenerConnectingPublisher(t *testing.T) {
	idx, s := newTestSubscriber(t, DefaultSubscriberConfig())
	ep, err := s.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Listen("tcp://127.0.0.1:0"); err == nil {
		t.Fatal("second Listen accepted")
	}
	e := newEngineSim(t, 8)
	ws := map[string]*Worker{}
	for _, id := range []string{"10.0.0.1:8000", "10.0.0.2:8000"} {
		w, err := s.Add(Source{Key: Key{Worker: id}, Listen: true, BlockSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		ws[id] = w
	}
	if _, err := s.Add(Source{Key: Key{Worker: "x", DPRank: 1}, Listen: true}); err == nil {
		t.Fatal("listener source with a DP rank accepted")
	}
	a := dialListener(t, ep, WorkerTopic("10.0.0.1:8000"))
	b := dialListener(t, ep, WorkerTopic("10.0.0.2:8000"))
	stray := dialListener(t, ep, WorkerTopic("10.9.9.9:8000"))
	stray.publish(t, 0, e.storeBatch(0, 8))
	a.publish(t, 0, e.storeBatch(0, 4))
	a.publish(t, 1, e.storeBatch(4, 8))
	b.publish(t, 0, e.storeBatch(0, 2))
	ka, kb := Key{Worker: "10.0.0.1:8000"}, Key{Worker: "10.0.0.2:8000"}
	testkit.Eventually(t, "both workers' batches", func() bool {
		return stats(t, s, ka).NextSeq == 2 && stats(t, s, kb).NextSeq == 1
	})
	if got := idx.Match(ws["10.0.0.1:8000"], e.routerHashes()); got != 8 {
		t.Fatalf("worker a matches %d, want 8", got)
	}
	if got := idx.Match(ws["10.0.0.2:8000"], e.routerHashes()); got != 2 {
		t.Fatalf("worker b matches %d, want 2", got)
	}
	if st := stats(t, s, ka); st.Mode != ModePrecise || !st.Connected || st.Gaps != 0 {
		t.Fatalf("worker a %+v", st)
	}
	// Engine a restarts: a new connection starting again at 0.
	a.nc.Close()
	a2 := dialListener(t, ep, WorkerTopic("10.0.0.1:8000"))
	a2.publish(t, 0, e.storeBatch(0, 1))
	testkit.Eventually(t, "restart", func() bool { return stats(t, s, ka).Blocks == 1 })
	if got := idx.Match(ws["10.0.0.1:8000"], e.routerHashes()); got != 1 {
		t.Fatalf("after restart worker a matches %d, want 1", got)
	}
}
