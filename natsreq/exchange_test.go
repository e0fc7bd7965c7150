package natsreq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/natstest"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/natsreq"
	"github.com/infera/infera/sim"
)

// startSim runs the simulated engine in-process; it returns its base URL.
func startSim(t *testing.T, tweak func(*config.Sim)) string {
	t.Helper()
	cfg := config.DefaultSim()
	cfg.Port = 0
	cfg.Model = "sim-model"
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := sim.New(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + servetest.Loopback(t, "sim", s.Serve)
}

func connect(t *testing.T, s *natstest.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

type pair struct {
	srv *natsreq.Server
	cli *natsreq.Client
	nc  *nats.Conn
}

const workerID = "127.0.0.1:18000"

// start runs a worker-side server in front of engine and a client, each on
// its own connection, as worker and router have.
func start(t *testing.T, ns *natstest.Server, engine string, scfg natsreq.ServerConfig, ccfg natsreq.ClientConfig) *pair {
	t.Helper()
	scfg.WorkerID, scfg.EngineURL = workerID, engine
	srv, err := natsreq.NewServer(scfg, connect(t, ns), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			srv.Stop(0)
		}
	})
	nc := connect(t, ns)
	ccfg.CancelGap = 50 * time.Millisecond
	cli, err := natsreq.NewClient(t.Context(), ccfg, nc, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cli.Close)
	return &pair{srv: srv, cli: cli, nc: nc}
}

func chat(stream bool, maxTokens int) *natsreq.Envelope {
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "stream": stream, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": "hello over nats"}}})
	return &natsreq.Envelope{Path: "/v1/chat/completions", Stream: stream, Body: body}
}

// readAll reads frames until done or an error.
func readAll(t *testing.T, x *natsreq.Exchange) ([]byte, int, error) {
	t.Helper()
	var out bytes.Buffer
	for {
		f, err := x.Next()
		if err != nil {
			return out.Bytes(), 0, err
		}
		if f.Type == natsreq.TypeDone {
			return out.Bytes(), f.Status, nil
		}
		out.Write(f.Data)
	}
}

func TestExchange(t *testing.T) {
	for _, pending := range []int{0, 4} {
		name := "core"
		if pending > 0 {
			name = "jetstream"
		}
		t.Run(name, func(t *testing.T) {
			ns := natstest.Start(t)
			p := start(t, ns, startSim(t, nil), natsreq.ServerConfig{MaxPending: pending, IdleTimeout: 10 * time.Second},
				natsreq.ClientConfig{MaxPending: pending, IdleTimeout: 10 * time.Second})
			// Unary: one data frame (the JSON answer), then done 200.
			x, err := p.cli.Exchange(t.Context(), workerID, chat(false, 8))
			if err != nil {
				t.Fatal(err)
			}
			body, status, err := readAll(t, x)
			x.Close()
			var resp struct {
				Choices []json.RawMessage `json:"choices"`
			}
			if err != nil || status != 200 || json.Unmarshal(body, &resp) != nil || len(resp.Choices) != 1 {
				t.Fatalf("unary: %d %v %s", status, err, body)
			}
			// Streaming: SSE chunks, then done 200.
			x, err = p.cli.Exchange(t.Context(), workerID, chat(true, 8))
			if err != nil {
				t.Fatal(err)
			}
			body, status, err = readAll(t, x)
			x.Close()
			if err != nil || status != 200 || !strings.HasPrefix(string(body), "data: ") || !strings.HasSuffix(strings.TrimSpace(string(body)), "data: [DONE]") {
				t.Fatalf("stream: %d %v %s", status, err, body)
			}
			// A non-2xx answer: its data, then done with its status.
			bad := chat(false, 8)
			bad.Body = json.RawMessage(`{"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}`)
			x, err = p.cli.Exchange(t.Context(), workerID, bad)
			if err != nil {
				t.Fatal(err)
			}
			body, status, err = readAll(t, x)
			x.Close()
			if err != nil || status != http.StatusNotFound || !bytes.Contains(body, []byte("error")) {
				t.Fatalf("unknown model: %d %v %s", status, err, body)
			}
			if pending > 0 {
				testkit.Eventually(t, "backlog empty", func() bool { return p.cli.Admit(workerID) })
			}
		})
	}
}

