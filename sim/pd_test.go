package sim

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

func pdSims(t *testing.T, protocol string, edit func(*config.Sim)) (prefill, decode *testSim) {
	t.Helper()
	prefill = startSim(t, func(c *config.Sim) {
		c.PDRole, c.PDProtocol = config.PDRolePrefill, protocol
		if edit != nil {
			edit(c)
		}
	})
	decode = startSim(t, func(c *config.Sim) {
		c.PDRole, c.PDProtocol = config.PDRoleDecode, protocol
		c.PDKVTimeout = 300 * time.Millisecond
		if edit != nil {
			edit(c)
		}
	})
	return prefill, decode
}

const nixlPrefillKV = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// nixlHandoff runs a Nixl prefill of prompt and returns its hand-off.
func nixlHandoff(t *testing.T, p *testSim, prompt string) map[string]any {
	t.Helper()
	out := p.postJSON(t, "/v1/completions", `{"model":"sim-model","max_tokens":1,"stream":false,"prompt":"`+prompt+`","kv_transfer_params":`+nixlPrefillKV+`}`)
	kv, ok := out["kv_transfer_params"].(map[string]any)
	if !ok || kv["do_remote_prefill"] != true || kv["remote_request_id"] == nil || kv["remote_port"] == nil {
		t.Fatalf("prefill answer %v: want a kv_transfer_params hand-off", out)
	}
	return kv
}

func TestPDNixlHandoffMovesVerifiedKV(t *testing.T) {
	p, d := pdSims(t, "vllm-nixl", nil)
	kv := nixlHandoff(t, p, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
	if kv["remote_host"] != "127.0.0.1" || kv["remote_engine_id"] != "sim-engine" {
		t.Errorf("hand-off %v", kv)
	}
	blocks, _ := kv["remote_block_ids"].([]any)
	if len(blocks) != 3 { // 40 tokens in 16-token blocks
		t.Errorf("remote_block_ids %v: want 3 blocks", kv["remote_block_ids"])
	}
	hand, _ := json.Marshal(kv)
	status, body := d.post(t, "/v1/completions", `{"model":"sim-model","max_tokens":4,"prompt":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","kv_transfer_params":`+string(hand)+`}`)
	if status != 200 {
		t.Fatalf("decode: %d %s", status, body)
	}
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &out); err != nil || out.Usage.CompletionTokens != 4 {
		t.Fatalf("decode answer %s: %v", body, err)
	}
	if n := d.gauge(t, "infera_sim_kv_transfers_total"); n != 1 {
		t.Errorf("infera_sim_kv_transfers_total %v, want 1", n)
	}

	// The same hand-off for another prompt of the same length: the
	// checksum catches it, nothing is decoded.
	status, body = d.post(t, "/v1/completions", `{"model":"sim-model","max_tokens":4,"prompt":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","kv_transfer_params":`+string(hand)+`}`)
	if status != 500 || !strings.Contains(string(body), "checksum") {
		t.Fatalf("mismatched KV: %d %s, want 500 naming the checksum", status, body)
	}
	// A longer prompt than the prefill's: out of range.
	status, body = d.post(t, "/v1/completions", `{"model":"sim-model","max_tokens":4,"prompt":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","kv_transfer_params":`+string(hand)+`}`)
	if status != 500 || !strings.Contains(string(body), "kv transfer failed") {
		t.Fatalf("longer prompt: %d %s", status, body)
	}
}

// TestPDDecodeWithoutKVFailsLoudly: a decode whose KV never comes answers
// 500 at its --pd-kv-timeout instead of decoding without it.
func TestPDDecodeWithoutKVFailsLoudly(t *testing.T) {
	p, d := pdSims(t, "sglang-bootstrap", nil)
	host, port, _ := net.SplitHostPort(p.srv.PDKVAddr())
	start := time.Now()
	status, body := d.post(t, "/v1/completions", `{"model":"sim-model","max_tokens":4,"prompt":"hello","bootstrap_host":"`+host+`","bootstrap_port":`+port+`,"bootstrap_room":12345}`)
	if status != 500 || !strings.Contains(string(body), "no KV room-12345") {
		t.Fatalf("%d %s, want 500: no KV", status, body)
	}
	if el := time.Since(start); el < 250*time.Millisecond || el > 5*time.Second {
		t.Errorf("failed after %v, want about the 300ms --pd-kv-timeout", el)
	}
	// The prefill publishes room 7; its decode then gets it.
	status, body = p.post(t, "/v1/completions", `{"model":"sim-model","max_tokens":4,"stream":true,"prompt":"hello","bootstrap_host":"`+host+`","bootstrap_port":`+port+`,"bootstrap_room":7}`)
	if status != 200 || strings.Contains(string(body), "data:") {
		t.Fatalf("prefill: %d %s, want a unary answer", status, body)
	}
	status, body = d.post(t, "/v1/completions", `{"model":"sim-model","max_tokens":4,"prompt":"hello","bootstrap_host":"`+host+`","bootstrap_port":`+port+`,"bootstrap_room":7}`)
	if status != 200 {
		t.Fatalf("decode: %d %s", status, body)
	}
	// A dead prefill: the decode fails at once.
	pdAddr := p.srv.PDKVAddr()
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	h, pp, _ := net.SplitHostPort(pdAddr)
	status, body = d.post(t, "/v1/completions", `{"model":"sim-model","max_tokens":4,"prompt":"hello","bootstrap_host":"`+h+`","bootstrap_port":`+pp+`,"bootstrap_room":8}`)
	if status != 500 {
		t.Fatalf("dead prefill: %d %s", status, body)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("dead prefill noticed after %v", el)
	}
}

