package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/config"
	"github.com/infera/infera/transport"
)

// Disaggregated prefill/decode roles (DESIGN §8, issue 14).
//
// A prefill (--pd-role prefill) runs the prompt of a request that asks
// for a remote decode, computes its KV (kvBytesPerToken deterministic
// bytes per prompt token, a function of the token and its position only,
// as causal attention's KV is) and serves it over transport TCP on
// --pd-kv-port under a name the protocol determines, for --pd-kv-ttl:
//
//   - vllm-nixl: the request has kv_transfer_params.do_remote_decode;
//     the region is named by a fresh id and the unary answer's top-level
//     kv_transfer_params hand it off (remote_engine_id, remote_block_ids,
//     remote_host, remote_port, remote_request_id, tp_size).
//   - vllm-mooncake: the request has kv_transfer_params.do_remote_decode
//     and transfer_id; the region is named by the transfer id, and the
//     decode finds it at remote_bootstrap_addr (the prefill's KV server,
//     on VLLM_MOONCAKE_BOOTSTRAP_PORT) under the same transfer id.
//   - vllm-mori-read / vllm-mori-write: the request has
//     kv_transfer_params.do_remote_decode and transfer_id; the region is
//     named by the transfer id, served on the handshake port, and the
//     decode finds the prefill's host and handshake port in the X-Request-Id
//     the router forged; read mode also hands off (transfer_id,
//     remote_engine_id, remote_block_ids) in its answer. (Write mode's push
//     is simulated as the decode's pull.)
//   - atom-mooncake: the request has kv_transfer_params.do_remote_decode;
//     the region is named by a fresh transfer id that a completions
//     answer hands off (transfer_id, remote_host, remote_port,
//     remote_handshake_port — the KV server —, remote_block_ids,
//     first_token_id, dp_rank); a chat answer carries none, as ATOM's.
//   - sglang-bootstrap: the request has bootstrap_room (and the host and
//     port of the prefill's bootstrap server, this KV server); the region
//     is named room-<room>. A prefill with --pd-dp-size N > 1 (SGLang
//     --dp-size) runs the request on the rank its X-Data-Parallel-Rank
//     names (else room % N), refuses a room not congruent to that rank,
//     and names the region room-<room>-dp<rank>; the decode looks for
//     room-<room>-dp<disagg_prefill_dp_rank> when the body has that
//     field, so a decode told no rank or the wrong one never gets its KV
//     (and fails loudly).
//
// A prefill answers unary even when the request streams (the router
// drains and discards a prefill's answer).
//
// A decode (--pd-role decode) whose request names remote KV (vllm-nixl:
// kv_transfer_params.do_remote_prefill with remote_host/port/request id;
// sglang-bootstrap: bootstrap_host/port/room) fetches it before scheduling
// the request — polling while the prefill has not published it yet, up
// to --pd-kv-timeout — and verifies its checksum against the KV of its own
// tokenization of the prompt; any failure answers 500 and is logged as an
// error, so a broken hand-off fails loudly and never decodes. The fetched
// prompt then costs no prefill compute (the transfer time is part of the
// TTFT). A request that names no remote KV runs whole.
//
// --record-requests FILE appends every completion request (path, role,
// X-Request-Id, X-Data-Parallel-Rank, body) as one JSON line, so tests
// assert the bodies each leg received.
//
// Concurrency: pdSide is shared by the handlers; its TCP engine is safe
// for concurrent use and the timers map is guarded by mu.

// kvBytesPerToken is the simulated KV size of one prompt token.
const kvBytesPerToken = 32

// Errors of the PD roles.
var (
	ErrKVTransfer = errors.New("kv transfer failed")
)

// pdSide is the PD machinery of a prefill or decode sim.
type pdSide struct {
	role, protocol string
	engineID       string
	dpSize         int    // data-parallel ranks (sglang-bootstrap KV per rank)
	host           string // advertised host of the KV server (prefill)
	port           int
	tcp            *transport.TCP

	mu     sync.Mutex
	timers map[*transport.Region]*time.Timer
	closed bool

	// A decode's verified transfers and the time they took (/metrics).
	transfers, transferNs atomic.Int64
}

