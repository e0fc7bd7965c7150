package router

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/openai"
)

// The PD protocols of DESIGN §6 as the router speaks them: how each leg's
// body is shaped for the engines' KV connectors (the exact shapes are in
// shared/protocols/pd.md) and whether the legs run at once or one after
// the other.

// pdTopology says how the two legs of a protocol run.
type pdTopology uint8

const (
	// pdConcurrent: both legs are sent at once; the client reads decode,
	// the prefill answer is drained and discarded. The engines pair up
	// on their own (bootstrap room, transfer id).
	pdConcurrent pdTopology = iota
	// pdSerial: the prefill runs first; its JSON answer carries the
	// hand-off (kv_transfer_params) the decode leg gets.
	pdSerial
)

// pdLegs is what a protocol needs to shape one request's two bodies.
type pdLegs struct {
	body          []byte            // the client's body (or the dialect's translation)
	prefill       *discovery.Record // the picked workers' records
	decode        *discovery.Record
	room          uint64 // bootstrap room / transfer id, DP-aligned
	prefillDPRank int    // the prefill DP rank the room is aligned to
	prefillDPSize int
	// requestID is the X-Request-Id both legs get instead of the
	// request's own ("": keep it); MoRIIO forges one naming both peers.
	requestID string
	// transferID is the transfer id both legs share (MoRIIO).
	transferID string
	// prefillHost and decodeHost are the workers' URL hosts.
	prefillHost, decodeHost string
	// hints, when set, is the client's request as scanned: each leg's body
	// gets its worker's cache hints (pdCacheHints) in the protocol's pass.
	hints *openai.Request
	// handoffValid says the hand-off was read from the prefill's answer,
	// which validated it (topLevelField): the decode leg need not again.
	handoffValid bool
	// out, when set, is the relay's pooled scratch the leg being shaped is
	// written into, so that a request's bodies allocate nothing once its
	// buffers have grown; nil: new ones.
	out *pdScratch
	// walk, when set, keeps the walk of the first leg body edited in the
	// pooled scratch (the client's body, for most protocols), so that the
	// other leg's edits of the same body are spliced from its members'
	// spans without walking it again (jsonx.SetFieldsWalk). It is Reset
	// for each pair's legs (shapeLegs).
	walk *jsonx.Walk
}

// pdScratch is one leg's pooled body buffer and edit lists (relay.legs):
// an edit list handed to the body editor escapes, so one on the stack
// would be allocated every leg.
type pdScratch struct {
	body           []byte
	kv             []byte // the leg's kv_transfer_params with its hint (vLLM)
	values         []byte // the leg's edits' values written out (SGLang's)
	fields, hinted [pdMaxFields]jsonx.Field
}

