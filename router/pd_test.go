package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/router"
	"github.com/infera/infera/sim"
)

// pdSim is an in-process simulator in a PD role, recording what it got.
type pdSim struct {
	addr   string
	kvAddr string
	log    string // --record-requests file
}

// startPDSim runs a sim with role and protocol (role "" = mixed).
func startPDSim(t *testing.T, role, protocol string, tweak func(*config.Sim)) *pdSim {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startPDSimOn(t, ln, role, protocol, tweak)
}

// startPDSimOn is startPDSim serving on ln.
func startPDSimOn(t *testing.T, ln net.Listener, role, protocol string, tweak func(*config.Sim)) *pdSim {
	t.Helper()
	cfg := config.DefaultSim()
	cfg.Port = 0
	cfg.TimeScale = 0.01
	cfg.PDRole, cfg.PDProtocol = role, protocol
	cfg.PDKVTimeout = 20 * time.Second
	cfg.RecordRequests = filepath.Join(t.TempDir(), "requests.jsonl")
	if tweak != nil {
		tweak(&cfg)
	}
	// An in-process sim that "crashes" (--die-after-tokens) must not take
	// the test binary with it.
	s, err := sim.New(cfg, zerolog.Nop(), sim.WithExit(func(int) {}))
	if err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	servetest.Run(t, "sim", ln, s.Serve)
	<-s.Ready()
	return &pdSim{addr: ln.Addr().String(), kvAddr: s.PDKVAddr(), log: cfg.RecordRequests}
}

// record is the sim's discovery record as its worker would register it.
func (p *pdSim) record(mode discovery.DisaggMode, protocol string) discovery.Record {
	r := record(&upstream{addr: p.addr}, "sim-model", discovery.StatusActive)
	r.DisaggMode = mode
	if protocol != "" {
		params := map[string]any{"engine_id": "e-" + p.addr}
		if protocol == discovery.ProtocolSGLangBootstrap && mode == discovery.DisaggPrefill {
			params = map[string]any{"bootstrap_addr": p.kvAddr}
		}
		if protocol == discovery.ProtocolATOMMooncake {
			host, port, _ := net.SplitHostPort(p.addr)
			hp := 6301.0
			if p.kvAddr != "" {
				_, kp, _ := net.SplitHostPort(p.kvAddr)
				n, _ := strconv.Atoi(kp)
				hp = float64(n)
			}
			n, _ := strconv.Atoi(port)
			params = map[string]any{"host": host, "http_port": float64(n), "handshake_port": hp, "tp_size": 2.0, "dp_size": 1.0}
		}
		if protocol == discovery.ProtocolVLLMMoriRead || protocol == discovery.ProtocolVLLMMoriWrite {
			hp := 7000.0
			if p.kvAddr != "" {
				_, kp, _ := net.SplitHostPort(p.kvAddr)
				n, _ := strconv.Atoi(kp)
				hp = float64(n)
			}
			params["kv_connector_extra_config"] = map[string]any{"handshake_port": hp, "notify_port": hp + 1, "tp_size": 1.0}
		}
		if protocol == discovery.ProtocolVLLMMooncake && mode == discovery.DisaggPrefill {
			params["bootstrap_addr"] = "http://" + p.kvAddr
		}
		r.DisaggMeta = discovery.DisaggMeta{Protocol: protocol, Params: params}
	}
	return r
}

type gotRequest struct {
	Path        string         `json:"path"`
	Role        string         `json:"role"`
	RequestID   string         `json:"request_id"`
	DPRank      string         `json:"dp_rank"`
	Traceparent string         `json:"traceparent"`
	Body        map[string]any `json:"body"`
}

// got returns the requests the sim received.
func (p *pdSim) got(t *testing.T) []gotRequest {
	t.Helper()
	data, err := os.ReadFile(p.log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []gotRequest
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var g gotRequest
		if err := json.Unmarshal([]byte(line), &g); err != nil {
			t.Fatalf("request log line %q: %v", line, err)
		}
		out = append(out, g)
	}
	return out
}

func pdRouter(t *testing.T, set func(*router.Config), workers ...discovery.Record) *testRouter {
	t.Helper()
	cfg := withConfig(func(c *router.Config) {
		c.PDPrefillTimeout = 5 * time.Second
		if set != nil {
			set(c)
		}
	})
	return startRouter(t, &router.RoundRobin{}, cfg, workers...)
}

const pdChat = `{"model":"sim-model","max_tokens":5,"messages":[{"role":"user","content":"tell me about disaggregated serving please"}],"temperature":0.5,"user":"u1"}`

func pdStreamChat(body string) string {
	return strings.Replace(body, `"max_tokens":5`, `"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}`, 1)
}

// jsonOf renders v compactly, for comparisons.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// readSSE reads a stream to its end and returns its data payloads.
func readSSE(t *testing.T, r *bufio.Reader) []string {
	t.Helper()
	var data []string
	for {
		line, err := r.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			data = append(data, strings.TrimSpace(strings.TrimPrefix(line, "data: ")))
		}
		if err != nil {
			return data
		}
	}
}