// startPD starts the PD side of s (nil without a role).
func (s *Server) startPD() (*pdSide, error) {
	cfg := &s.cfg
	if cfg.PDRole == "" {
		return nil, nil
	}
	p := &pdSide{role: cfg.PDRole, protocol: cfg.PDProtocol, engineID: cfg.PDEngineID, dpSize: cfg.PDDPSize, timers: map[*transport.Region]*time.Timer{}}
	tc := transport.TCPConfig{Log: s.log, IOTimeout: cfg.PDKVTimeout}
	if p.role == config.PDRolePrefill {
		host := cfg.PDKVHost
		if host == "" {
			host = cfg.Host
			if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
				host = "127.0.0.1"
			}
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.PDKVPort)))
		if err != nil {
			return nil, fmt.Errorf("pd kv server: %w", err)
		}
		p.host, p.port = host, ln.Addr().(*net.TCPAddr).Port
		tc.Listener, tc.Advertise = ln, net.JoinHostPort(host, strconv.Itoa(p.port))
	}
	t, err := transport.NewTCP(tc)
	if err != nil {
		return nil, fmt.Errorf("pd transport: %w", err)
	}
	p.tcp = t
	return p, nil
}

func (p *pdSide) close() {
	p.mu.Lock()
	p.closed = true
	for _, t := range p.timers {
		t.Stop()
	}
	clear(p.timers)
	p.mu.Unlock()
	_ = p.tcp.Close()
}

// kvOf returns the simulated KV of a prompt.
func kvOf(tokens []uint32, seed uint64) []byte {
	b := make([]byte, 0, len(tokens)*kvBytesPerToken)
	for i, t := range tokens {
		x := seed ^ uint64(t)<<32 ^ uint64(i)*0x9E3779B97F4A7C15
		for range kvBytesPerToken / 8 {
			x += 0x9E3779B97F4A7C15
			z := x
			z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
			z = (z ^ z>>27) * 0x94D049BB133111EB
			b = binary.LittleEndian.AppendUint64(b, z^z>>31)
		}
	}
	return b
}

// pdFields are the PD members of a request body.
type pdFields struct {
	KV *struct {
		DoRemoteDecode  bool   `json:"do_remote_decode"`
		DoRemotePrefill bool   `json:"do_remote_prefill"`
		RemoteHost      string `json:"remote_host"`
		RemotePort      int    `json:"remote_port"`
		RemoteRequestID string `json:"remote_request_id"`
		TransferID      string `json:"transfer_id"`
		BootstrapAddr   string `json:"remote_bootstrap_addr"`
		HandshakePort   int    `json:"remote_handshake_port"`
	} `json:"kv_transfer_params"`
	BootstrapHost string  `json:"bootstrap_host"`
	BootstrapPort int     `json:"bootstrap_port"`
	BootstrapRoom *uint64 `json:"bootstrap_room"`
	PrefillDPRank *int    `json:"disagg_prefill_dp_rank"`
}

// pdRequest is what a PD role does with one request.
type pdRequest struct {
	serveKV  bool   // prefill: publish the prompt's KV under name
	fetchKV  bool   // decode: fetch it from peer/name
	name     string // region name
	peer     string // decode: the prefill's KV server host:port
	nixlResp bool   // prefill: hand off in the answer's kv_transfer_params
	atomResp bool   // prefill: ATOM's hand-off (completions answers only)
	moriResp bool   // prefill: MoRIIO read mode's hand-off
}