func TestPDFacades(t *testing.T) {
	t.Setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "5601")
	cfg := config.DefaultSim()
	cfg.Flavor = config.FlavorVLLM
	if _, err := ApplyFacade(&cfg, []string{"serve", "m", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_producer","engine_id":"e1"}`}, nil); err != nil {
		t.Fatal(err)
	}
	if cfg.PDRole != "prefill" || cfg.PDProtocol != "vllm-nixl" || cfg.PDEngineID != "e1" || cfg.PDKVPort != 5601 {
		t.Errorf("vllm producer: role %q protocol %q engine %q port %d", cfg.PDRole, cfg.PDProtocol, cfg.PDEngineID, cfg.PDKVPort)
	}
	cfg = config.DefaultSim()
	cfg.Flavor = config.FlavorVLLM
	if _, err := ApplyFacade(&cfg, []string{"serve", "m", "--kv-transfer-config", `{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}`}, nil); err != nil {
		t.Fatal(err)
	}
	if cfg.PDRole != "prefill" || cfg.PDProtocol != "vllm-mooncake" || cfg.PDKVPort != 8998 {
		t.Errorf("vllm mooncake producer: role %q protocol %q port %d", cfg.PDRole, cfg.PDProtocol, cfg.PDKVPort)
	}
	cfg = config.DefaultSim()
	cfg.Flavor = config.FlavorVLLM
	if _, err := ApplyFacade(&cfg, []string{"serve", "m", "--kv-transfer-config", `{"kv_connector":"P2pNcclConnector","kv_role":"kv_consumer"}`}, nil); err == nil {
		t.Error("an unmodelled connector was accepted: the sim would decode without KV")
	}
	cfg = config.DefaultSim()
	cfg.Flavor = config.FlavorATOM
	if _, err := ApplyFacade(&cfg, []string{"--model", "m", "--kv-transfer-config", `{"kv_role":"kv_producer","handshake_port":7001}`}, nil); err != nil {
		t.Fatal(err)
	}
	if cfg.PDRole != "prefill" || cfg.PDProtocol != "atom-mooncake" || cfg.PDKVPort != 7001 {
		t.Errorf("atom producer: role %q protocol %q port %d", cfg.PDRole, cfg.PDProtocol, cfg.PDKVPort)
	}
	for _, tc := range []struct {
		args []string
		role string
		port int
	}{
		{[]string{"--model-path", "m", "--disaggregation-mode", "prefill"}, "prefill", 8998},
		{[]string{"--model-path", "m", "--disaggregation-bootstrap-port", "9100", "--disaggregation-mode", "prefill"}, "prefill", 9100},
		{[]string{"--model-path", "m", "--disaggregation-mode", "decode"}, "decode", 0},
	} {
		cfg = config.DefaultSim()
		cfg.Flavor = config.FlavorSGLang
		if _, err := ApplyFacade(&cfg, tc.args, nil); err != nil {
			t.Fatal(err)
		}
		if cfg.PDRole != tc.role || cfg.PDProtocol != "sglang-bootstrap" || cfg.PDKVPort != tc.port {
			t.Errorf("%v: role %q protocol %q port %d", tc.args, cfg.PDRole, cfg.PDProtocol, cfg.PDKVPort)
		}
	}
}