// TestExchangeCancel: a client that leaves mid-stream cancels the engine's
// request on the worker (its inbox on the cancel subject).
func TestExchangeCancel(t *testing.T) {
	ns := natstest.Start(t)
	p := start(t, ns, startSim(t, func(c *config.Sim) { c.DecodeMsPerToken = 20; c.TimeScale = 1 }),
		natsreq.ServerConfig{}, natsreq.ClientConfig{})
	cancels, err := p.nc.SubscribeSync(natsreq.CancelSubject(workerID))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	x, err := p.cli.Exchange(ctx, workerID, chat(true, 2000))
	if err != nil {
		t.Fatal(err)
	}
	if f, err := x.Next(); err != nil || f.Type != natsreq.TypeData {
		t.Fatalf("first frame %+v %v", f, err)
	}
	if p.srv.InFlight() != 1 {
		t.Fatalf("in flight %d", p.srv.InFlight())
	}
	cancel()
	if _, err := x.Next(); !errors.Is(err, context.Canceled) {
		t.Fatalf("after cancel: %v", err)
	}
	x.Close()
	testkit.Eventually(t, "the worker cancelled the engine request", func() bool { return p.srv.InFlight() == 0 })
	for i := range natsreq.CancelResends {
		m, err := cancels.NextMsg(5 * time.Second)
		if err != nil || string(m.Data) != x.Inbox() {
			t.Fatalf("cancel %d: %v %q", i, err, m.Data)
		}
	}
}

// TestExchangeIdleTimeout: an engine that sends nothing trips the idle
// deadline (ErrIdleTimeout, a 504) and the worker drops the request.
func TestExchangeIdleTimeout(t *testing.T) {
	ns := natstest.Start(t)
	p := start(t, ns, startSim(t, func(c *config.Sim) { c.HangBeforeFirstToken = 1 }),
		natsreq.ServerConfig{}, natsreq.ClientConfig{IdleTimeout: 300 * time.Millisecond})
	x, err := p.cli.Exchange(t.Context(), workerID, chat(true, 8))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Next(); !errors.Is(err, natsreq.ErrIdleTimeout) {
		t.Fatalf("hung engine: %v", err)
	}
	x.Close()
	testkit.Eventually(t, "the worker dropped the hung request", func() bool { return p.srv.InFlight() == 0 })
}

// TestAdmissionAndDrain: with --nats-req-max-pending 1, a worker with one
// request in flight is refused; on drain its migratable request is handed
// back (DrainingNotice) and its durable consumer deleted.
func TestAdmissionAndDrain(t *testing.T) {
	ns := natstest.Start(t)
	p := start(t, ns, startSim(t, func(c *config.Sim) { c.DecodeMsPerToken = 20; c.TimeScale = 1 }),
		natsreq.ServerConfig{MaxPending: 1}, natsreq.ClientConfig{MaxPending: 1})
	if !p.cli.Admit(workerID) {
		t.Fatal("idle worker refused")
	}
	env := chat(true, 2000)
	env.Migratable = true
	x, err := p.cli.Exchange(t.Context(), workerID, env)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if f, err := x.Next(); err != nil || f.Type != natsreq.TypeData {
		t.Fatalf("first frame %+v %v", f, err)
	}
	testkit.Eventually(t, "backlog at the limit refuses", func() bool { return !p.cli.Admit(workerID) })

	p.srv.Stop(200 * time.Millisecond)
	for {
		f, err := x.Next()
		if errors.Is(err, natsreq.ErrDraining) {
			break
		}
		if err != nil || f.Type != natsreq.TypeData {
			t.Fatalf("during drain: %+v %v", f, err)
		}
	}
	js, err := jetstream.New(p.nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Consumer(t.Context(), natsreq.StreamName, natsreq.Durable(workerID)); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("durable consumer after drain: %v", err)
	}
}

