package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
)

// TestPDLegRequestBytes: a PD leg that writes itself (sendLeg, ownLeg)
// puts on the wire the bytes of the fasthttp request the legs were sent
// as before (upstreamRequest with the legs' X-Request-Id, as Exchange.Do
// completes it), for both legs of every protocol of shared/protocols/pd.md,
// streamed and unary, with and without a pinned DP rank and the client's
// headers, and for a decode-only leg (its body the mixed path's).
func TestPDLegRequestBytes(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`
	params := map[string]any{
		"bootstrap_addr": "10.0.0.1:8998", "engine_id": "eid", "host": "10.0.0.1", "http_port": 8000.0, "handshake_port": 6301.0, "tp_size": 2.0,
		"kv_connector_extra_config": map[string]any{"handshake_port": 7000.0, "notify_port": 7001.0},
	}
	handoff := []byte(`{"do_remote_prefill":true,"remote_block_ids":[0,1,2],"remote_engine_id":"e","transfer_id":"t","dp_rank":0}`)
	names := make([]string, 0, len(pdProtocols))
	for name := range pdProtocols {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range append(names, "decode-only") {
		for _, engine := range []string{"vllm", "sglang"} {
			for _, stream := range []string{"true", "false"} {
				for _, headers := range []string{"", "User-Agent: OpenAI/Python 1.0\r\nAccept: text/event-stream\r\nX-Request-Id: client-1\r\nContent-Type: application/json; charset=utf-8\r\nTraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nTracestate: a=b\r\n"} {
					for _, pin := range []bool{false, true} {
						body := strings.Replace(chat, `"stream":true`, `"stream":`+stream, 1)
						t.Run(name+"/"+engine+"/stream="+stream+"/headers="+itoa(len(headers))+"/pin="+map[bool]string{true: "yes", false: "no"}[pin], func(t *testing.T) {
							rel, a := ownRequestRelay(t, engine, RouteChatCompletions, body, headers, false)
							rec := *a.ticket.Worker.Record()
							rec.DisaggMeta = discovery.DisaggMeta{Protocol: name, Params: params}
							rel.pd = &pdRequest{legs: pdLegs{body: rel.body, prefill: &rec, decode: &rec, room: 42,
								prefillHost: "10.0.0.1", decodeHost: "10.0.0.2", hints: &rel.scan}}
							defer func() { rel.pd = nil }()
							a.ticket.PinRank, a.ticket.DPRank = pin, 3
							legs := [][]byte{nil} // decode-only: the mixed path's body
							if proto := pdProtocols[name]; proto != nil {
								if proto.prepare != nil {
									if err := proto.prepare(&rel.pd.legs); err != nil {
										t.Fatal(err)
									}
								}
								pre, err := proto.prefillBody(&rel.pd.legs)
								if err != nil {
									t.Fatal(err)
								}
								dec, err := proto.decodeBody(&rel.pd.legs, handoff)
								if err != nil {
									t.Fatal(err)
								}
								legs = [][]byte{pre, dec}
							}
							for _, leg := range legs {
								a.body = leg
								req := rel.upstreamRequest(a)
								rel.pd.legs.setRequestID(req)
								want := fasthttpRequestBytes(t, req)
								fasthttp.ReleaseRequest(req)
								if !rel.writesLeg(a) {
									t.Fatal("the leg does not write itself")
								}
								if got := ownRequestBytes(t, rel.ownLeg(a)); got != want {
									t.Errorf("leg request\n%q\nwant fasthttp's\n%q", got, want)
								}
							}
						})
					}
				}
			}
		}
	}
}

// TestPDProtocolIndexes: each protocol has its own slot of the cached
// series (pdMetrics.served).
func TestPDProtocolIndexes(t *testing.T) {
	if len(pdProtocols) != numPDProtocols {
		t.Fatalf("%d protocols, numPDProtocols %d", len(pdProtocols), numPDProtocols)
	}
	seen := map[int]string{}
	for name, p := range pdProtocols {
		if p.index < 0 || p.index >= numPDProtocols || seen[p.index] != "" {
			t.Errorf("%s: index %d (taken by %q)", name, p.index, seen[p.index])
		}
		seen[p.index] = name
	}
}

func TestMooncakeTransferIDAsSprintf(t *testing.T) {
	for _, room := range []uint64{0, 1, 15, 16, 0xdeadbeef, 1<<63 - 1, 1 << 63, ^uint64(0)} {
		if got, want := mooncakeTransferID(room), fmt.Sprintf("xfer-%032x", room); got != want {
			t.Errorf("mooncakeTransferID(%d) = %q, want %q", room, got, want)
		}
	}
}

func BenchmarkMooncakeTransferID(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = mooncakeTransferID(uint64(i) * 0x9e3779b97f4a7c15)
	}
}

// moriTestLegs are two MoRIIO workers' legs, the ports as discovery
// decodes them (float64) and as json.Number.
func moriTestLegs() *pdLegs {
	rec := func(id string, hp, np any) *discovery.Record {
		return &discovery.Record{WorkerID: id, DisaggMeta: discovery.DisaggMeta{Params: map[string]any{
			"kv_connector_extra_config": map[string]any{"handshake_port": hp, "notify_port": np}}}}
	}
	return &pdLegs{
		prefill: rec("p:1", float64(61234), json.Number("61235")), decode: rec("d:1", float64(7000), float64(7001)),
		prefillHost: "10.0.0.17", decodeHost: "decode-host.example", room: 0xdeadbeef,
	}
}

// checkUUID4 holds a UUID to the old uuid4's shape (hex.EncodeToString
// of 16 random bytes, version and variant set): lowercase hex, the version
// nibble 4 and the variant nibble 8–b, dashes at 8-4-4-4-12 when dashed.
func checkUUID4(t *testing.T, u string, dashed bool) {
	t.Helper()
	hexs := u
	if dashed {
		if len(u) != 36 || u[8] != '-' || u[13] != '-' || u[18] != '-' || u[23] != '-' {
			t.Fatalf("dashed uuid %q: not 8-4-4-4-12", u)
		}
		hexs = strings.ReplaceAll(u, "-", "")
	}
	if len(hexs) != 32 || strings.Trim(hexs, "0123456789abcdef") != "" {
		t.Fatalf("uuid %q: not 32 lowercase hex digits", u)
	}
	if hexs[12] != '4' || !strings.ContainsRune("89ab", rune(hexs[16])) {
		t.Fatalf("uuid %q: version %c, variant %c; want 4 and one of 89ab", u, hexs[12], hexs[16])
	}
}

func TestMoriIDsShape(t *testing.T) {
	l := moriTestLegs()
	php, pnp, _, err := moriPorts(l.prefill)
	if err != nil {
		t.Fatal(err)
	}
	dhp, dnp, _, err := moriPorts(l.decode)
	if err != nil {
		t.Fatal(err)
	}
	// The old moriRequestID's concatenation, less its uuid.
	prefix := "___prefill_addr_host:" + l.prefillHost + ",handshake:" + php + ",notify:" + pnp +
		"___decode_addr_host:" + l.decodeHost + ",handshake:" + dhp + ",notify:" + dnp + "_"
	if prefix != "___prefill_addr_host:10.0.0.17,handshake:61234,notify:61235___decode_addr_host:decode-host.example,handshake:7000,notify:7001_" {
		t.Fatalf("moriPorts: %q", prefix)
	}
	seen := map[string]bool{}
	for range 64 {
		id, err := moriRequestID(l)
		if err != nil || !strings.HasPrefix(id, prefix) {
			t.Fatalf("moriRequestID = %q, %v; want the prefix %q", id, err, prefix)
		}
		checkUUID4(t, id[len(prefix):], false)
		if err := moriPrepareRead(l); err != nil || !strings.HasPrefix(l.transferID, "tx-") {
			t.Fatalf("moriPrepareRead: transfer id %q, %v", l.transferID, err)
		}
		checkUUID4(t, l.transferID[3:], true)
		seen[id[len(prefix):]], seen[l.transferID[3:]] = true, true
	}
	if len(seen) != 128 {
		t.Errorf("%d distinct uuids of 128", len(seen))
	}
	if err := moriPrepareWrite(l); err != nil || l.transferID != fmt.Sprintf("tx-%032x", l.room) {
		t.Errorf("moriPrepareWrite: transfer id %q, %v; want %q", l.transferID, err, fmt.Sprintf("tx-%032x", l.room))
	}
	l.decode = &discovery.Record{WorkerID: "d:2"}
	if _, err := moriRequestID(l); !errors.Is(err, ErrPDMeta) {
		t.Errorf("moriRequestID without the decode's ports: %v, want ErrPDMeta", err)
	}
}

// TestMoriRequestIDAlloc: the forged id is built in one buffer, its string
// the only allocation.
func TestMoriRequestIDAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	l := moriTestLegs()
	if n := testing.AllocsPerRun(100, func() { _, _ = moriRequestID(l) }); n != 1 {
		t.Errorf("moriRequestID: %v allocations, want 1", n)
	}
}

func BenchmarkMoriRequestID(b *testing.B) {
	b.ReportAllocs()
	l := moriTestLegs()
	for b.Loop() {
		_, _ = moriRequestID(l)
	}
}

func BenchmarkMoriPrepareRead(b *testing.B) {
	b.ReportAllocs()
	l := moriTestLegs()
	for b.Loop() {
		_ = moriPrepareRead(l)
	}
}