// classify reads the PD part of a request (PD roles only); dpRank is its
// X-Data-Parallel-Rank header.
func (p *pdSide) classify(body, requestID, dpRank []byte) (pdRequest, error) {
	var f pdFields
	if err := json.Unmarshal(body, &f); err != nil {
		return pdRequest{}, fmt.Errorf("pd fields: %w", err)
	}
	var r pdRequest
	switch p.protocol {
	case "vllm-nixl":
		if f.KV == nil {
			return r, nil
		}
		switch {
		case p.role == config.PDRolePrefill && f.KV.DoRemoteDecode:
			r.serveKV, r.nixlResp = true, true
			r.name = fmt.Sprintf("nixl-%016x%016x", rand.Uint64(), rand.Uint64())
		case p.role == config.PDRoleDecode && f.KV.DoRemotePrefill:
			if f.KV.RemoteHost == "" || f.KV.RemotePort <= 0 || f.KV.RemoteRequestID == "" {
				return r, fmt.Errorf("%w: kv_transfer_params lacks remote_host, remote_port or remote_request_id", ErrKVTransfer)
			}
			r.fetchKV, r.name = true, f.KV.RemoteRequestID
			r.peer = net.JoinHostPort(f.KV.RemoteHost, strconv.Itoa(f.KV.RemotePort))
		}
	case "vllm-mooncake":
		if f.KV == nil || f.KV.TransferID == "" {
			return r, nil
		}
		r.name = f.KV.TransferID
		switch {
		case p.role == config.PDRolePrefill && f.KV.DoRemoteDecode:
			r.serveKV = true
		case p.role == config.PDRoleDecode && f.KV.DoRemotePrefill:
			peer := strings.TrimPrefix(strings.TrimPrefix(f.KV.BootstrapAddr, "http://"), "https://")
			if _, _, err := net.SplitHostPort(peer); err != nil {
				return r, fmt.Errorf("%w: kv_transfer_params.remote_bootstrap_addr %q: %w", ErrKVTransfer, f.KV.BootstrapAddr, err)
			}
			r.fetchKV, r.peer = true, peer
		}
	case "vllm-mori-read", "vllm-mori-write":
		if f.KV == nil || f.KV.TransferID == "" {
			return r, nil
		}
		r.name = f.KV.TransferID
		switch {
		case p.role == config.PDRolePrefill && f.KV.DoRemoteDecode:
			r.serveKV, r.moriResp = true, p.protocol == "vllm-mori-read"
		case p.role == config.PDRoleDecode && f.KV.DoRemotePrefill:
			peer, err := moriPrefillPeer(string(requestID))
			if err != nil {
				return r, err
			}
			r.fetchKV, r.peer = true, peer
		}
	case "atom-mooncake":
		if f.KV == nil {
			return r, nil
		}
		switch {
		case p.role == config.PDRolePrefill && f.KV.DoRemoteDecode:
			r.serveKV, r.atomResp = true, true
			r.name = fmt.Sprintf("atom-%016x%016x", rand.Uint64(), rand.Uint64())
		case p.role == config.PDRoleDecode && f.KV.TransferID != "":
			if f.KV.RemoteHost == "" || f.KV.HandshakePort <= 0 {
				return r, fmt.Errorf("%w: kv_transfer_params lacks remote_host or remote_handshake_port", ErrKVTransfer)
			}
			r.fetchKV, r.name = true, f.KV.TransferID
			r.peer = net.JoinHostPort(f.KV.RemoteHost, strconv.Itoa(f.KV.HandshakePort))
		}
	case "sglang-bootstrap":
		if f.BootstrapRoom == nil {
			return r, nil
		}
		room := *f.BootstrapRoom
		r.name = "room-" + strconv.FormatUint(room, 10)
		if p.role == config.PDRolePrefill {
			r.serveKV = true
			if p.dpSize > 1 {
				rank, err := p.prefillRank(room, dpRank)
				if err != nil {
					return pdRequest{}, err
				}
				r.name += "-dp" + strconv.Itoa(rank)
			}
		} else {
			if f.PrefillDPRank != nil {
				if *f.PrefillDPRank < 0 || *f.PrefillDPRank >= maxDPRanks {
					return r, fmt.Errorf("%w: disagg_prefill_dp_rank %d: want 0..%d", ErrKVTransfer, *f.PrefillDPRank, maxDPRanks-1)
				}
				r.name += "-dp" + strconv.Itoa(*f.PrefillDPRank)
			}
			if f.BootstrapHost == "" || f.BootstrapPort <= 0 {
				return r, fmt.Errorf("%w: bootstrap_room without bootstrap_host/bootstrap_port", ErrKVTransfer)
			}
			r.fetchKV = true
			r.peer = net.JoinHostPort(f.BootstrapHost, strconv.Itoa(f.BootstrapPort))
		}
	}
	if r.fetchKV {
		if h, _, err := net.SplitHostPort(r.peer); err != nil || h == "" || strings.ContainsAny(h, "[]/ ") {
			return pdRequest{}, fmt.Errorf("%w: prefill address %q is not host:port", ErrKVTransfer, r.peer)
		}
	}
	return r, nil
}