// TestExchangeNextBefore: the caller's wake-up returns ErrNoFrameYet and
// leaves the exchange going (its frames still arrive); the idle deadline
// runs from the last frame, not from each wait.
func TestExchangeNextBefore(t *testing.T) {
	ns := natstest.Start(t)
	p := start(t, ns, startSim(t, func(c *config.Sim) { c.HangBeforeFirstToken = 1 }),
		natsreq.ServerConfig{}, natsreq.ClientConfig{IdleTimeout: 600 * time.Millisecond})
	x, err := p.cli.Exchange(t.Context(), workerID, chat(true, 8))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	t0 := time.Now()
	woke := 0
	for {
		_, err := x.NextBefore(time.After(50 * time.Millisecond))
		if errors.Is(err, natsreq.ErrNoFrameYet) {
			woke++
			continue
		}
		if !errors.Is(err, natsreq.ErrIdleTimeout) || woke < 3 || time.Since(t0) < 550*time.Millisecond {
			t.Fatalf("after %d wake-ups and %v: %v", woke, time.Since(t0), err)
		}
		break
	}

	q := start(t, natstest.Start(t), startSim(t, nil), natsreq.ServerConfig{}, natsreq.ClientConfig{})
	x, err = q.cli.Exchange(t.Context(), workerID, chat(true, 8))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	var out []byte
	for {
		f, err := x.NextBefore(time.After(time.Millisecond))
		if errors.Is(err, natsreq.ErrNoFrameYet) {
			continue
		}
		if err != nil {
			t.Fatalf("frame: %v", err)
		}
		if f.Type == natsreq.TypeDone {
			break
		}
		out = append(out, f.Data...)
	}
	if !strings.HasSuffix(strings.TrimSpace(string(out)), "data: [DONE]") {
		t.Fatalf("stream through wake-ups: %q", out)
	}
}

// TestAdmitNeverWaits: Admit answers from the cached backlog and reads it
// again in the background, so that a NATS server that hangs (SIGSTOP)
// never holds a pick: while it is stopped every Admit returns at once,
// the last backlog read refuses until it is too old, then the unknown
// backlog admits; once the server resumes the backlog is read again, and
// Close stops a read still waiting on a stopped server.
func TestAdmitNeverWaits(t *testing.T) {
	ns := natstest.Start(t)
	p := start(t, ns, startSim(t, func(c *config.Sim) { c.HangBeforeFirstToken = 1 }),
		natsreq.ServerConfig{MaxPending: 1}, natsreq.ClientConfig{MaxPending: 1})
	if !p.cli.Admit(workerID) {
		t.Fatal("a worker whose backlog was never read refused")
	}
	x, err := p.cli.Exchange(t.Context(), workerID, chat(true, 8))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	testkit.Eventually(t, "the request on the worker", func() bool { return p.srv.InFlight() == 1 })
	testkit.Eventually(t, "backlog at the limit refuses", func() bool { return !p.cli.Admit(workerID) })

	ns.Pause()
	// The slowest Admit while the server is stopped: a read that waited on
	// it would take its whole timeout (1 s) at least every 200 ms.
	var slowest time.Duration
	admitted := false
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && !admitted; time.Sleep(20 * time.Millisecond) {
		start := time.Now()
		admitted = p.cli.Admit(workerID)
		slowest = max(slowest, time.Since(start))
	}
	if !admitted {
		t.Fatal("a backlog read before the outage still refuses 20 s into it")
	}
	if slowest >= 500*time.Millisecond {
		t.Fatalf("an Admit took %v during the outage: it waited on NATS", slowest)
	}
	ns.Resume()
	testkit.Eventually(t, "the backlog read again after the outage", func() bool { return !p.cli.Admit(workerID) })

	// Close with a read in flight on a stopped server returns at once.
	ns.Pause()
	defer ns.Resume()
	time.Sleep(250 * time.Millisecond) // past the cache TTL
	p.cli.Admit(workerID)              // starts a read that hangs
	start := time.Now()
	p.cli.Close()
	if d := time.Since(start); d >= 700*time.Millisecond {
		t.Fatalf("Close took %v with a backlog read in flight", d)
	}
}