// rawString is s's bytes as a slice, without a copy, for a jsonx.Field
// value: the body editor only reads them (a []byte(s) conversion there
// allocates, the fields escaping).
func rawString(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// badHandoff reports whether a serial prefill's hand-off is not a JSON
// object.
func (l *pdLegs) badHandoff(handoff []byte) bool {
	return len(handoff) == 0 || handoff[0] != '{' || (!l.handoffValid && jsonx.Valid(handoff, maxEditDepth) != nil)
}

// pdProtocol shapes the legs of one protocol.
type pdProtocol struct {
	name     string
	index    int // in pdProtocols' order: its cached series (pdMetrics.served)
	topology pdTopology
	// prefillBody returns the prefill leg's body.
	prefillBody func(l *pdLegs) ([]byte, error)
	// decodeBody returns the decode leg's body; handoff is the prefill
	// answer's kv_transfer_params (raw JSON) of a serial protocol.
	decodeBody func(l *pdLegs, handoff []byte) ([]byte, error)
	// prepare, when set, fills the legs' request id and transfer id
	// before the bodies are shaped.
	prepare func(l *pdLegs) error
}

// pdProtocols are the protocols built so far, by disagg_meta.protocol.
var pdProtocols = map[string]*pdProtocol{
	discovery.ProtocolVLLMNixl:        {name: discovery.ProtocolVLLMNixl, index: 0, topology: pdSerial, prefillBody: nixlPrefill, decodeBody: nixlDecode},
	discovery.ProtocolSGLangBootstrap: {name: discovery.ProtocolSGLangBootstrap, index: 1, topology: pdConcurrent, prefillBody: sglangPrefill, decodeBody: sglangDecode},
	discovery.ProtocolVLLMMooncake:    {name: discovery.ProtocolVLLMMooncake, index: 2, topology: pdConcurrent, prefillBody: mooncakePrefill, decodeBody: mooncakeDecode},
	discovery.ProtocolATOMMooncake:    {name: discovery.ProtocolATOMMooncake, index: 3, topology: pdSerial, prefillBody: atomPrefill, decodeBody: atomDecode},
	discovery.ProtocolVLLMMoriRead:    {name: discovery.ProtocolVLLMMoriRead, index: 4, topology: pdSerial, prefillBody: moriPrefill, decodeBody: moriReadDecode, prepare: moriPrepareRead},
	discovery.ProtocolVLLMMoriWrite:   {name: discovery.ProtocolVLLMMoriWrite, index: 5, topology: pdConcurrent, prefillBody: moriPrefill, decodeBody: moriWriteDecode, prepare: moriPrepareWrite},
}

// numPDProtocols is len(pdProtocols).
const numPDProtocols = 6

// pdSupported lists the protocols built, for error messages.
const pdSupported = discovery.ProtocolVLLMNixl + ", " + discovery.ProtocolSGLangBootstrap + ", " + discovery.ProtocolVLLMMooncake + ", " +
	discovery.ProtocolATOMMooncake + ", " + discovery.ProtocolVLLMMoriRead + ", " + discovery.ProtocolVLLMMoriWrite

// Sentinel errors of the PD path.
var (
	// ErrPDProtocol: the legs' protocols are missing, differ or are not
	// built; the request is refused (500) before any leg is sent.
	ErrPDProtocol = errors.New("router: protocol resolution failed")
	// ErrPDHandoff: a serial prefill answered without the hand-off the
	// decode leg needs (502).
	ErrPDHandoff = errors.New("router: prefill answer has no kv_transfer_params")
	// ErrPDMeta: a worker's disagg_meta lacks a parameter its protocol
	// needs (500: a registration mistake, not a transient fault).
	ErrPDMeta = errors.New("router: disagg_meta incomplete")
)

// resolvePDProtocol returns the protocol both workers speak.
func resolvePDProtocol(p, d *Worker) (*pdProtocol, error) {
	pp, dp := p.Record().DisaggMeta.Protocol, d.Record().DisaggMeta.Protocol
	switch {
	case pp == "" || dp == "" || pp != dp:
		return nil, fmt.Errorf("%w: prefill worker %s speaks %q, decode worker %s speaks %q", ErrPDProtocol, p.id, pp, d.id, dp)
	}
	proto := pdProtocols[pp]
	if proto == nil {
		return nil, fmt.Errorf("%w: protocol %q of prefill worker %s and decode worker %s is not supported by this router (supported: %s)",
			ErrPDProtocol, pp, p.id, d.id, pdSupported)
	}
	return proto, nil
}

// maxEditDepth bounds the JSON nesting the body editor accepts.
const maxEditDepth = 64

// setFields applies kv pairs of top-level edits in one pass (keys
// distinct); a nil value deletes the key.
func setFields(body []byte, kv ...any) ([]byte, error) {
	var buf [pdMaxFields]jsonx.Field
	fields, err := appendFields(buf[:0], kv)
	if err != nil {
		return nil, err
	}
	return editFields(body, fields)
}

// existing is a setFields value (raw JSON) set only where the body has the
// member already: none is added (jsonx.Field.Existing).
type existing string

// pdMaxFields bounds the edits of one leg's body: a protocol's and the
// cache hints'.
const pdMaxFields = 12

// appendFields appends kv pairs to fields as jsonx edits.
func appendFields(fields []jsonx.Field, kv []any) ([]jsonx.Field, error) {
	for i := 0; i+1 < len(kv); i += 2 {
		key := kv[i].(string)
		switch v := kv[i+1].(type) {
		case nil:
			fields = append(fields, jsonx.Field{Key: key})
		case []byte:
			fields = append(fields, jsonx.Field{Key: key, Value: v})
		case string:
			fields = append(fields, jsonx.Field{Key: key, Value: rawString(v)})
		case existing:
			fields = append(fields, jsonx.Field{Key: key, Value: rawString(string(v)), Existing: true})
		default:
			// Every caller is in this package and passes literal pairs;
			// another type is a programming error, not an input.
			panic("router: setFields invariant broken: the value for field " + key + " must be nil (delete), []byte, string or existing (raw JSON)")
		}
	}
	return fields, nil
}

// editFields applies fields to body in one pass (body as is when there
// are none); an error names the first key, which the edits one after the
// other would have failed on.
func editFields(body []byte, fields []jsonx.Field) ([]byte, error) {
	return appendEdited(nil, body, fields, nil)
}

// appendEdited is editFields writing into dst (its bytes overwritten),
// with body's walk kept in walk (nil: none; jsonx.SetFieldsWalk).
func appendEdited(dst, body []byte, fields []jsonx.Field, walk *jsonx.Walk) ([]byte, error) {
	if len(fields) == 0 {
		return body, nil
	}
	out, err := jsonx.SetFieldsWalk(dst[:0], body, fields, maxEditDepth, walk)
	if err != nil {
		return nil, fmt.Errorf("edit %s: %w", fields[0].Key, err)
	}
	return out, nil
}

// edit is editFields into the leg's pooled buffer, when it has one.
func (l *pdLegs) edit(body []byte, fields []jsonx.Field) ([]byte, error) {
	if l.out == nil {
		return editFields(body, fields)
	}
	out, err := appendEdited(l.out.body, body, fields, l.walk)
	if err == nil && len(fields) > 0 {
		l.out.body = out
	}
	return out, err
}

// shape applies a leg's top-level edits (kv pairs, as setFields) to body
// for the worker rec, with its engine's cache hints (pdCacheHints) folded
// into the same pass when l.hints is set.
func (l *pdLegs) shape(body []byte, rec *discovery.Record, kv ...any) ([]byte, error) {
	var fbuf, hbuf []jsonx.Field
	var kvBuf *[]byte
	if l.out != nil {
		fbuf, hbuf, kvBuf = l.out.fields[:0], l.out.hinted[:0], &l.out.kv
	}
	fields, err := appendFields(fbuf, kv)
	if err != nil {
		return nil, err
	}
	if l.hints == nil || rec == nil {
		return l.edit(body, fields)
	}
	hinted, ok, err := pdHintFields(append(hbuf, fields...), l.body, l.hints, rec.Engine, kvBuf)
	if err != nil {
		return nil, err
	}
	if ok {
		return l.edit(body, hinted)
	}
	// The hints edit a member the protocol left as it was (or set twice):
	// the body first, then the hints on it.
	out, err := editFields(body, fields)
	if err != nil {
		return nil, err
	}
	return pdCacheHints(out, l.body, l.hints, rec.Engine)
}

// vllmPrefillBody is vLLM's single-token prefill body: max_tokens 1,
// stream false, no stream_options, max_completion_tokens 1 if present.
func vllmPrefillBody(l *pdLegs, kvParams string) ([]byte, error) {
	return l.shape(l.body, l.prefill, "max_tokens", "1", "stream", "false", "stream_options", nil,
		"max_completion_tokens", existing("1"), "kv_transfer_params", kvParams)
}

const nixlPrefillParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

func nixlPrefill(l *pdLegs) ([]byte, error) { return vllmPrefillBody(l, nixlPrefillParams) }

// nixlPrefillHinted is nixlPrefillParams with each retention class's
// infera_retention added, as pdHintFields' SetFieldValid writes it: the
// protocol's constant hinted once here, not on every request (~1,300
// instructions a request).
var nixlPrefillHinted = func() (h [len(retentionValue)][]byte) {
	for r, v := range retentionValue {
		if v != nil {
			h[r], _ = jsonx.SetFieldValid(nil, rawString(nixlPrefillParams), "infera_retention", v, maxEditDepth)
		}
	}
	return h
}()

// isConst reports whether b is s's own bytes (rawString(s)): a field
// value that is a protocol's constant.
func isConst(b []byte, s string) bool {
	return len(b) == len(s) && unsafe.SliceData(b) == unsafe.StringData(s)
}

// nixlDecode: the client's body (max_tokens as sent) plus the prefill's
// kv_transfer_params verbatim.
func nixlDecode(l *pdLegs, handoff []byte) ([]byte, error) {
	if l.badHandoff(handoff) {
		return nil, ErrPDHandoff
	}
	return l.shape(l.body, l.decode, "kv_transfer_params", handoff)
}

// mooncakeTransferID is "xfer-" + the room as 32 lowercase hex digits.
func mooncakeTransferID(room uint64) string { return roomTransferID("xfer-", room) }

// roomTransferID is prefix + the room as 32 lowercase hex digits (fmt's
// %032x: sixteen zeros, then the room's sixteen digits by words, hexWord;
// one allocation).
func roomTransferID(prefix string, room uint64) string {
	var buf [8 + 32]byte
	b := append(buf[:0], prefix...)
	b = append(b, "0000000000000000"...)
	b = binary.BigEndian.AppendUint64(b, hexWord(uint32(room>>32)))
	return string(binary.BigEndian.AppendUint64(b, hexWord(uint32(room))))
}

func mooncakePrefill(l *pdLegs) ([]byte, error) {
	kv := `{"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":"` + mooncakeTransferID(l.room) + `"}`
	return vllmPrefillBody(l, kv)
}

// mooncakeDecode: the body with max_tokens (and max_completion_tokens)
// decremented, and the prefill's bootstrap address, engine id (with the
// prefill's DP rank when it has several) and the shared transfer id.
func mooncakeDecode(l *pdLegs, _ []byte) ([]byte, error) {
	params := l.prefill.DisaggMeta.Params
	addr, _ := params["bootstrap_addr"].(string)
	engineID, _ := params["engine_id"].(string)
	if addr == "" || engineID == "" {
		return nil, fmt.Errorf("%w: prefill worker %s needs params.bootstrap_addr and params.engine_id for %s", ErrPDMeta, l.prefill.WorkerID, discovery.ProtocolVLLMMooncake)
	}
	if l.prefillDPSize > 1 {
		engineID += "_dp" + strconv.Itoa(l.prefillDPRank)
	}
	body, err := decrementTokens(l.body)
	if err != nil {
		return nil, err
	}
	kv := `{"do_remote_decode":false,"do_remote_prefill":true,"remote_bootstrap_addr":` + string(jsonx.AppendQuoted(nil, addr)) +
		`,"remote_engine_id":` + string(jsonx.AppendQuoted(nil, engineID)) + `,"transfer_id":"` + mooncakeTransferID(l.room) + `"}`
	return l.shape(body, l.decode, "kv_transfer_params", kv)
}

// decrementTokens lowers integer max_tokens and max_completion_tokens by
// one (at least 1): the prefill leg produced the first token.
func decrementTokens(body []byte) ([]byte, error) {
	for _, key := range []string{"max_tokens", "max_completion_tokens"} {
		v := topLevelField(body, key)
		n, ok := jsonx.ParseInt(v)
		if v == nil || !ok {
			continue
		}
		var err error
		if body, err = setFields(body, key, strconv.FormatInt(max(1, n-1), 10)); err != nil {
			return nil, err
		}
	}
	return body, nil
}

// intParam renders an integer parameter of a record's disagg_meta (JSON
// numbers decode as float64), def when absent.
func intParam(rec *discovery.Record, key string, def int) string {
	var b [24]byte
	return string(appendIntParam(b[:0], rec, key, def))
}

// appendIntParam appends intParam's digits to dst (no allocation when dst
// has room).
func appendIntParam(dst []byte, rec *discovery.Record, key string, def int) []byte {
	switch v := rec.DisaggMeta.Params[key].(type) {
	case float64:
		return strconv.AppendInt(dst, int64(v), 10)
	case int:
		return strconv.AppendInt(dst, int64(v), 10)
	case json.Number:
		return append(dst, v...)
	}
	return strconv.AppendInt(dst, int64(def), 10)
}

// atomPrefill: ATOM's single-token prefill, told where the decode is.
func atomPrefill(l *pdLegs) ([]byte, error) {
	d := l.decode
	host, _ := d.DisaggMeta.Params["host"].(string)
	if host == "" {
		return nil, fmt.Errorf("%w: decode worker %s needs params.host for %s", ErrPDMeta, d.WorkerID, discovery.ProtocolATOMMooncake)
	}
	kv := `{"remote_dp_size":` + intParam(d, "dp_size", 1) + `,"remote_tp_size":` + intParam(d, "tp_size", 1) +
		`,"do_remote_decode":true,"do_remote_prefill":false,"remote_handshake_port":` + intParam(d, "handshake_port", 6301) +
		`,"remote_engine_id":null,"remote_block_ids":null,"remote_host":` + string(jsonx.AppendQuoted(nil, host)) +
		`,"remote_port":` + intParam(d, "http_port", 0) + `}`
	return vllmPrefillBody(l, kv)
}

// atomDecode: the client's body unchanged (ATOM re-predicts the first
// token) with the prefill's hand-off plus the prefill's DP and TP sizes.
func atomDecode(l *pdLegs, handoff []byte) ([]byte, error) {
	if l.badHandoff(handoff) || topLevelField(handoff, "transfer_id") == nil {
		return nil, fmt.Errorf("%w (or it has no transfer_id)", ErrPDHandoff)
	}
	p := l.prefill
	tp := intParam(p, "tp_size", 1)
	kv, err := setFields(handoff, "remote_dp_size", intParam(p, "dp_size", 1), "remote_tp_size", tp)
	if err != nil {
		return nil, err
	}
	if topLevelField(kv, "tp_size") == nil {
		if kv, err = setFields(kv, "tp_size", tp); err != nil {
			return nil, err
		}
	}
	if r := topLevelField(handoff, "dp_rank"); r != nil {
		if _, ok := jsonx.ParseInt(r); ok {
			if kv, err = setFields(kv, "remote_dp_rank", r); err != nil {
				return nil, err
			}
		}
	}
	return l.shape(l.body, l.decode, "kv_transfer_params", kv)
}

// moriPorts returns a MoRIIO worker's handshake and notify ports and TP
// size from params.kv_connector_extra_config.
func moriPorts(rec *discovery.Record) (hp, np string, tp string, err error) {
	sub, err := moriExtra(rec)
	if err != nil {
		return "", "", "", err
	}
	return intParam(&sub, "handshake_port", 0), intParam(&sub, "notify_port", 0), intParam(&sub, "tp_size", 1), nil
}

// moriExtra returns a MoRIIO worker's params.kv_connector_extra_config as
// a record of its own (for intParam), checked for the two ports.
func moriExtra(rec *discovery.Record) (discovery.Record, error) {
	extra, _ := rec.DisaggMeta.Params["kv_connector_extra_config"].(map[string]any)
	if extra["handshake_port"] == nil || extra["notify_port"] == nil {
		return discovery.Record{}, fmt.Errorf("%w: worker %s needs kv_connector_extra_config.handshake_port and notify_port for MoRIIO", ErrPDMeta, rec.WorkerID)
	}
	return discovery.Record{DisaggMeta: discovery.DisaggMeta{Params: extra}}, nil
}

// moriRequestID forges the X-Request-Id vLLM's MoRIIO connector parses
// both peers' addresses from; the id is built in one buffer, so its string
// is the one allocation (hosts permitting).
func moriRequestID(l *pdLegs) (string, error) {
	p, err := moriExtra(l.prefill)
	if err != nil {
		return "", err
	}
	d, err := moriExtra(l.decode)
	if err != nil {
		return "", err
	}
	var buf [192]byte
	b := append(buf[:0], "___prefill_addr_host:"...)
	b = appendMoriAddr(b, l.prefillHost, &p)
	b = append(b, "___decode_addr_host:"...)
	b = appendMoriAddr(b, l.decodeHost, &d)
	b = append(b, '_')
	b = appendUUID4(b, false)
	return string(b), nil
}

// appendMoriAddr appends "host,handshake:port,notify:port" from a MoRIIO
// worker's extra config (moriExtra).
func appendMoriAddr(b []byte, host string, extra *discovery.Record) []byte {
	b = append(b, host...)
	b = append(b, ",handshake:"...)
	b = appendIntParam(b, extra, "handshake_port", 0)
	b = append(b, ",notify:"...)
	return appendIntParam(b, extra, "notify_port", 0)
}

// appendUUID4 appends a random (version 4) UUID in lowercase hex, in its
// canonical dashed form (8-4-4-4-12) when dashed, else its 32 digits.
func appendUUID4(b []byte, dashed bool) []byte {
	var u [16]byte
	binary.LittleEndian.PutUint64(u[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(u[8:], rand.Uint64())
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	for i, c := range u {
		if dashed && (i == 4 || i == 6 || i == 8 || i == 10) {
			b = append(b, '-')
		}
		b = append(b, hexDigits[c>>4], hexDigits[c&0x0f])
	}
	return b
}

const hexDigits = "0123456789abcdef"

func moriPrepareRead(l *pdLegs) error {
	id, err := moriRequestID(l)
	var tx [3 + 36]byte
	l.requestID, l.transferID = id, string(appendUUID4(append(tx[:0], "tx-"...), true))
	return err
}

func moriPrepareWrite(l *pdLegs) error {
	id, err := moriRequestID(l)
	l.requestID, l.transferID = id, roomTransferID("tx-", l.room)
	return err
}

// moriPrefill: single-token body told the decode's DP and TP sizes.
func moriPrefill(l *pdLegs) ([]byte, error) {
	_, _, dtp, err := moriPorts(l.decode)
	if err != nil {
		return nil, err
	}
	kv := `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"transfer_id":"` + l.transferID +
		`","remote_dp_size":` + strconv.Itoa(l.decode.EffectiveDPSize()) + `,"tp_size":` + dtp + `,"remote_tp_size":` + dtp + `}`
	return vllmPrefillBody(l, kv)
}

// moriDecode: the decremented body with the decode's kv_transfer_params;
// engineID and blockIDs are raw JSON (null in write mode).
func moriDecode(l *pdLegs, transferID, engineID, blockIDs []byte) ([]byte, error) {
	_, _, ptp, err := moriPorts(l.prefill)
	if err != nil {
		return nil, err
	}
	body, err := decrementTokens(l.body)
	if err != nil {
		return nil, err
	}
	kv := `{"do_remote_decode":false,"do_remote_prefill":true,"transfer_id":` + string(transferID) + `,"remote_engine_id":` + string(engineID) +
		`,"remote_block_ids":` + string(blockIDs) + `,"remote_dp_size":` + strconv.Itoa(l.prefill.EffectiveDPSize()) + `,"tp_size":` + ptp + `,"remote_tp_size":` + ptp + `}`
	return l.shape(body, l.decode, "kv_transfer_params", kv)
}

func moriWriteDecode(l *pdLegs, _ []byte) ([]byte, error) {
	return moriDecode(l, jsonx.AppendQuoted(nil, l.transferID), []byte("null"), []byte("null"))
}

// moriReadDecode copies transfer_id, remote_engine_id and
// remote_block_ids from the prefill's hand-off.
func moriReadDecode(l *pdLegs, handoff []byte) ([]byte, error) {
	if l.badHandoff(handoff) {
		return nil, ErrPDHandoff
	}
	field := func(k string) []byte {
		if v := topLevelField(handoff, k); v != nil {
			return v
		}
		return []byte("null")
	}
	tid := topLevelField(handoff, "transfer_id")
	if tid == nil {
		tid = jsonx.AppendQuoted(nil, l.transferID)
	}
	return moriDecode(l, tid, field("remote_engine_id"), field("remote_block_ids"))
}

// sglangBootstrap returns the prefill's bootstrap host and port from its
// disagg_meta params.bootstrap_addr ("host:port", split at the last ':').
func sglangBootstrap(rec *discovery.Record) (string, int, error) {
	addr, _ := rec.DisaggMeta.Params["bootstrap_addr"].(string)
	i := strings.LastIndexByte(addr, ':')
	if i <= 0 {
		return "", 0, fmt.Errorf("%w: prefill worker %s has no params.bootstrap_addr host:port (got %q)", ErrPDMeta, rec.WorkerID, addr)
	}
	port, err := strconv.Atoi(addr[i+1:])
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%w: prefill worker %s bootstrap_addr %q: bad port", ErrPDMeta, rec.WorkerID, addr)
	}
	host := strings.TrimSuffix(strings.TrimPrefix(addr[:i], "["), "]")
	return host, port, nil
}

func sglangBody(l *pdLegs, decode bool) ([]byte, error) {
	host, port, err := sglangBootstrap(l.prefill)
	if err != nil {
		return nil, err
	}
	// The values are written one after the other into one buffer (the
	// leg's pooled one when it has it) and the edits slice it once it is
	// complete; the edit list is an array: neither is allocated a leg.
	var v []byte
	if l.out != nil {
		v = l.out.values[:0]
	}
	v = jsonx.AppendQuoted(v, host)
	h := len(v)
	v = strconv.AppendInt(v, int64(port), 10)
	p := len(v)
	v = strconv.AppendUint(v, l.room, 10)
	r := len(v)
	if l.out != nil {
		l.out.values = v
	}
	kv := [...]any{"bootstrap_host", v[:h], "bootstrap_port", v[h:p], "bootstrap_room", v[p:r], "disagg_prefill_dp_rank", nil}
	n := 6
	rec := l.prefill
	if decode {
		rec = l.decode
		if l.prefillDPSize > 1 {
			v = strconv.AppendInt(v, int64(l.prefillDPRank), 10)
			if l.out != nil {
				l.out.values = v
			}
			kv[7], n = v[r:], 8
		}
	}
	return l.shape(l.body, rec, kv[:n]...)
}

func sglangPrefill(l *pdLegs) ([]byte, error) { return sglangBody(l, false) }

func sglangDecode(l *pdLegs, _ []byte) ([]byte, error) { return sglangBody(l, true) }

// alignRoom returns room moved to the residue class rank mod dpSize
// (room % dpSize == rank), staying below 2^63.
func alignRoom(room uint64, rank, dpSize int) uint64 {
	if dpSize <= 1 {
		return room
	}
	n := uint64(dpSize)
	room -= room % n
	room += uint64(rank)
	if room >= 1<<63 {
		room -= n
	}
	return room
}

// topLevelField returns the raw value of body's top-level member key
// (nil when absent or body is not an object). The whole object is
// validated (the prefill answer is outside input); the key is compared
// where the walk reads it (jsonx's Field).
func topLevelField(body []byte, key string) []byte {
	s := jsonx.Scanner{B: body, MaxDepth: maxEditDepth}
	s.SkipWS()
	start, end, err := s.Field(key)
	if err != nil || start < 0 {
		return nil
	}
	return body[start:end]
}

// pdCacheHints returns a shaped leg body with the cache hints the mixed
// path gives a worker of engine (cachehints.go): SGLang's priority and
// infera_retention, vLLM's kv_transfer_params.infera_retention and
// _infera_retention. The protocol's kv_transfer_params replaced the
// client's, so a client's own kv_transfer_params.infera_retention is
// carried into it; other fields the client set are left as they are.
// Other engines get body as is.
func pdCacheHints(body, client []byte, scan *openai.Request, engine string) ([]byte, error) {
	ret := scan.Retention
	if ret == openai.RetentionUnset {
		ret = openai.RetentionLong
	}
	switch engine {
	case discovery.EngineSGLang:
		var kv []any
		if !scan.HasPriority {
			kv = append(kv, "priority", sglangPriority[ret])
		}
		if !scan.HasInferaRetention {
			kv = append(kv, "infera_retention", retentionJSON[ret])
		}
		return setFields(body, kv...)
	case discovery.EngineVLLM:
		value := retentionValue[ret]
		if scan.KVTransferRetention {
			if ckv := topLevelField(client, "kv_transfer_params"); ckv != nil {
				if v := topLevelField(ckv, "infera_retention"); v != nil {
					value = v
				}
			}
		}
		if kv := topLevelField(body, "kv_transfer_params"); len(kv) > 0 && kv[0] == '{' {
			nkv, err := jsonx.SetField(nil, kv, "infera_retention", value, maxEditDepth)
			if err != nil {
				return nil, fmt.Errorf("edit kv_transfer_params: %w", err)
			}
			if body, err = setFields(body, "kv_transfer_params", nkv); err != nil {
				return nil, err
			}
		}
		if !scan.HasLegacyRetention {
			return setFields(body, "_infera_retention", retentionJSON[ret])
		}
	}
	return body, nil
}

// pdHintFields returns a leg's edits with the cache hints pdCacheHints
// would give the body they make (engine's), folded in: the same bytes in
// one pass. ok is false when they cannot be (a hint on a member the edits
// do not set: vLLM's kv_transfer_params left as the client sent it, or a
// hint's key among the edits). The hinted kv_transfer_params is written
// into *kvBuf when it is set (pooled), else into a new slice.
func pdHintFields(fields []jsonx.Field, client []byte, scan *openai.Request, engine string, kvBuf *[]byte) (_ []jsonx.Field, ok bool, _ error) {
	ret := scan.Retention
	if ret == openai.RetentionUnset {
		ret = openai.RetentionLong
	}
	add := func(key, value string) bool {
		if slices.ContainsFunc(fields, func(f jsonx.Field) bool { return f.Key == key }) {
			return false
		}
		fields = append(fields, jsonx.Field{Key: key, Value: rawString(value)})
		return true
	}
	switch engine {
	case discovery.EngineSGLang:
		if !scan.HasPriority && !add("priority", sglangPriority[ret]) {
			return nil, false, nil
		}
		if !scan.HasInferaRetention && !add("infera_retention", retentionJSON[ret]) {
			return nil, false, nil
		}
	case discovery.EngineVLLM:
		i := slices.IndexFunc(fields, func(f jsonx.Field) bool { return f.Key == "kv_transfer_params" })
		if i < 0 || fields[i].Value == nil {
			return nil, false, nil
		}
		switch kv := fields[i].Value; {
		case kv[0] != '{':
		case !scan.KVTransferRetention && isConst(kv, nixlPrefillParams):
			// The protocol's constant, hinted once (nixlPrefillHinted).
			fields[i].Value = nixlPrefillHinted[ret]
		default:
			value := retentionValue[ret]
			if scan.KVTransferRetention {
				if ckv := topLevelField(client, "kv_transfer_params"); ckv != nil {
					if v := topLevelField(ckv, "infera_retention"); v != nil {
						value = v
					}
				}
			}
			var dst []byte
			if kvBuf != nil {
				dst = (*kvBuf)[:0]
			}
			// kv is the protocol's: built valid, or a hand-off the answer's
			// scan or badHandoff validated; a compact one (an engine's) is
			// not walked again.
			nkv, err := jsonx.SetFieldValid(dst, kv, "infera_retention", value, maxEditDepth)
			if err != nil {
				return nil, false, fmt.Errorf("edit kv_transfer_params: %w", err)
			}
			if kvBuf != nil {
				*kvBuf = nkv
			}
			fields[i].Value = nkv
		}
		if !scan.HasLegacyRetention && !add("_infera_retention", retentionJSON[ret]) {
			return nil, false, nil
		}
	}
	return fields, true, nil
}
