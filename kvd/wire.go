package kvd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/infera/infera/msgpackx"
)

// Wire constants (docs: shared/protocols/kvd.md §8.3–8.4).
const (
	ProtocolVersion = 1
	// HeaderBytes is the slot header in front of every arena payload.
	HeaderBytes = 16
	// SlotAlign is the alignment of the arena's slot size.
	SlotAlign = 64
	// DefaultMaxFrameBytes bounds one frame unless configured otherwise.
	DefaultMaxFrameBytes = 1 << 30
	// MaxFrameLimit is the largest frame the 4-byte length can say.
	MaxFrameLimit = 1<<32 - 1
	// maxKeyBytes bounds a key, model or compat_key.
	maxKeyBytes = 4096
	// maxDepth bounds nesting when skipping values (metadata maps).
	maxDepth = 32
	// fdMarker is the one-byte payload carrying the arena fd.
	fdMarker = 'F'
)

// Op is a frame's "op".
type Op uint8

// Ops, requests first.
const (
	OpUnknown Op = iota
	OpHello
	OpGet
	OpBatchGet
	OpSet
	OpBatchSet
	OpSetReserve
	OpSetCommit
	OpSetCancel
	OpPrefetchHint
	OpExists
	OpClear
	OpStats
	OpHelloAck
	OpGetResponse
	OpGetSharedResponse
	OpBatchGetResponse
	OpBatchGetSharedResponse
	OpSetAck
	OpBatchSetAck
	OpSetReserveResponse
	OpSetCommitResponse
	OpSetCancelResponse
	OpExistsResponse
	OpClearAck
	OpStatsResponse
	OpError
	numOps
)

var opNames = [numOps]string{
	"", "hello", "get", "batch_get", "set", "batch_set", "set_reserve", "set_commit", "set_cancel",
	"prefetch_hint", "exists", "clear", "stats",
	"hello_ack", "get_response", "get_shared_response", "batch_get_response", "batch_get_shared_response",
	"set_ack", "batch_set_ack", "set_reserve_response", "set_commit_response", "set_cancel_response",
	"exists_response", "clear_ack", "stats_response", "error",
}

func (o Op) String() string {
	if o < numOps {
		return opNames[o]
	}
	return ""
}

// IsRequest says whether a client may send o.
func (o Op) IsRequest() bool { return o >= OpHello && o <= OpStats }

func opFromName(b []byte) Op {
	for i := OpHello; i < numOps; i++ {
		if string(b) == opNames[i] {
			return i
		}
	}
	return OpUnknown
}

// StatsCounters are the fields of stats_response.
type StatsCounters struct {
	Entries        int64 `json:"entries"`
	HostBytes      int64 `json:"host_bytes"`
	SpilloverBytes int64 `json:"spillover_bytes"`
	LongBytes      int64 `json:"long_bytes"`
	GetsTotal      int64 `json:"gets_total"`
	SetsTotal      int64 `json:"sets_total"`
	HitsTotal      int64 `json:"hits_total"`
	MissesTotal    int64 `json:"misses_total"`
	EvictionsTotal int64 `json:"evictions_total"`
	// The arena's size classes holding pages, one element each, present
	// only when the stats request asked with "classes": true (an
	// extension: the reference's clients never ask, and their
	// stats_response keeps its nine fields).
	ClassSlotBytes  []int64 `json:"class_slot_bytes,omitempty"`
	ClassPages      []int64 `json:"class_pages,omitempty"`
	ClassSlots      []int64 `json:"class_slots,omitempty"`
	ClassUsedSlots  []int64 `json:"class_used_slots,omitempty"`
	ClassValueBytes []int64 `json:"class_value_bytes,omitempty"`
}

