package discovery

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalidKVDRecord is wrapped by every error about a kvd record.
var ErrInvalidKVDRecord = errors.New("invalid kvd record")

// DefaultKVDPrefix is where kvds register (serve and kvd --etcd-kvd-prefix):
// beside Infera's worker prefix, not below it, so that readers of worker
// records never see a kvd.
const DefaultKVDPrefix = "/infera/kvds/"

// MaxKVDRecordBytes caps the encoded JSON value of one kvd record.
const MaxKVDRecordBytes = 4 << 10

// Transport kinds a kvd record may name: what moves pulled blocks out of
// the kvd's arena. tcp is in every build; mooncake and mori where the GPU
// build offers them.
const (
	KVDTransportTCP      = "tcp"
	KVDTransportMooncake = "mooncake"
	KVDTransportMori     = "mori"
)

// KVDTransport describes how another kvd reads this one's arena.
type KVDTransport struct {
	// Kind is tcp, mooncake or mori.
	Kind string `json:"kind"`
	// Addr is the arena's transport address: host:port of the TCP arena
	// port, the Mooncake segment name, or the MoRI engine key.
	Addr string `json:"addr"`
}

// KVDRecord is one kvd's entry under <kvd prefix><peer>, kept alive under a
// lease by the kvd itself (`infera kvd --etcd-endpoints`). It is ours;
// Infera's Python fleets have no kvd registry.
type KVDRecord struct {
	// Host is the machine's address as its workers advertise it (the host
	// of their worker_id) and as other kvds see its connections come from:
	// the router finds a worker's kvd by it, and kvds admit peers by it.
	Host string `json:"host"`
	// Peer is host:port of the kvd's peer listener (--peer-listen, as
	// --peer-advertise names it): where hints and locate requests go. It
	// is the record's id and the last element of its key.
	Peer      string       `json:"peer"`
	Transport KVDTransport `json:"transport"`
}

// DecodeKVDRecord parses and validates an etcd value; unknown fields are
// ignored, an IPv6 host is kept without brackets and host:port fields get
// them. Every error wraps ErrInvalidKVDRecord.
func DecodeKVDRecord(value []byte) (KVDRecord, error) {
	return decodeWire[KVDRecord](value, MaxKVDRecordBytes, ErrInvalidKVDRecord)
}

// Encode validates the record and returns its JSON value.
func (r *KVDRecord) Encode() ([]byte, error) {
	return encodeWire(r, MaxKVDRecordBytes, ErrInvalidKVDRecord)
}

func (r *KVDRecord) keyID() (field, id string) { return "peer", r.Peer }

func (r *KVDRecord) normalize() {
	r.Host = strings.TrimSuffix(strings.TrimPrefix(r.Host, "["), "]")
	r.Peer = bracketHostPort(r.Peer)
	if r.Transport.Kind == KVDTransportTCP {
		r.Transport.Addr = bracketHostPort(r.Transport.Addr)
	}
}

// Validate checks every field; errors wrap ErrInvalidKVDRecord.
func (r *KVDRecord) Validate() error {
	if err := checkHost(r.Host); err != nil {
		return kvdInvalidf("host %q: %v", clip(r.Host), err)
	}
	if err := checkHostPort(r.Peer); err != nil {
		return kvdInvalidf("peer %q: %v", clip(r.Peer), err)
	}
	switch r.Transport.Kind {
	case KVDTransportTCP:
		if err := checkHostPort(r.Transport.Addr); err != nil {
			return kvdInvalidf("transport.addr %q: %v", clip(r.Transport.Addr), err)
		}
	case KVDTransportMooncake, KVDTransportMori:
		// A segment name or engine key: host:port by convention, but the
		// engines accept any name; keep it printable and bounded.
		if err := checkText(r.Transport.Addr, maxHostPortBytes); err != nil {
			return kvdInvalidf("transport.addr: %v", err)
		}
	default:
		return kvdInvalidf("transport.kind %q: want tcp, mooncake or mori", clip(r.Transport.Kind))
	}
	return nil
}

func kvdInvalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidKVDRecord, fmt.Sprintf(format, args...))
}

// HostOf returns the host of host:port (a worker_id, a kvd's peer) as a
// KVDRecord's Host holds it: an IPv6 literal without brackets. It slices
// its argument and allocates nothing.
func HostOf(hostPort string) string {
	i := strings.LastIndexByte(hostPort, ':')
	if i < 0 {
		return hostPort
	}
	h := hostPort[:i]
	if len(h) >= 2 && h[0] == '[' && h[len(h)-1] == ']' {
		return h[1 : len(h)-1]
	}
	return h
}
