package peer_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/infera/infera/kvd/peer"
	"github.com/infera/infera/transport"
)

// FuzzParseRequest: any frame body is parsed or refused without panicking;
// a parsed request encodes back to the same body.
func FuzzParseRequest(f *testing.F) {
	good, _ := peer.AppendRequest(nil, &peer.Request{Secret: []byte("s"), Model: []byte("m"), Compat: []byte("c"), Keys: [][]byte{[]byte("k1"), []byte("k2")}})
	f.Add(good[4:])
	f.Add([]byte("IKPL\x01"))
	f.Fuzz(func(t *testing.T, body []byte) {
		var r peer.Request
		if peer.ParseRequest(body, &r) != nil {
			return
		}
		out, err := peer.AppendRequest(nil, &r)
		if err != nil || !bytes.Equal(out[4:], body) {
			t.Fatalf("round trip: %v\n%x\n%x", err, body, out)
		}
	})
}

// FuzzParseResponse: a response never names a block outside the region or
// with an odd version.
func FuzzParseResponse(f *testing.F) {
	good, _ := peer.AppendResponse(nil, &peer.Response{Region: transport.Desc{Peer: "127.0.0.1:1", Name: "kvd-arena", Len: 1 << 20},
		Entries: []peer.Entry{{Found: true, Offset: 16, Length: 100, Version: 2}, {}}})
	f.Add(good[4:])
	f.Fuzz(func(t *testing.T, body []byte) {
		var r peer.Response
		if peer.ParseResponse(body, &r) != nil {
			return
		}
		for _, e := range r.Entries {
			if e.Found && (e.Offset < 16 || e.Offset+uint64(e.Length) > r.Region.Len || e.Version%2 != 0) {
				t.Fatalf("accepted %+v in a %d-byte region", e, r.Region.Len)
			}
		}
	})
}

// FuzzParseHint: any hint body is parsed or refused without panicking; a
// parsed hint names a host:port source and encodes back to the same body.
func FuzzParseHint(f *testing.F) {
	good, _ := peer.AppendHint(nil, &peer.Hint{Secret: []byte("s"), Model: []byte("m"), Compat: []byte("c"), Source: "10.0.0.7:7000",
		Keys: [][]byte{[]byte("k1")}, Deadline: time.Second, Wait: 20 * time.Millisecond})
	f.Add(good[4:])
	f.Add([]byte("IKPH\x01"))
	f.Fuzz(func(t *testing.T, body []byte) {
		var h peer.Hint
		if peer.ParseHint(body, &h) != nil {
			return
		}
		out, err := peer.AppendHint(nil, &h)
		if err != nil || !bytes.Equal(out[4:], body) {
			t.Fatalf("round trip: %v\n%x\n%x", err, body, out)
		}
	})
}

// FuzzParseHintReply: any reply body is parsed or refused without
// panicking; a parsed reply has a known status.
func FuzzParseHintReply(f *testing.F) {
	f.Add([]byte("IKPA\x01\x00\x01\x0a\x00\x00\x00"))
	f.Add([]byte("IKPA\x01\x02\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, body []byte) {
		var r peer.HintReply
		if peer.ParseHintReply(body, &r) != nil {
			return
		}
		if r.Status > 2 || len(body) != 11 {
			t.Fatalf("accepted %+v from %d bytes", r, len(body))
		}
	})
}