// mixedAnswer is what a mixed sim answers to body (the same prompt and
// seed give the same text: the PD answer must equal it).
func mixedAnswer(t *testing.T, body string) string {
	t.Helper()
	m := startPDSim(t, "", "", nil)
	tr := pdRouter(t, nil, m.record(discovery.DisaggMixed, ""))
	resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", body)
	if resp.StatusCode != 200 {
		t.Fatalf("mixed: %d %s", resp.StatusCode, b)
	}
	return contentOf(t, b)
}

func contentOf(t *testing.T, b []byte) string {
	t.Helper()
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("answer %s: %v", b, err)
	}
	return out.Choices[0].Message.Content
}

func TestPDNixl1P1D(t *testing.T) {
	want := mixedAnswer(t, pdChat)
	p := startPDSim(t, "prefill", discovery.ProtocolVLLMNixl, nil)
	d := startPDSim(t, "decode", discovery.ProtocolVLLMNixl, nil)
	tr := pdRouter(t, nil, p.record(discovery.DisaggPrefill, discovery.ProtocolVLLMNixl), d.record(discovery.DisaggDecode, discovery.ProtocolVLLMNixl))

	resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if got := resp.Header.Get("X-Infera-Prefill-Worker"); got != p.addr {
		t.Errorf("X-Infera-Prefill-Worker %q, want %q", got, p.addr)
	}
	if got := resp.Header.Get("X-Infera-Worker"); got != d.addr {
		t.Errorf("X-Infera-Worker %q, want the decode %q", got, d.addr)
	}
	if got := contentOf(t, b); got != want {
		t.Errorf("content %q, want the mixed engine's %q", got, want)
	}

	pg, dg := p.got(t), d.got(t)
	if len(pg) != 1 || len(dg) != 1 {
		t.Fatalf("prefill got %d requests, decode %d; want 1 each", len(pg), len(dg))
	}
	pb, db := pg[0].Body, dg[0].Body
	if pb["max_tokens"] != 1.0 || pb["stream"] != false || pb["temperature"] != 0.5 || pb["user"] != "u1" {
		t.Errorf("prefill body %v: want max_tokens 1, stream false, client fields kept", pb)
	}
	if got, want := jsonOf(t, pb["kv_transfer_params"]), `{"do_remote_decode":true,"do_remote_prefill":false,"remote_block_ids":null,"remote_engine_id":null,"remote_host":null,"remote_port":null}`; got != want {
		t.Errorf("prefill kv_transfer_params %s, want %s", got, want)
	}
	kv, _ := db["kv_transfer_params"].(map[string]any)
	if db["max_tokens"] != 5.0 || kv["do_remote_prefill"] != true || kv["remote_engine_id"] != "sim-engine" ||
		kv["remote_port"] == nil || kv["remote_request_id"] == nil || db["temperature"] != 0.5 {
		t.Errorf("decode body %v: want the client's body plus the prefill's hand-off", db)
	}
	if pg[0].RequestID == "" || pg[0].RequestID != dg[0].RequestID {
		t.Errorf("request ids %q / %q: want the same on both legs", pg[0].RequestID, dg[0].RequestID)
	}

	// Streaming: the prefill is still unary, the decode streams.
	sresp, r := tr.stream(t, pdStreamChat(pdChat))
	defer sresp.Body.Close()
	if sresp.StatusCode != 200 || !strings.HasPrefix(sresp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream status %d %q", sresp.StatusCode, sresp.Header.Get("Content-Type"))
	}
	data := readSSE(t, r)
	if len(data) < 3 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("stream %q", data)
	}
	var text strings.Builder
	for _, ev := range data[:len(data)-1] {
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	if text.String() != want {
		t.Errorf("streamed %q, want %q", text.String(), want)
	}
	pg, dg = p.got(t), d.got(t)
	if pb := pg[1].Body; pb["stream"] != false || pb["stream_options"] != nil {
		t.Errorf("stream prefill body %v: want stream false, no stream_options", pb)
	}
	if db := dg[1].Body; db["stream"] != true || db["stream_options"] == nil {
		t.Errorf("stream decode body %v: want the client's stream flags", db)
	}
}