// Message is one decoded frame, request or response: every field of every
// op, filled from the map by name. Byte fields alias the frame buffer and
// are valid until the next decode into the same Message; reuse a Message
// per connection so decoding stops allocating once its slices have grown.
type Message struct {
	Op Op

	// Requests.
	ClientID           []byte
	ProtocolVersion    int64
	PrefersSharedArena bool
	Key                []byte
	Value              []byte
	HasValue           bool
	Retention          []byte
	HasRetention       bool
	Model              []byte
	CompatKey          []byte
	TTL                float64
	HasTTL             bool
	Keys               [][]byte
	Values             [][]byte // nil entries: absent values
	Retentions         [][]byte
	NumMetadatas       int
	HasMetadatas       bool
	TTLs               []float64
	TTLSet             []bool
	HasTTLs            bool
	Size               int64
	LeaseToken         int64
	Length             int64
	DeadlineMs         int64
	HasDeadline        bool
	// Source (prefetch_hint, beyond the reference): the control address
	// of another host's kvd to pull the keys from (kvd/peer).
	Source []byte

	// Responses.
	ServerID       []byte
	SharedArena    [3]int64 // arena_size, slot_size, server_pid
	HasArena       bool
	SlotOffset     int64
	Version        int64
	SlotSize       int64
	SlotID         int64
	PayloadOffset  int64
	PayloadMaxSize int64
	Offsets        []int64
	Lengths        []int64
	Versions       []int64
	Accepted       bool
	AcceptedList   []bool
	Reason         []byte
	Reasons        [][]byte
	Present        []bool
	ClearedEntries int64
	Stats          StatsCounters
	StatsClasses   bool // stats: answer with the per-class lists
	Code           []byte
	ErrMessage     []byte
}

func (m *Message) reset() {
	keys, values, rets, ttls, ttlSet := m.Keys[:0], m.Values[:0], m.Retentions[:0], m.TTLs[:0], m.TTLSet[:0]
	offs, lens, vers, acc, reasons, present := m.Offsets[:0], m.Lengths[:0], m.Versions[:0], m.AcceptedList[:0], m.Reasons[:0], m.Present[:0]
	*m = Message{
		Keys: keys, Values: values, Retentions: rets, TTLs: ttls, TTLSet: ttlSet,
		Offsets: offs, Lengths: lens, Versions: vers, AcceptedList: acc, Reasons: reasons, Present: present,
		DeadlineMs: 1000,
	}
}

// ReadFrame reads one frame into buf (grown as needed) and returns its
// payload. A zero length or one above max wraps ErrBadFrame or
// ErrFrameTooLarge.
func ReadFrame(r io.Reader, buf []byte, max int) ([]byte, error) {
	if cap(buf) < 4 {
		buf = make([]byte, 4, 512)
	}
	// The header is read into buf itself: a local array would escape
	// through the io.Reader interface and cost an allocation per frame.
	hdr := buf[:4]
	if _, err := io.ReadFull(r, hdr); err != nil {
		return buf[:0], err
	}
	n := binary.BigEndian.Uint32(hdr)
	if n == 0 {
		return buf[:0], fmt.Errorf("%w: zero-length frame", ErrBadFrame)
	}
	if uint64(n) > uint64(max) {
		return buf[:0], fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, max)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return buf, err
	}
	return buf, nil
}

// Decoder decodes frame payloads without reflection. It is built on
// vmihailenco/msgpack's streaming primitives over a bytes.Reader it owns,
// so strings and bytes are sliced from the payload instead of copied (the
// same approach as kvcache's event decoder). Not safe for concurrent use.
type Decoder struct {
	x *msgpackx.Reader
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	return &Decoder{x: msgpackx.NewReader()}
}

// Decode decodes one payload into m (reset first). The payload must be one
// map with a str "op"; known fields are type-checked, unknown ones skipped.
// Errors wrap ErrBadFrame.
func (d *Decoder) Decode(payload []byte, m *Message) error {
	m.reset()
	d.x.Reset(payload)
	err := d.message(m)
	if err == nil && d.x.Len() != 0 {
		err = errors.New("trailing bytes after map")
	}
	if err == nil && m.Op == OpUnknown {
		err = errors.New("no op")
	}
	d.x.Release()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	return nil
}

func (d *Decoder) message(m *Message) error {
	c, err := d.x.Peek()
	if err != nil {
		return err
	}
	if !msgpackx.IsMap(c) {
		return errors.New("frame is not a map")
	}
	n, err := d.x.D.DecodeMapLen()
	if err != nil {
		return err
	}
	for range n {
		k, ok, err := d.x.Raw()
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("nil map key")
		}
		if err := d.field(m, k); err != nil {
			return fmt.Errorf("field %.40q: %w", k, err)
		}
	}
	return nil
}