// TestExchangeNoResponders: on core NATS a request for a worker nobody
// serves (gone, or draining and unsubscribed) fails at once with
// ErrNoResponders, an ErrTransport, instead of waiting for the idle
// timeout.
func TestExchangeNoResponders(t *testing.T) {
	ns := natstest.Start(t)
	cli, err := natsreq.NewClient(t.Context(), natsreq.ClientConfig{IdleTimeout: 10 * time.Second}, connect(t, ns), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	x, err := cli.Exchange(t.Context(), "127.0.0.1:1", chat(false, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if _, err := x.Next(); !errors.Is(err, natsreq.ErrNoResponders) || !errors.Is(err, natsreq.ErrTransport) {
		t.Fatalf("next: %v, want ErrNoResponders", err)
	}
}

// TestDrainRefusesLateRequests: a request a router queues for a draining
// worker after its consumer stopped taking them is answered at the end of
// the drain (the drain notice for a migratable one, "request cancelled"
// for the rest), so that the router retries it elsewhere at once instead
// of waiting for its idle timeout; the queue is left empty.
func TestDrainRefusesLateRequests(t *testing.T) {
	ns := natstest.Start(t)
	p := start(t, ns, startSim(t, func(c *config.Sim) { c.DecodeMsPerToken = 20; c.TimeScale = 1 }),
		natsreq.ServerConfig{MaxPending: 8}, natsreq.ClientConfig{MaxPending: 8, IdleTimeout: time.Minute})
	running := chat(true, 2000)
	running.Migratable = true
	x, err := p.cli.Exchange(t.Context(), workerID, running)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if f, err := x.Next(); err != nil || f.Type != natsreq.TypeData {
		t.Fatalf("first frame %+v %v", f, err)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		p.srv.Stop(1500 * time.Millisecond)
	}()
	// After the drain's first look at the queue (one poll) the consumer
	// stops; these arrive after it. (Should a loaded machine deliver them
	// before, they run into the drain deadline and end the same way.)
	time.Sleep(700 * time.Millisecond)
	late := chat(true, 2000)
	late.Migratable = true
	lx, err := p.cli.Exchange(t.Context(), workerID, late)
	if err != nil {
		t.Fatal(err)
	}
	defer lx.Close()
	ux, err := p.cli.Exchange(t.Context(), workerID, chat(false, 2000))
	if err != nil {
		t.Fatal(err)
	}
	defer ux.Close()
	for {
		f, err := lx.Next()
		if errors.Is(err, natsreq.ErrDraining) {
			break
		}
		if err != nil || f.Type != natsreq.TypeData {
			t.Fatalf("late migratable request: %+v %v, want the drain notice", f, err)
		}
	}
	if f, err := ux.Next(); !errors.Is(err, natsreq.ErrWorker) || string(f.Data) != natsreq.CancelledText {
		t.Fatalf("late unary request: %+v %v, want %q", f, err, natsreq.CancelledText)
	}
	<-stopped
	for {
		if _, err := x.Next(); err != nil {
			if !errors.Is(err, natsreq.ErrDraining) {
				t.Fatalf("the running stream: %v, want the drain notice", err)
			}
			break
		}
	}
	js, err := jetstream.New(p.nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(t.Context(), natsreq.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(t.Context()); err != nil || info.State.Msgs != 0 {
		t.Fatalf("requests left in %s: %+v %v", natsreq.StreamName, info, err)
	}
}