func TestPDSGLangBootstrapDPAlignment(t *testing.T) {
	want := mixedAnswer(t, pdChat)
	// The prefill keeps KV per rank and refuses a room not congruent to
	// the rank pinned; the decode finds it on disagg_prefill_dp_rank.
	p := startPDSim(t, "prefill", discovery.ProtocolSGLangBootstrap, func(c *config.Sim) { c.PDDPSize = 4 })
	d := startPDSim(t, "decode", discovery.ProtocolSGLangBootstrap, nil)
	prec := p.record(discovery.DisaggPrefill, discovery.ProtocolSGLangBootstrap)
	prec.DPSize = 4 // the router pins a rank and aligns the room to it
	tr := pdRouter(t, nil, prec, d.record(discovery.DisaggDecode, discovery.ProtocolSGLangBootstrap))

	for i := range 4 {
		resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
		if resp.StatusCode != 200 || contentOf(t, b) != want {
			t.Fatalf("request %d: %d %s, want %q", i, resp.StatusCode, b, want)
		}
	}
	pg, dg := p.got(t), d.got(t)
	if len(pg) != 4 || len(dg) != 4 {
		t.Fatalf("prefill got %d, decode %d requests; want 4 each", len(pg), len(dg))
	}
	host, port, _ := net.SplitHostPort(p.kvAddr)
	for i := range pg {
		pb, db := pg[i].Body, dg[i].Body
		room, ok := pb["bootstrap_room"].(float64)
		if !ok || pb["bootstrap_host"] != host || strconv.Itoa(int(pb["bootstrap_port"].(float64))) != port {
			t.Fatalf("prefill body %v: want bootstrap_host %s, bootstrap_port %s, bootstrap_room", pb, host, port)
		}
		if db["bootstrap_room"] != room || db["bootstrap_host"] != host || db["bootstrap_port"] != pb["bootstrap_port"] {
			t.Fatalf("decode body %v: want the prefill's bootstrap fields", db)
		}
		// Both legs keep the client's body (no max_tokens change).
		if pb["max_tokens"] != 5.0 || db["max_tokens"] != 5.0 || pb["user"] != "u1" {
			t.Errorf("bodies %v / %v: want the client's max_tokens and fields", pb, db)
		}
		// JSON numbers lose the low bits of a 63-bit room: the raw
		// line is checked for the exact residue.
		rank, err := strconv.Atoi(pg[i].DPRank)
		if err != nil || db["disagg_prefill_dp_rank"] != float64(rank) {
			t.Fatalf("prefill rank header %q, decode disagg_prefill_dp_rank %v", pg[i].DPRank, db["disagg_prefill_dp_rank"])
		}
		raw := rawRoom(t, p.log, i)
		if raw%4 != uint64(rank) {
			t.Errorf("room %d %% 4 = %d, want the prefill rank %d", raw, raw%4, rank)
		}
	}
}

// rawRoom reads the exact bootstrap_room of the i-th logged request.
func rawRoom(t *testing.T, path string, i int) uint64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Split(strings.TrimSpace(string(data)), "\n")[i]
	var g struct {
		Body struct {
			Room json.Number `json:"bootstrap_room"`
		} `json:"body"`
	}
	dec := json.NewDecoder(strings.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&g); err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(string(g.Body.Room), 10, 64)
	if err != nil || n >= 1<<63 {
		t.Fatalf("room %q: want an integer below 2^63", g.Body.Room)
	}
	return n
}

func TestPDTopologyErrors(t *testing.T) {
	p := startPDSim(t, "prefill", discovery.ProtocolVLLMNixl, nil)
	d := startPDSim(t, "decode", discovery.ProtocolSGLangBootstrap, nil)

	t.Run("prefill only", func(t *testing.T) {
		tr := pdRouter(t, nil, p.record(discovery.DisaggPrefill, discovery.ProtocolVLLMNixl))
		resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
		wantError(t, resp, b, 503, "no_decode_worker")
		if !strings.Contains(string(b), "decode pool is empty") {
			t.Errorf("body %s does not name the missing pool", b)
		}
	})
	t.Run("decode only", func(t *testing.T) {
		tr := pdRouter(t, nil, d.record(discovery.DisaggDecode, discovery.ProtocolSGLangBootstrap))
		resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
		wantError(t, resp, b, 503, "no_prefill_worker")
	})
	t.Run("one side plus mixed: mixed serves", func(t *testing.T) {
		m := startPDSim(t, "", "", nil)
		tr := pdRouter(t, nil, p.record(discovery.DisaggPrefill, discovery.ProtocolVLLMNixl), m.record(discovery.DisaggMixed, ""))
		resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
		if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Worker") != m.addr {
			t.Fatalf("%d via %q: %s", resp.StatusCode, resp.Header.Get("X-Infera-Worker"), b)
		}
	})
	t.Run("mismatched protocols", func(t *testing.T) {
		tr := pdRouter(t, nil, p.record(discovery.DisaggPrefill, discovery.ProtocolVLLMNixl), d.record(discovery.DisaggDecode, discovery.ProtocolSGLangBootstrap))
		resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
		wantError(t, resp, b, 500, "pd_protocol_error")
		if !strings.Contains(string(b), `\"vllm-nixl\"`) || !strings.Contains(string(b), `\"sglang-bootstrap\"`) {
			t.Errorf("body %s does not name both protocols", b)
		}
		if len(p.got(t)) != 0 || len(d.got(t)) != 0 {
			t.Error("a leg was sent despite the protocol mismatch")
		}
	})
	t.Run("unknown protocol", func(t *testing.T) {
		tr := pdRouter(t, nil, p.record(discovery.DisaggPrefill, "vllm-foo"), d.record(discovery.DisaggDecode, "vllm-foo"))
		resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
		wantError(t, resp, b, 500, "pd_protocol_error")
		if !strings.Contains(string(b), "vllm-foo") {
			t.Errorf("body %s does not name the protocol", b)
		}
	})
}

