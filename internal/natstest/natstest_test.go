package natstest_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/infera/infera/internal/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestServer: JetStream answers; a paused server stops answering and
// answers again once resumed; a restart keeps the file store.
func TestServer(t *testing.T) {
	s := natstest.Start(t)
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("x")); err != nil {
		t.Fatal(err)
	}

	s.Pause()
	if err := nc.FlushTimeout(300 * time.Millisecond); err == nil {
		t.Fatal("a paused server answered a flush")
	}
	s.Resume()
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatalf("resumed server: %v", err)
	}

	s.Restart()
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, err := js.Stream(ctx, "T")
		if err == nil {
			info, err := st.Info(ctx)
			if err == nil && info.State.Msgs == 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream T after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