// prefillRank is the DP rank of an sglang-bootstrap prefill with several
// that takes a request of room: the one X-Data-Parallel-Rank names, else
// room % dp_size, as SGLang's data-parallel controller dispatches PD
// requests. A named rank must be one of the engine's and congruent to the
// room, else the request is refused: a decode that computes the prefill's
// rank from the room would wait for KV on another rank.
func (p *pdSide) prefillRank(room uint64, header []byte) (int, error) {
	n := uint64(p.dpSize)
	if len(header) == 0 {
		return int(room % n), nil
	}
	rank, ok := parseDPRank(header)
	if !ok || rank >= p.dpSize {
		return 0, fmt.Errorf("%w: X-Data-Parallel-Rank %q: want a rank below dp_size %d", ErrKVTransfer, header, p.dpSize)
	}
	if room%n != uint64(rank) {
		return 0, fmt.Errorf("%w: bootstrap_room %d %% dp_size %d = %d, not the X-Data-Parallel-Rank %d: the decode would look for the KV on another rank",
			ErrKVTransfer, room, n, room%n, rank)
	}
	return rank, nil
}

// publish serves kv under name for the TTL.
func (p *pdSide) publish(name string, kv []byte, ttl time.Duration) error {
	reg, err := p.tcp.Register(name, kv)
	if err != nil {
		return fmt.Errorf("publish kv %s: %w", name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.timers[reg] = time.AfterFunc(ttl, func() {
		p.mu.Lock()
		delete(p.timers, reg)
		p.mu.Unlock()
		_ = p.tcp.Deregister(reg)
	})
	return nil
}

// fetch reads the region name from peer into a buffer as long as want and
// checks it equals want (by checksum). It polls while the region is not
// there yet, until ctx ends.
func (p *pdSide) fetch(ctx context.Context, peer, name string, want []byte) error {
	if len(want) == 0 {
		return fmt.Errorf("%w: empty prompt", ErrKVTransfer)
	}
	local, err := p.tcp.Register(fmt.Sprintf("dst-%016x", rand.Uint64()), make([]byte, len(want)))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrKVTransfer, err)
	}
	defer func() { _ = p.tcp.Deregister(local) }()
	remote := transport.Desc{Peer: peer, Name: name, Len: uint64(len(want))}
	ops := []transport.Op{{Kind: transport.Read, Local: local, Remote: remote, Len: remote.Len}}
	for {
		err := transport.Transfer(ctx, p.tcp, ops)
		if err == nil {
			break
		}
		if ctx.Err() != nil || errors.Is(err, transport.ErrTimeout) {
			return fmt.Errorf("%w: no KV %s from %s in time (last try: %w)", ErrKVTransfer, name, peer, err)
		}
		if !errors.Is(err, transport.ErrNotFound) {
			return fmt.Errorf("%w: read %s from %s: %w", ErrKVTransfer, name, peer, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: no KV %s from %s: %w", ErrKVTransfer, name, peer, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	if got, exp := xxhash.Sum64(local.Bytes()), xxhash.Sum64(want); got != exp {
		return fmt.Errorf("%w: KV %s from %s: checksum %016x, want %016x (the prefill computed another prompt)", ErrKVTransfer, name, peer, got, exp)
	}
	return nil
}

// nixlHandoff renders the kv_transfer_params of a vLLM Nixl prefill's
// answer.
func (p *pdSide) nixlHandoff(name string, blocks int) []byte {
	b := []byte(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[`)
	for i := range blocks {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(i), 10)
	}
	b = append(b, `],"remote_engine_id":`...)
	b = appendJSONString(b, []byte(p.engineID))
	b = append(b, `,"remote_host":`...)
	b = appendJSONString(b, []byte(p.host))
	b = append(b, `,"remote_port":`...)
	b = strconv.AppendInt(b, int64(p.port), 10)
	b = append(b, `,"remote_request_id":`...)
	b = appendJSONString(b, []byte(name))
	return append(b, `,"tp_size":1}`...)
}

// moriPrefillPeer reads the prefill's host and handshake port (its KV
// server) from the X-Request-Id the router forged for MoRIIO:
// ___prefill_addr_host:H,handshake:P,notify:N___decode_addr_host:…
func moriPrefillPeer(id string) (string, error) {
	rest, ok := strings.CutPrefix(id, "___prefill_addr_host:")
	host, rest, ok2 := strings.Cut(rest, ",handshake:")
	port, _, ok3 := strings.Cut(rest, ",notify:")
	if !ok || !ok2 || !ok3 || host == "" {
		return "", fmt.Errorf("%w: X-Request-Id %q does not name the prefill (MoRIIO)", ErrKVTransfer, id)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("%w: X-Request-Id %q: bad handshake port", ErrKVTransfer, id)
	}
	return net.JoinHostPort(host, port), nil
}

// moriHandoff renders a MoRIIO read-mode prefill's kv_transfer_params.
func (p *pdSide) moriHandoff(name string, blocks int) []byte {
	b := []byte(`{"do_remote_prefill":true,"do_remote_decode":false,"transfer_id":`)
	b = appendJSONString(b, []byte(name))
	b = append(b, `,"remote_engine_id":`...)
	b = appendJSONString(b, []byte(p.engineID))
	b = append(b, `,"remote_block_ids":[`...)
	for i := range blocks {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(i), 10)
	}
	b = append(b, `],"remote_host":`...)
	b = appendJSONString(b, []byte(p.host))
	b = append(b, `,"remote_port":`...)
	b = strconv.AppendInt(b, int64(p.port), 10)
	return append(b, '}')
}

// atomHandoff renders the kv_transfer_params of an ATOM prefill's
// completions answer.
func (p *pdSide) atomHandoff(name string, blocks, httpPort int, first uint32) []byte {
	b := []byte(`{"transfer_id":`)
	b = appendJSONString(b, []byte(name))
	b = append(b, `,"remote_host":`...)
	b = appendJSONString(b, []byte(p.host))
	b = append(b, `,"remote_port":`...)
	b = strconv.AppendInt(b, int64(httpPort), 10)
	b = append(b, `,"remote_handshake_port":`...)
	b = strconv.AppendInt(b, int64(p.port), 10)
	b = append(b, `,"remote_block_ids":[`...)
	for i := range blocks {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(i), 10)
	}
	b = append(b, `],"first_token_id":`...)
	b = strconv.AppendUint(b, uint64(first), 10)
	return append(b, `,"dp_rank":0}`...)
}

// requestLog appends received requests to --record-requests.
type requestLog struct {
	mu sync.Mutex
	f  *os.File
}

func openRequestLog(path string) (*requestLog, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("record requests: %w", err)
	}
	return &requestLog{f: f}, nil
}

// record writes one request as a JSON line; body is valid JSON.
func (l *requestLog) record(ctx *fasthttp.RequestCtx, role string, body []byte) {
	b := append([]byte(`{"path":`), appendJSONString(nil, ctx.Path())...)
	b = append(b, `,"role":`...)
	b = appendJSONString(b, []byte(role))
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, ctx.Request.Header.Peek("X-Request-Id"))
	b = append(b, `,"dp_rank":`...)
	b = appendJSONString(b, ctx.Request.Header.Peek("X-Data-Parallel-Rank"))
	b = append(b, `,"traceparent":`...)
	b = appendJSONString(b, ctx.Request.Header.Peek("traceparent"))
	b = append(b, `,"body":`...)
	var compact bytes.Buffer
	if json.Compact(&compact, body) == nil {
		b = append(b, compact.Bytes()...)
	} else {
		b = appendJSONString(b, body)
	}
	b = append(b, "}\n"...)
	l.mu.Lock()
	_, _ = l.f.Write(b)
	l.mu.Unlock()
}

func (l *requestLog) close() {
	if l != nil {
		_ = l.f.Close()
	}
}

// fetchKV fetches and verifies the remote KV a decode request names; on
// failure it answers 500 and reports false.
func (s *Server) fetchKV(ctx *fasthttp.RequestCtx, q *seq, r *pdRequest) bool {
	start := time.Now()
	want := kvOf(q.tokens[:q.promptLen], s.seed)
	fctx, cancel := context.WithTimeout(context.Background(), s.cfg.PDKVTimeout)
	defer cancel()
	// The wait ends early when the client (the router, which aborts a
	// decode whose prefill failed) goes away, or the engine stops.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if c := ctx.Conn(); c != nil {
		wg.Go(func() { s.watchGone(c, stop, cancel) })
	}
	err := s.pd.fetch(fctx, r.peer, r.name, want)
	close(stop)
	if c := ctx.Conn(); c != nil {
		// Wake watchGone's read now: it sees stop only between reads, and
		// waiting out its 20 ms deadline added up to 20 ms to every decode.
		_ = c.SetReadDeadline(time.Now())
	}
	wg.Wait()
	if c := ctx.Conn(); c != nil {
		_ = c.SetReadDeadline(time.Time{})
	}
	if err != nil {
		s.log.Error().Err(err).Str("peer", r.peer).Str("kv", r.name).Msg("decode did not receive its KV: refusing to decode")
		s.writeError(ctx, fasthttp.StatusInternalServerError, err.Error())
		return false
	}
	q.remote = true
	s.pd.transfers.Add(1)
	s.pd.transferNs.Add(int64(time.Since(start)))
	s.log.Debug().Str("peer", r.peer).Str("kv", r.name).Int("bytes", len(want)).
		Float64("transfer_s", time.Since(start).Seconds()).Msg("kv received and verified")
	return true
}

// watchGone calls cancel when the client of c goes away or the server
// closes, until stop is closed.
func (s *Server) watchGone(c net.Conn, stop <-chan struct{}, cancel context.CancelFunc) {
	var b [1]byte
	for {
		select {
		case <-stop:
			return
		case <-s.closing:
			cancel()
			return
		default:
		}
		if err := c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
			cancel()
			return
		}
		// fetchKV closes stop, then sets a past deadline: stop checked after
		// this deadline was set, either this sees it closed or the read
		// wakes at once.
		select {
		case <-stop:
			return
		default:
		}
		_, err := c.Read(b[:])
		var ne net.Error
		if err != nil && errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		cancel()
		return
	}
}

// serveKV publishes a prefill request's KV; on failure it answers 500 and
// reports false.
func (s *Server) serveKV(ctx *fasthttp.RequestCtx, q *seq, r *pdRequest, chat bool) bool {
	if err := s.pd.publish(r.name, kvOf(q.tokens[:q.promptLen], s.seed), s.cfg.PDKVTTL); err != nil {
		s.log.Error().Err(err).Msg("prefill could not publish its KV")
		s.writeError(ctx, fasthttp.StatusInternalServerError, err.Error())
		return false
	}
	blocks := (q.promptLen + s.cfg.BlockSize - 1) / s.cfg.BlockSize
	switch {
	case r.nixlResp:
		q.kvParams = s.pd.nixlHandoff(r.name, blocks)
	case r.moriResp:
		q.kvParams = s.pd.moriHandoff(r.name, blocks)
	case r.atomResp && !chat:
		var first uint32
		if len(q.tokens) > q.promptLen {
			first = q.tokens[q.promptLen]
		}
		q.kvParams = s.pd.atomHandoff(r.name, blocks, s.cfg.Port, first)
	}
	return true
}

// appendPDMetrics appends a PD role's KV-transfer counters (every
// flavor's /metrics).
func (s *Server) appendPDMetrics(b []byte) []byte {
	pd := s.pd
	if pd == nil {
		return b
	}
	b = s.appendMetric(b, "infera_sim_kv_transfers_total", "counter",
		"KV hand-offs this decode received and verified (PD roles).", float64(pd.transfers.Load()))
	return s.appendMetric(b, "infera_sim_kv_transfer_seconds_total", "counter",
		"Time this decode spent receiving KV (PD roles), part of its requests' TTFT.", float64(pd.transferNs.Load())/1e9)
}

// PDKVAddr is the host:port of a prefill's KV server once Serve runs
// ("" otherwise).
func (s *Server) PDKVAddr() string {
	p := s.pdp.Load()
	if p == nil || p.port == 0 {
		return ""
	}
	return net.JoinHostPort(p.host, strconv.Itoa(p.port))
}