// TestPDPrefillFailures: a failing or hanging prefill reaches the client
// as an error at once (well before the decode's own KV deadline), and a
// concurrent decode waiting for its KV is aborted.
func TestPDPrefillFailures(t *testing.T) {
	for _, proto := range []string{discovery.ProtocolVLLMNixl, discovery.ProtocolSGLangBootstrap} {
		t.Run(proto+"/error", func(t *testing.T) {
			p := startPDSim(t, "prefill", proto, func(c *config.Sim) { c.ErrorRate = 1 })
			d := startPDSim(t, "decode", proto, nil)
			tr := pdRouter(t, nil, p.record(discovery.DisaggPrefill, proto), d.record(discovery.DisaggDecode, proto))
			start := time.Now()
			resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
			wantError(t, resp, b, 502, "upstream_error")
			if !strings.Contains(string(b), "prefill worker "+p.addr) {
				t.Errorf("body %s does not name the prefill", b)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("answered after %v: the decode leg was not aborted", el)
			}
			if proto == discovery.ProtocolVLLMNixl && len(d.got(t)) != 0 {
				t.Error("serial protocol sent the decode leg after a failed prefill")
			}
		})
		t.Run(proto+"/timeout", func(t *testing.T) {
			p := startPDSim(t, "prefill", proto, func(c *config.Sim) { c.HangBeforeFirstToken = 1 })
			d := startPDSim(t, "decode", proto, nil)
			tr := pdRouter(t, func(c *router.Config) { c.PDPrefillTimeout = 300 * time.Millisecond },
				p.record(discovery.DisaggPrefill, proto), d.record(discovery.DisaggDecode, proto))
			start := time.Now()
			resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
			if resp.StatusCode != 504 && resp.StatusCode != 502 {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			if !strings.Contains(string(b), "prefill") {
				t.Errorf("body %s does not name the prefill", b)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("answered after %v, want about the 300ms prefill timeout", el)
			}
		})
		t.Run(proto+"/stream", func(t *testing.T) {
			p := startPDSim(t, "prefill", proto, func(c *config.Sim) { c.ErrorRate = 1 })
			d := startPDSim(t, "decode", proto, nil)
			tr := pdRouter(t, nil, p.record(discovery.DisaggPrefill, proto), d.record(discovery.DisaggDecode, proto))
			start := time.Now()
			resp, r := tr.stream(t, pdStreamChat(pdChat))
			defer resp.Body.Close()
			all := strings.Join(readSSE(t, r), "\n")
			if resp.StatusCode == 200 {
				// The decode stream started: the failure is in-stream.
				if !strings.Contains(all, "prefill") || !strings.Contains(all, "error") {
					t.Errorf("stream %q: want an error event naming the prefill", all)
				}
			} else if resp.StatusCode != 502 {
				t.Errorf("status %d", resp.StatusCode)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("answered after %v", el)
			}
		})
	}
}

// TestPDPrefillDeathOutranByDecodeError: a prefill engine that dies takes
// the decode's KV transfer down with it, and the decode's 500 ("kv transfer
// failed") can reach the router before the prefill's connection reset
// does. The client is still told that the prefill failed — the cause — not
// the decode (the e2e PD failure test saw this race on a loaded box).
func TestPDPrefillDeathOutranByDecodeError(t *testing.T) {
	proto := discovery.ProtocolSGLangBootstrap
	decodeAnswered := make(chan struct{})
	var once sync.Once
	d := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"kv transfer failed: peer unavailable","code":500}}`)
		once.Do(func() { close(decodeAnswered) })
	})
	p := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		select {
		case <-decodeAnswered:
		case <-time.After(10 * time.Second):
		}
		time.Sleep(100 * time.Millisecond) // the decode's answer is read first
		if tc, ok := ctx.Conn().(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, as from a killed process
		}
		_ = ctx.Conn().Close()
	})
	prec := (&pdSim{addr: p.addr, kvAddr: "127.0.0.1:1"}).record(discovery.DisaggPrefill, proto)
	drec := (&pdSim{addr: d.addr}).record(discovery.DisaggDecode, proto)
	tr := pdRouter(t, func(c *router.Config) { c.MaxRetries = 0 }, prec, drec)
	resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
	if resp.StatusCode < 500 || !strings.Contains(string(b), "prefill worker "+p.addr) {
		t.Fatalf("%d %s: want a 5xx naming the prefill worker %s", resp.StatusCode, b, p.addr)
	}
}

// TestPDFailover: a dead prefill is replaced by another before anything
// reached the client.
func TestPDFailover(t *testing.T) {
	for _, proto := range []string{discovery.ProtocolVLLMNixl, discovery.ProtocolSGLangBootstrap} {
		t.Run(proto, func(t *testing.T) {
			good := startPDSim(t, "prefill", proto, nil)
			bad := startPDSim(t, "prefill", proto, func(c *config.Sim) { c.ErrorRate = 1 })
			d := startPDSim(t, "decode", proto, nil)
			tr := pdRouter(t, func(c *router.Config) { c.MaxRetries = 2 },
				good.record(discovery.DisaggPrefill, proto), bad.record(discovery.DisaggPrefill, proto), d.record(discovery.DisaggDecode, proto))
			for i := range 4 {
				resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
				if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Prefill-Worker") != good.addr {
					t.Fatalf("request %d: %d via prefill %q: %s", i, resp.StatusCode, resp.Header.Get("X-Infera-Prefill-Worker"), b)
				}
			}
			if len(bad.got(t)) == 0 {
				t.Error("the failing prefill was never tried")
			}
		})
	}
}

// TestPDFailoverDecode: a decode that fails before its first byte (a 5xx,
// or a worker that is not there) is replaced by another pair, unary and
// streaming; the client sees only the good pair's answer.
func TestPDFailoverDecode(t *testing.T) {
	for _, proto := range []string{discovery.ProtocolVLLMNixl, discovery.ProtocolSGLangBootstrap} {
		t.Run(proto, func(t *testing.T) {
			p := startPDSim(t, "prefill", proto, nil)
			good := startPDSim(t, "decode", proto, nil)
			bad := startPDSim(t, "decode", proto, func(c *config.Sim) { c.ErrorRate = 1 })
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			gone := &pdSim{addr: ln.Addr().String()}
			_ = ln.Close()
			tr := pdRouter(t, func(c *router.Config) { c.MaxRetries = 3 }, p.record(discovery.DisaggPrefill, proto),
				good.record(discovery.DisaggDecode, proto), bad.record(discovery.DisaggDecode, proto), gone.record(discovery.DisaggDecode, proto))
			for i := range 6 {
				body := pdChat
				if i%2 == 1 {
					body = pdStreamChat(pdChat)
				}
				resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", body)
				if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Worker") != good.addr || resp.Header.Get("X-Infera-Prefill-Worker") != p.addr ||
					strings.Contains(string(b), `"error"`) {
					t.Fatalf("request %d: %d via %s/%s: %s", i, resp.StatusCode, resp.Header.Get("X-Infera-Prefill-Worker"), resp.Header.Get("X-Infera-Worker"), b)
				}
			}
			if len(bad.got(t)) == 0 {
				t.Error("the failing decode was never tried")
			}
			if n := len(good.got(t)); n != 6 {
				t.Errorf("good decode got %d requests, want 6", n)
			}
		})
	}
}

// countingListener counts the connections it accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestPDLegsReuseConnections: unary legs (every prefill, a unary decode)
// take connections of the worker's pool, as mixed attempts do, instead of
// one connection per leg.
func TestPDLegsReuseConnections(t *testing.T) {
	for _, proto := range []string{discovery.ProtocolVLLMNixl, discovery.ProtocolSGLangBootstrap} {
		t.Run(proto, func(t *testing.T) {
			listen := func() *countingListener {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				return &countingListener{Listener: ln}
			}
			pl, dl := listen(), listen()
			p := startPDSimOn(t, pl, "prefill", proto, nil)
			d := startPDSimOn(t, dl, "decode", proto, nil)
			tr := pdRouter(t, nil, p.record(discovery.DisaggPrefill, proto), d.record(discovery.DisaggDecode, proto))
			const n = 8
			for i := range n {
				if resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat); resp.StatusCode != 200 {
					t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
				}
			}
			// A leg per connection would be n each; the pool's idle
			// timeout (50ms in tests) may retire one now and then.
			if got := pl.n.Load(); got >= n {
				t.Errorf("prefill accepted %d connections for %d requests: legs do not reuse connections", got, n)
			}
			if got := dl.n.Load(); got >= n {
				t.Errorf("decode accepted %d connections for %d unary requests: legs do not reuse connections", got, n)
			}
		})
	}
}

// TestPDStreamedDecodeReusesConnections: a streamed decode leg takes a
// connection of the decode worker's pool and gives it back once the stream
// was read to its end, as a mixed stream does; it does not dial one of its
// own per request.
func TestPDStreamedDecodeReusesConnections(t *testing.T) {
	for _, proto := range []string{discovery.ProtocolVLLMNixl, discovery.ProtocolSGLangBootstrap, discovery.ProtocolVLLMMooncake} {
		t.Run(proto, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			dl := &countingListener{Listener: ln}
			p := startPDSim(t, "prefill", proto, nil)
			d := startPDSimOn(t, dl, "decode", proto, nil)
			tr := pdRouter(t, nil, p.record(discovery.DisaggPrefill, proto), d.record(discovery.DisaggDecode, proto))
			const n = 8
			for i := range n {
				resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", pdStreamChat(pdChat))
				if resp.StatusCode != 200 || !strings.Contains(string(b), "data: [DONE]") {
					t.Fatalf("stream %d: %d %s", i, resp.StatusCode, b)
				}
			}
			// A connection dialed per streamed decode would be n; the
			// pool's idle timeout (50ms in tests) may retire one now and
			// then.
			if got := dl.n.Load(); got >= n/2 {
				t.Errorf("decode accepted %d connections for %d streamed requests: streamed decode legs do not reuse connections", got, n)
			}
		})
	}
}

// TestPDUnaryClientLeaves: a unary PD client that leaves cancels both
// legs: the engines' running counts drop to 0, whichever leg was running.
func TestPDUnaryClientLeaves(t *testing.T) {
	for _, c := range []struct {
		proto string
		hang  string // the role whose engine holds the request
	}{
		{discovery.ProtocolVLLMNixl, "decode"},
		{discovery.ProtocolVLLMNixl, "prefill"},
		{discovery.ProtocolSGLangBootstrap, "decode"},
		{discovery.ProtocolSGLangBootstrap, "prefill"},
	} {
		t.Run(c.proto+"/"+c.hang, func(t *testing.T) {
			hang := func(role string) func(*config.Sim) {
				if role != c.hang {
					return nil
				}
				return func(s *config.Sim) { s.HangBeforeFirstToken = 1 }
			}
			p := startPDSim(t, "prefill", c.proto, hang("prefill"))
			d := startPDSim(t, "decode", c.proto, hang("decode"))
			tr := pdRouter(t, func(c *router.Config) { c.PDPrefillTimeout = 30 * time.Second },
				p.record(discovery.DisaggPrefill, c.proto), d.record(discovery.DisaggDecode, c.proto))
			held := &upstream{addr: p.addr}
			if c.hang == "decode" {
				held = &upstream{addr: d.addr}
			}
			ctx, cancel := context.WithCancel(t.Context())
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, tr.url+"/v1/chat/completions", strings.NewReader(pdChat))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				resp, err := tr.client.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				done <- err
			}()
			testkit.Eventually(t, "the "+c.hang+" engine to hold the request", func() bool { return simGauge(t, held, "vllm:num_requests_running") == 1 })
			cancel()
			if err := <-done; err == nil {
				t.Error("the request answered, want it cancelled")
			}
			testkit.Eventually(t, "both engines to drop the request", func() bool {
				return simGauge(t, &upstream{addr: p.addr}, "vllm:num_requests_running") == 0 && simGauge(t, &upstream{addr: d.addr}, "vllm:num_requests_running") == 0
			})
		})
	}
}

// TestPDCacheHints: each leg gets its engine's cache hints, as a mixed
// worker of that engine would (cachehints.go), on top of the protocol's
// fields; a client's own hint fields are kept.
func TestPDCacheHints(t *testing.T) {
	withEngine := func(r discovery.Record, engine string) discovery.Record { r.Engine = engine; return r }
	t.Run("vllm", func(t *testing.T) {
		p := startPDSim(t, "prefill", discovery.ProtocolVLLMNixl, nil)
		d := startPDSim(t, "decode", discovery.ProtocolVLLMNixl, nil)
		tr := pdRouter(t, nil, withEngine(p.record(discovery.DisaggPrefill, discovery.ProtocolVLLMNixl), discovery.EngineVLLM),
			withEngine(d.record(discovery.DisaggDecode, discovery.ProtocolVLLMNixl), discovery.EngineVLLM))
		short := strings.Replace(pdChat, `"user":"u1"`, `"user":"u1","prompt_cache_retention":"5m"`, 1)
		own := strings.Replace(pdChat, `"user":"u1"`, `"user":"u1","kv_transfer_params":{"infera_retention":"none"}`, 1)
		for _, b := range []string{short, pdStreamChat(own)} {
			if resp, out := tr.do(t, http.MethodPost, "/v1/chat/completions", b); resp.StatusCode != 200 || strings.Contains(string(out), `"error"`) {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
		}
		pg, dg := p.got(t), d.got(t)
		if len(pg) != 2 || len(dg) != 2 {
			t.Fatalf("prefill got %d, decode %d", len(pg), len(dg))
		}
		for i, want := range []struct{ kv, legacy string }{{"short", "short"}, {"none", "long"}} {
			for leg, g := range map[string]gotRequest{"prefill": pg[i], "decode": dg[i]} {
				kv, _ := g.Body["kv_transfer_params"].(map[string]any)
				if kv["infera_retention"] != want.kv || g.Body["_infera_retention"] != want.legacy {
					t.Errorf("request %d %s body %v: want kv_transfer_params.infera_retention %q, _infera_retention %q", i, leg, g.Body, want.kv, want.legacy)
				}
				if (leg == "prefill" && kv["do_remote_decode"] != true) || (leg == "decode" && kv["do_remote_prefill"] != true) {
					t.Errorf("request %d %s kv_transfer_params %v lost the protocol's fields", i, leg, kv)
				}
			}
		}
	})
	t.Run("sglang", func(t *testing.T) {
		p := startPDSim(t, "prefill", discovery.ProtocolSGLangBootstrap, nil)
		d := startPDSim(t, "decode", discovery.ProtocolSGLangBootstrap, nil)
		tr := pdRouter(t, nil, withEngine(p.record(discovery.DisaggPrefill, discovery.ProtocolSGLangBootstrap), discovery.EngineSGLang),
			withEngine(d.record(discovery.DisaggDecode, discovery.ProtocolSGLangBootstrap), discovery.EngineSGLang))
		short := strings.Replace(pdChat, `"user":"u1"`, `"user":"u1","prompt_cache_key":"s1"`, 1)
		own := strings.Replace(pdChat, `"user":"u1"`, `"user":"u1","priority":7`, 1)
		for _, b := range []string{short, pdStreamChat(own)} {
			if resp, out := tr.do(t, http.MethodPost, "/v1/chat/completions", b); resp.StatusCode != 200 || strings.Contains(string(out), `"error"`) {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
		}
		pg, dg := p.got(t), d.got(t)
		if len(pg) != 2 || len(dg) != 2 {
			t.Fatalf("prefill got %d, decode %d", len(pg), len(dg))
		}
		for i, want := range []struct {
			prio float64
			ret  string
		}{{50, "short"}, {7, "long"}} {
			for leg, g := range map[string]gotRequest{"prefill": pg[i], "decode": dg[i]} {
				if g.Body["priority"] != want.prio || g.Body["infera_retention"] != want.ret || g.Body["bootstrap_room"] == nil {
					t.Errorf("request %d %s body %v: want priority %v, infera_retention %q and the bootstrap fields", i, leg, g.Body, want.prio, want.ret)
				}
			}
		}
	})
}

// TestPDMinUncachedTokens: short prompts run on the decode alone, long
// ones disaggregate.
func TestPDMinUncachedTokens(t *testing.T) {
	p := startPDSim(t, "prefill", discovery.ProtocolVLLMNixl, nil)
	d := startPDSim(t, "decode", discovery.ProtocolVLLMNixl, nil)
	pol := newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = router.TokenizerBytes }))
	cfg := withConfig(func(c *router.Config) { c.PDMinUncachedTokens = 200 })
	tr := startRouter(t, pol, cfg, p.record(discovery.DisaggPrefill, discovery.ProtocolVLLMNixl), d.record(discovery.DisaggDecode, discovery.ProtocolVLLMNixl))

	short := `{"model":"sim-model","max_tokens":3,"prompt":"hi there"}`
	resp, b := tr.do(t, http.MethodPost, "/v1/completions", short)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-PD") != "decode-only" || resp.Header.Get("X-Infera-Prefill-Worker") != "" {
		t.Fatalf("short: %d %q prefill %q: %s", resp.StatusCode, resp.Header.Get("X-Infera-PD"), resp.Header.Get("X-Infera-Prefill-Worker"), b)
	}
	long := `{"model":"sim-model","max_tokens":3,"prompt":"` + strings.Repeat("a long prompt that is worth a remote prefill. ", 10) + `"}`
	resp, b = tr.do(t, http.MethodPost, "/v1/completions", long)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-PD") != "disaggregated" || resp.Header.Get("X-Infera-Prefill-Worker") != p.addr {
		t.Fatalf("long: %d %q: %s", resp.StatusCode, resp.Header.Get("X-Infera-PD"), b)
	}
	pg, dg := p.got(t), d.got(t)
	if len(pg) != 1 || len(dg) != 2 {
		t.Fatalf("prefill got %d, decode %d requests; want 1 and 2", len(pg), len(dg))
	}
	if _, ok := dg[0].Body["kv_transfer_params"]; ok {
		t.Errorf("decode-only body %v has kv_transfer_params", dg[0].Body)
	}
}

func TestPDMooncake(t *testing.T) {
	p := startPDSim(t, "prefill", discovery.ProtocolVLLMMooncake, nil)
	d := startPDSim(t, "decode", discovery.ProtocolVLLMMooncake, nil)
	prec := p.record(discovery.DisaggPrefill, discovery.ProtocolVLLMMooncake)
	prec.DPSize = 2
	tr := pdRouter(t, nil, prec, d.record(discovery.DisaggDecode, discovery.ProtocolVLLMMooncake))
	body := strings.Replace(pdChat, `"max_tokens":5`, `"max_tokens":5,"max_completion_tokens":6`, 1)
	for _, stream := range []bool{false, true} {
		b := body
		if stream {
			b = pdStreamChat(body)
		}
		resp, out := tr.do(t, http.MethodPost, "/v1/chat/completions", b)
		if resp.StatusCode != 200 || strings.Contains(string(out), `"error"`) {
			t.Fatalf("stream %v: %d %s", stream, resp.StatusCode, out)
		}
	}
	pg, dg := p.got(t), d.got(t)
	if len(pg) != 2 || len(dg) != 2 {
		t.Fatalf("prefill got %d, decode %d", len(pg), len(dg))
	}
	for i := range pg {
		pb, db := pg[i].Body, dg[i].Body
		pkv, _ := pb["kv_transfer_params"].(map[string]any)
		dkv, _ := db["kv_transfer_params"].(map[string]any)
		xfer, _ := pkv["transfer_id"].(string)
		if len(xfer) != len("xfer-")+32 || !strings.HasPrefix(xfer, "xfer-") || pkv["do_remote_decode"] != true || pkv["do_remote_prefill"] != false {
			t.Errorf("prefill kv_transfer_params %v", pkv)
		}
		if pb["max_tokens"] != 1.0 || pb["max_completion_tokens"] != 1.0 || pb["stream"] != false || pb["stream_options"] != nil {
			t.Errorf("prefill body %v", pb)
		}
		if db["max_tokens"] != 4.0 || db["max_completion_tokens"] != 5.0 {
			t.Errorf("decode body %v: want max_tokens 4, max_completion_tokens 5 (decremented)", db)
		}
		room, err := strconv.ParseUint(xfer[len("xfer-"):], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		rank, _ := strconv.Atoi(pg[i].DPRank)
		if dkv["transfer_id"] != xfer || dkv["do_remote_prefill"] != true || dkv["remote_bootstrap_addr"] != "http://"+p.kvAddr ||
			dkv["remote_engine_id"] != "e-"+p.addr+"_dp"+strconv.Itoa(rank) || int(room%2) != rank {
			t.Errorf("decode kv_transfer_params %v (room %d, prefill rank %q)", dkv, room, pg[i].DPRank)
		}
	}
}

func TestPDATOMMooncake(t *testing.T) {
	p := startPDSim(t, "prefill", discovery.ProtocolATOMMooncake, nil)
	d := startPDSim(t, "decode", discovery.ProtocolATOMMooncake, nil)
	tr := pdRouter(t, nil, p.record(discovery.DisaggPrefill, discovery.ProtocolATOMMooncake), d.record(discovery.DisaggDecode, discovery.ProtocolATOMMooncake))
	compl := `{"model":"sim-model","max_tokens":4,"stream":true,"prompt":"the atom connector hands off a transfer id"}`
	resp, b := tr.do(t, http.MethodPost, "/v1/completions", compl)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "[DONE]") || strings.Contains(string(b), `"error"`) {
		t.Fatalf("completions: %d %s", resp.StatusCode, b)
	}
	pg, dg := p.got(t), d.got(t)
	if len(pg) != 1 || len(dg) != 1 {
		t.Fatalf("prefill got %d, decode %d", len(pg), len(dg))
	}
	pkv, _ := pg[0].Body["kv_transfer_params"].(map[string]any)
	dhost, dport, _ := net.SplitHostPort(d.addr)
	if got, want := jsonOf(t, pkv), jsonOf(t, map[string]any{"remote_dp_size": 1, "remote_tp_size": 2, "do_remote_decode": true, "do_remote_prefill": false,
		"remote_handshake_port": 6301, "remote_engine_id": nil, "remote_block_ids": nil, "remote_host": dhost, "remote_port": mustAtoi(t, dport)}); got != want {
		t.Errorf("prefill kv_transfer_params %s, want %s", got, want)
	}
	if pg[0].Body["stream"] != false || pg[0].Body["max_tokens"] != 1.0 {
		t.Errorf("prefill body %v", pg[0].Body)
	}
	db := dg[0].Body
	dkv, _ := db["kv_transfer_params"].(map[string]any)
	if db["max_tokens"] != 4.0 || db["stream"] != true || dkv["transfer_id"] == nil || dkv["remote_dp_size"] != 1.0 ||
		dkv["remote_tp_size"] != 2.0 || dkv["tp_size"] != 2.0 || dkv["remote_dp_rank"] != 0.0 || dkv["first_token_id"] == nil {
		t.Errorf("decode body %v: want the client's body and the hand-off plus the prefill's sizes", db)
	}
	// Chat: ATOM hands off only on completions.
	resp, b = tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
	wantError(t, resp, b, 502, "upstream_error")
	if !strings.Contains(string(b), "kv_transfer_params") {
		t.Errorf("chat error %s does not say why", b)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

var moriIDPattern = regexp.MustCompile(`^___prefill_addr_host:127\.0\.0\.1,handshake:\d+,notify:\d+___decode_addr_host:127\.0\.0\.1,handshake:7000,notify:7001_[0-9a-f]{32}$`)

func TestPDMoRIIO(t *testing.T) {
	for _, proto := range []string{discovery.ProtocolVLLMMoriRead, discovery.ProtocolVLLMMoriWrite} {
		t.Run(proto, func(t *testing.T) {
			p := startPDSim(t, "prefill", proto, nil)
			d := startPDSim(t, "decode", proto, nil)
			tr := pdRouter(t, nil, p.record(discovery.DisaggPrefill, proto), d.record(discovery.DisaggDecode, proto))
			for _, b := range []string{pdChat, pdStreamChat(pdChat)} {
				resp, out := tr.do(t, http.MethodPost, "/v1/chat/completions", b)
				if resp.StatusCode != 200 || strings.Contains(string(out), `"error"`) {
					t.Fatalf("%d %s", resp.StatusCode, out)
				}
			}
			pg, dg := p.got(t), d.got(t)
			if len(pg) != 2 || len(dg) != 2 {
				t.Fatalf("prefill got %d, decode %d", len(pg), len(dg))
			}
			for i := range pg {
				if pg[i].RequestID != dg[i].RequestID || !moriIDPattern.MatchString(pg[i].RequestID) {
					t.Errorf("X-Request-Id %q / %q: want the same forged id on both legs", pg[i].RequestID, dg[i].RequestID)
				}
				pkv, _ := pg[i].Body["kv_transfer_params"].(map[string]any)
				dkv, _ := dg[i].Body["kv_transfer_params"].(map[string]any)
				tid, _ := pkv["transfer_id"].(string)
				if pkv["do_remote_decode"] != true || pkv["remote_dp_size"] != 1.0 || pkv["tp_size"] != 1.0 || pkv["remote_tp_size"] != 1.0 ||
					pg[i].Body["max_tokens"] != 1.0 || dg[i].Body["max_tokens"] != 4.0 || dkv["transfer_id"] != tid || dkv["do_remote_prefill"] != true {
					t.Errorf("bodies %v / %v", pg[i].Body, dg[i].Body)
				}
				if proto == discovery.ProtocolVLLMMoriWrite {
					if len(tid) != len("tx-")+32 || dkv["remote_engine_id"] != nil || dkv["remote_block_ids"] != nil {
						t.Errorf("write mode: transfer id %q, decode %v", tid, dkv)
					}
				} else if len(tid) != len("tx-")+36 || dkv["remote_engine_id"] != "sim-engine" || dkv["remote_block_ids"] == nil {
					t.Errorf("read mode: transfer id %q, decode %v: want the prefill's hand-off", tid, dkv)
				}
			}
		})
	}
}