// FuzzPDClassify: any body and X-Request-Id either classify or fail with
// ErrKVTransfer/a JSON error; a decode's peer is always host:port.
func FuzzPDClassify(f *testing.F) {
	f.Add([]byte(`{"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"h","remote_port":1,"remote_request_id":"r","transfer_id":"t","remote_bootstrap_addr":"http://h:2","remote_handshake_port":3}}`), []byte("___prefill_addr_host:h,handshake:5,notify:6___decode_addr_host:d,handshake:7,notify:8_ab"))
	f.Add([]byte(`{"bootstrap_host":"::1","bootstrap_port":9,"bootstrap_room":18446744073709551615}`), []byte(""))
	f.Add([]byte(`{"kv_transfer_params":null}`), []byte("___prefill_addr_host:,handshake:x"))
	f.Add([]byte(`{"bootstrap_host":"h","bootstrap_port":9,"bootstrap_room":7,"disagg_prefill_dp_rank":3}`), []byte("1"))
	f.Fuzz(func(t *testing.T, body, id []byte) {
		for _, proto := range []string{"vllm-nixl", "vllm-mooncake", "vllm-mori-read", "vllm-mori-write", "sglang-bootstrap", "atom-mooncake"} {
			for _, role := range []string{config.PDRolePrefill, config.PDRoleDecode} {
				p := &pdSide{role: role, protocol: proto, dpSize: 4}
				r, err := p.classify(body, id, id)
				if err != nil {
					continue
				}
				if r.fetchKV {
					if _, _, err := net.SplitHostPort(r.peer); err != nil || r.name == "" {
						t.Fatalf("%s %s: peer %q name %q", proto, role, r.peer, r.name)
					}
				}
			}
		}
	})
}

// postRank posts body with X-Data-Parallel-Rank rank ("" = none).
func (ts *testSim) postRank(t *testing.T, body, rank string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if rank != "" {
		req.Header.Set("X-Data-Parallel-Rank", rank)
	}
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// TestPDSGLangDPRanks: an SGLang prefill with dp_size 4 keeps each
// request's KV on its rank (X-Data-Parallel-Rank, else room % 4) and
// refuses a room not congruent to the rank named; the decode finds the KV
// on disagg_prefill_dp_rank only.
func TestPDSGLangDPRanks(t *testing.T) {
	p, d := pdSims(t, "sglang-bootstrap", func(c *config.Sim) { c.PDDPSize = 4 })
	host, port, _ := net.SplitHostPort(p.srv.PDKVAddr())
	req := func(room int, extra string) string {
		return `{"model":"sim-model","max_tokens":3,"prompt":"hello ranks","bootstrap_host":"` + host + `","bootstrap_port":` + port +
			`,"bootstrap_room":` + strconv.Itoa(room) + extra + `}`
	}
	// Misaligned: room 9 % 4 = 1, the header says rank 2.
	if status, body := p.postRank(t, req(9, ""), "2"); status != 400 || !strings.Contains(string(body), "bootstrap_room 9 % dp_size 4 = 1") {
		t.Fatalf("misaligned room: %d %s, want 400 naming the residue", status, body)
	}
	if status, body := p.postRank(t, req(9, ""), "4"); status != 400 || !strings.Contains(string(body), "below dp_size 4") {
		t.Fatalf("rank 4 of 4: %d %s", status, body)
	}
	// Aligned, pinned: room 10 on rank 2; unpinned: room 7 on rank 3.
	for _, c := range []struct {
		room       int
		rank, want string
	}{{10, "2", "2"}, {7, "", "3"}} {
		if status, body := p.postRank(t, req(c.room, ""), c.rank); status != 200 {
			t.Fatalf("prefill room %d: %d %s", c.room, status, body)
		}
		// The decode told another rank never gets the KV.
		if status, body := d.postRank(t, req(c.room, `,"disagg_prefill_dp_rank":0`), ""); status != 500 || !strings.Contains(string(body), "-dp0") {
			t.Fatalf("decode of room %d on rank 0: %d %s, want 500", c.room, status, body)
		}
		if status, body := d.postRank(t, req(c.room, ""), ""); status != 500 {
			t.Fatalf("decode of room %d told no rank: %d %s, want 500", c.room, status, body)
		}
		if status, body := d.postRank(t, req(c.room, `,"disagg_prefill_dp_rank":`+c.want), ""); status != 200 {
			t.Fatalf("decode of room %d on rank %s: %d %s", c.room, c.want, status, body)
		}
	}
	if n := d.gauge(t, "infera_sim_kv_transfers_total"); n != 2 {
		t.Errorf("infera_sim_kv_transfers_total %v, want 2", n)
	}
	cfg := config.DefaultSim()
	cfg.Flavor = config.FlavorSGLang
	if _, err := ApplyFacade(&cfg, []string{"--model-path", "m", "--disaggregation-mode", "prefill", "--dp-size", "2"}, nil); err != nil {
		t.Fatal(err)
	}
	if cfg.PDDPSize != 2 {
		t.Errorf("facade --dp-size 2: PDDPSize %d", cfg.PDDPSize)
	}
}