func (d *Decoder) field(m *Message, k []byte) error {
	var err error
	switch string(k) {
	case "op":
		var b []byte
		if b, err = d.str(); err == nil {
			if m.Op = opFromName(b); m.Op == OpUnknown {
				m.Op = numOps // well-formed but not ours: answered with bad_op
			}
		}
	case "client_id":
		m.ClientID, err = d.strOrNil()
	case "protocol_version":
		m.ProtocolVersion, err = d.intOrNil()
	case "prefers_shared_arena":
		m.PrefersSharedArena, err = d.boolOrNil()
	case "key":
		m.Key, _, err = d.x.Raw()
	case "value":
		m.Value, m.HasValue, err = d.x.Raw()
	case "retention":
		m.Retention, m.HasRetention, err = d.x.Raw()
	case "model":
		m.Model, err = d.strOrNil()
	case "compat_key":
		m.CompatKey, err = d.strOrNil()
	case "metadata":
		err = d.mapOrNil()
	case "ttl_seconds":
		m.TTL, m.HasTTL, err = d.floatOrNil()
	case "keys":
		m.Keys, err = d.rawList(m.Keys)
	case "values":
		m.Values, err = d.rawList(m.Values)
	case "retentions":
		m.Retentions, err = d.rawList(m.Retentions)
	case "metadatas":
		m.NumMetadatas, m.HasMetadatas, err = d.mapList()
	case "ttls_seconds":
		err = d.floatList(m)
	case "size":
		m.Size, err = d.intOrNil()
	case "lease_token":
		m.LeaseToken, err = d.intOrNil()
	case "length":
		m.Length, err = d.intOrNil()
	case "deadline_ms":
		var ok bool
		c, _ := d.x.Peek()
		if c == msgpcode.Nil {
			err = d.x.D.DecodeNil()
		} else {
			m.DeadlineMs, err = d.x.D.DecodeInt64()
			ok = err == nil
		}
		m.HasDeadline = ok
	case "source":
		m.Source, err = d.strOrNil()
	case "server_id":
		m.ServerID, err = d.strOrNil()
	case "shared_arena":
		err = d.arena(m)
	case "slot_offset":
		m.SlotOffset, err = d.intOrNil()
	case "version":
		m.Version, err = d.intOrNil()
	case "slot_size":
		m.SlotSize, err = d.intOrNil()
	case "slot_id":
		m.SlotID, err = d.intOrNil()
	case "payload_offset":
		m.PayloadOffset, err = d.intOrNil()
	case "payload_max_size":
		m.PayloadMaxSize, err = d.intOrNil()
	case "offsets":
		m.Offsets, err = d.intList(m.Offsets)
	case "lengths":
		m.Lengths, err = d.intList(m.Lengths)
	case "versions":
		m.Versions, err = d.intList(m.Versions)
	case "accepted":
		c, _ := d.x.Peek()
		if msgpackx.IsArray(c) {
			m.AcceptedList, err = d.boolList(m.AcceptedList)
		} else {
			m.Accepted, err = d.boolOrNil()
		}
	case "reason":
		m.Reason, _, err = d.x.Raw()
	case "reasons":
		m.Reasons, err = d.rawList(m.Reasons)
	case "present":
		m.Present, err = d.boolList(m.Present)
	case "cleared_entries":
		m.ClearedEntries, err = d.intOrNil()
	case "entries":
		m.Stats.Entries, err = d.intOrNil()
	case "host_bytes":
		m.Stats.HostBytes, err = d.intOrNil()
	case "spillover_bytes":
		m.Stats.SpilloverBytes, err = d.intOrNil()
	case "long_bytes":
		m.Stats.LongBytes, err = d.intOrNil()
	case "gets_total":
		m.Stats.GetsTotal, err = d.intOrNil()
	case "sets_total":
		m.Stats.SetsTotal, err = d.intOrNil()
	case "hits_total":
		m.Stats.HitsTotal, err = d.intOrNil()
	case "misses_total":
		m.Stats.MissesTotal, err = d.intOrNil()
	case "evictions_total":
		m.Stats.EvictionsTotal, err = d.intOrNil()
	case "classes":
		m.StatsClasses, err = d.boolOrNil()
	case "class_slot_bytes":
		m.Stats.ClassSlotBytes, err = d.intList(nil)
	case "class_pages":
		m.Stats.ClassPages, err = d.intList(nil)
	case "class_slots":
		m.Stats.ClassSlots, err = d.intList(nil)
	case "class_used_slots":
		m.Stats.ClassUsedSlots, err = d.intList(nil)
	case "class_value_bytes":
		m.Stats.ClassValueBytes, err = d.intList(nil)
	case "code":
		m.Code, err = d.strOrNil()
	case "message":
		m.ErrMessage, err = d.strOrNil()
	default:
		err = d.x.Skip(0, maxDepth)
	}
	return err
}

func (d *Decoder) str() ([]byte, error) {
	c, err := d.x.Peek()
	if err != nil {
		return nil, err
	}
	if !msgpackx.IsStr(c) {
		return nil, errors.New("want str")
	}
	b, _, err := d.x.Raw()
	return b, err
}

func (d *Decoder) strOrNil() ([]byte, error) {
	b, _, err := d.x.Raw()
	if err == nil && len(b) > maxKeyBytes {
		err = errors.New("string too long")
	}
	return b, err
}

func (d *Decoder) intOrNil() (int64, error) {
	c, err := d.x.Peek()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil {
		return 0, d.x.D.DecodeNil()
	}
	if !msgpackx.IsInt(c) {
		return 0, errors.New("want int")
	}
	if c == msgpcode.Uint64 {
		u, err := d.x.D.DecodeUint64()
		if err == nil && u > math.MaxInt64 {
			err = errors.New("int out of range")
		}
		return int64(u), err
	}
	return d.x.D.DecodeInt64()
}

func (d *Decoder) boolOrNil() (bool, error) {
	c, err := d.x.Peek()
	if err != nil {
		return false, err
	}
	switch c {
	case msgpcode.Nil:
		return false, d.x.D.DecodeNil()
	case msgpcode.True, msgpcode.False:
		return d.x.D.DecodeBool()
	}
	return false, errors.New("want bool")
}

func (d *Decoder) floatOrNil() (float64, bool, error) {
	c, err := d.x.Peek()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		return 0, false, d.x.D.DecodeNil()
	}
	if !msgpackx.IsInt(c) && c != msgpcode.Float && c != msgpcode.Double {
		return 0, false, errors.New("want number")
	}
	f, err := d.x.D.DecodeFloat64()
	if err == nil && math.IsNaN(f) {
		err = errors.New("NaN")
	}
	return f, err == nil, err
}

func (d *Decoder) rawList(dst [][]byte) ([][]byte, error) {
	dst = dst[:0]
	n, err := d.x.ArrayLen()
	if err != nil || n < 0 {
		return dst, err
	}
	for range n {
		b, _, err := d.x.Raw()
		if err != nil {
			return dst, err
		}
		dst = append(dst, b)
	}
	return dst, nil
}

func (d *Decoder) intList(dst []int64) ([]int64, error) {
	dst = dst[:0]
	n, err := d.x.ArrayLen()
	if err != nil || n < 0 {
		return dst, err
	}
	for range n {
		v, err := d.intOrNil()
		if err != nil {
			return dst, err
		}
		dst = append(dst, v)
	}
	return dst, nil
}

func (d *Decoder) boolList(dst []bool) ([]bool, error) {
	dst = dst[:0]
	n, err := d.x.ArrayLen()
	if err != nil || n < 0 {
		return dst, err
	}
	for range n {
		v, err := d.boolOrNil()
		if err != nil {
			return dst, err
		}
		dst = append(dst, v)
	}
	return dst, nil
}

func (d *Decoder) floatList(m *Message) error {
	m.TTLs, m.TTLSet = m.TTLs[:0], m.TTLSet[:0]
	n, err := d.x.ArrayLen()
	if err != nil || n < 0 {
		return err
	}
	m.HasTTLs = true
	for range n {
		f, ok, err := d.floatOrNil()
		if err != nil {
			return err
		}
		m.TTLs, m.TTLSet = append(m.TTLs, f), append(m.TTLSet, ok)
	}
	return nil
}

func (d *Decoder) mapOrNil() error {
	c, err := d.x.Peek()
	if err != nil {
		return err
	}
	if c != msgpcode.Nil && !msgpackx.IsMap(c) {
		return errors.New("want map")
	}
	return d.x.Skip(0, maxDepth)
}

func (d *Decoder) mapList() (int, bool, error) {
	n, err := d.x.ArrayLen()
	if err != nil || n < 0 {
		return 0, false, err
	}
	for range n {
		if err := d.mapOrNil(); err != nil {
			return 0, false, err
		}
	}
	return n, true, nil
}

func (d *Decoder) arena(m *Message) error {
	n, err := d.x.ArrayLen()
	if err != nil || n < 0 {
		return err
	}
	if n != 3 {
		return errors.New("shared_arena wants 3 ints")
	}
	for i := range 3 {
		if m.SharedArena[i], err = d.intOrNil(); err != nil {
			return err
		}
	}
	m.HasArena = true
	return nil
}

// Encoder builds frames (length prefix + msgpack map) in a reused buffer
// with vmihailenco/msgpack's streaming encoder: no reflection and, once the
// buffer has grown, no allocation. Not safe for concurrent use.
type Encoder struct {
	buf bytes.Buffer
	e   *msgpack.Encoder
}

// NewEncoder returns an Encoder.
func NewEncoder() *Encoder {
	en := &Encoder{}
	en.e = msgpack.NewEncoder(&en.buf)
	en.e.UseCompactInts(true)
	return en
}

// Begin starts a frame of op with fields more entries after "op".
// Writes into a bytes.Buffer cannot fail, so the encoder's errors are
// dropped throughout.
func (en *Encoder) Begin(op Op, fields int) {
	en.buf.Reset()
	en.buf.Write([]byte{0, 0, 0, 0})
	_ = en.e.EncodeMapLen(fields + 1)
	_ = en.e.EncodeString("op")
	_ = en.e.EncodeString(op.String())
}

// Frame finishes the frame and returns it (valid until the next Begin).
// Callers check Len against their limit first: a frame past MaxFrameLimit
// cannot be said in its header, and panics rather than wrap.
func (en *Encoder) Frame() []byte {
	b := en.buf.Bytes()
	if len(b)-4 > MaxFrameLimit {
		panic("kvd: frame of 4 GiB or more")
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// Len is the size of the frame so far.
func (en *Encoder) Len() int { return en.buf.Len() }

// Truncate drops what was written after Len returned n.
func (en *Encoder) Truncate(n int) { en.buf.Truncate(n) }

// Shrink drops a buffer grown past limit, so one huge frame does not pin
// its memory for the connection's lifetime.
func (en *Encoder) Shrink(limit int) {
	if en.buf.Cap() > limit {
		en.buf = bytes.Buffer{}
	}
}

func (en *Encoder) key(k string) { _ = en.e.EncodeString(k) }

// Str writes a str field.
func (en *Encoder) Str(k, v string) { en.key(k); _ = en.e.EncodeString(v) }

// StrBytes writes a str field from bytes; nil writes nil.
func (en *Encoder) StrBytes(k string, v []byte) {
	en.key(k)
	en.strBytes(v)
}

func (en *Encoder) strBytes(v []byte) {
	if v == nil {
		_ = en.e.EncodeNil()
		return
	}
	_ = en.e.EncodeString(unsafeString(v))
}

// Bin writes a bin field; nil writes nil.
func (en *Encoder) Bin(k string, v []byte) {
	en.key(k)
	en.bin(v)
}

func (en *Encoder) bin(v []byte) {
	if v == nil {
		_ = en.e.EncodeNil()
		return
	}
	_ = en.e.EncodeBytes(v)
}

// BinHeader writes a bin field's header of n bytes; the caller writes the
// n bytes with Raw (so a value can be copied straight from the arena).
func (en *Encoder) BinHeader(k string, n int) {
	en.key(k)
	_ = en.e.EncodeBytesLen(n)
}

// Raw appends bytes as they are.
func (en *Encoder) Raw(b []byte) { en.buf.Write(b) }

// Int writes an int field.
func (en *Encoder) Int(k string, v int64) { en.key(k); _ = en.e.EncodeInt(v) }

// Float writes a float field.
func (en *Encoder) Float(k string, v float64) { en.key(k); _ = en.e.EncodeFloat64(v) }

// Bool writes a bool field.
func (en *Encoder) Bool(k string, v bool) { en.key(k); _ = en.e.EncodeBool(v) }

// Nil writes a nil field.
func (en *Encoder) Nil(k string) { en.key(k); _ = en.e.EncodeNil() }

// Map writes an empty map field.
func (en *Encoder) Map(k string) { en.key(k); _ = en.e.EncodeMapLen(0) }

// Array writes an array header field of n elements; elements follow with
// the Elem* methods.
func (en *Encoder) Array(k string, n int) { en.key(k); _ = en.e.EncodeArrayLen(n) }

// ElemInt writes an int array element.
func (en *Encoder) ElemInt(v int64) { _ = en.e.EncodeInt(v) }

// ElemBool writes a bool array element.
func (en *Encoder) ElemBool(v bool) { _ = en.e.EncodeBool(v) }

// ElemBin writes a bin array element (nil for nil).
func (en *Encoder) ElemBin(v []byte) { en.bin(v) }

// ElemStr writes a str array element (nil for nil).
func (en *Encoder) ElemStr(v []byte) { en.strBytes(v) }

// ElemNil writes a nil array element.
func (en *Encoder) ElemNil() { _ = en.e.EncodeNil() }

// ElemMap writes an empty map array element.
func (en *Encoder) ElemMap() { _ = en.e.EncodeMapLen(0) }

// ElemFloat writes a float array element.
func (en *Encoder) ElemFloat(v float64) { _ = en.e.EncodeFloat64(v) }
