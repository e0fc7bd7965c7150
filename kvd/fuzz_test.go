package kvd

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// seedFrames are one well-formed frame of every op, requests and responses.
func seedFrames() [][]byte {
	var out [][]byte
	en := NewEncoder()
	add := func() { out = append(out, append([]byte(nil), en.Frame()...)) }
	nsf := func() { en.Str("model", "m"); en.Str("compat_key", "c") }
	keys := func(n int) {
		en.Array("keys", n)
		for i := range n {
			en.ElemBin(key(i))
		}
	}
	en.Begin(OpHello, 3)
	en.Str("client_id", "c")
	en.Int("protocol_version", 1)
	en.Bool("prefers_shared_arena", true)
	add()
	en.Begin(OpGet, 3)
	en.Bin("key", key(1))
	nsf()
	add()
	en.Begin(OpBatchGet, 3)
	keys(2)
	nsf()
	add()
	en.Begin(OpSet, 7)
	en.Bin("key", key(1))
	en.Bin("value", []byte("v"))
	en.Str("retention", "long")
	nsf()
	en.Map("metadata")
	en.Float("ttl_seconds", 1.5)
	add()
	en.Begin(OpBatchSet, 7)
	keys(2)
	en.Array("values", 2)
	en.ElemBin([]byte("a"))
	en.ElemBin([]byte("b"))
	en.Array("retentions", 2)
	en.ElemStr([]byte("short"))
	en.ElemStr([]byte("none"))
	en.Array("metadatas", 2)
	en.ElemMap()
	en.ElemMap()
	nsf()
	en.Array("ttls_seconds", 2)
	en.ElemNil()
	en.ElemFloat(2)
	add()
	en.Begin(OpSetReserve, 1)
	en.Int("size", 100)
	add()
	en.Begin(OpSetCommit, 7)
	en.Int("lease_token", 1)
	en.Bin("key", key(1))
	en.Int("length", 10)
	nsf()
	en.Str("retention", "default")
	en.Int("ttl_seconds", 0)
	add()
	en.Begin(OpSetCancel, 1)
	en.Int("lease_token", 1)
	add()
	en.Begin(OpPrefetchHint, 4)
	keys(1)
	nsf()
	en.Int("deadline_ms", 50)
	add()
	en.Begin(OpExists, 3)
	keys(3)
	nsf()
	add()
	en.Begin(OpClear, 2)
	nsf()
	add()
	en.Begin(OpStats, 0)
	add()
	en.Begin(OpHelloAck, 3)
	en.Str("server_id", "kvd-00000000")
	en.Int("protocol_version", 1)
	en.Array("shared_arena", 3)
	en.ElemInt(1 << 20)
	en.ElemInt(4096)
	en.ElemInt(1)
	add()
	en.Begin(OpGetSharedResponse, 5)
	en.Int("slot_offset", 16)
	en.Int("length", 10)
	en.Int("version", 2)
	en.Str("retention", "short")
	en.Int("slot_size", 64)
	add()
	en.Begin(OpBatchSetAck, 2)
	en.Array("accepted", 1)
	en.ElemBool(true)
	en.Array("reasons", 1)
	en.ElemNil()
	add()
	en.Begin(OpError, 2)
	en.Str("code", "bad_op")
	en.Str("message", "x")
	add()
	return out
}

// FuzzDecodeFrame: frame reading and every op's field decoding reject or
// accept arbitrary bytes without panicking, and decoded byte fields lie
// inside the frame.
func FuzzDecodeFrame(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s)
	}
	var m Message
	d := NewDecoder()
	f.Fuzz(func(t *testing.T, in []byte) {
		payload, err := ReadFrame(bytes.NewReader(in), nil, 1<<20)
		if err != nil {
			return
		}
		if err := d.Decode(payload, &m); err != nil {
			return
		}
		if m.Op == OpUnknown {
			t.Fatal("decoded a frame without op")
		}
		for _, b := range append([][]byte{m.Key, m.Value, m.Model, m.CompatKey, m.Retention}, m.Keys...) {
			if len(b) > len(payload) {
				t.Fatal("field longer than its frame")
			}
		}
	})
}

// FuzzServerFrames: arbitrary bytes sent to a live daemon get answers or a
// closed connection, never a crash, and the daemon keeps serving others.
func FuzzServerFrames(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s)
	}
	d := startDaemon(f, daemonOpts{arenaBytes: 1 << 20, serverOpt: ServerOptions{MaxFrameBytes: 1 << 20}})
	good := dial(f, d, ClientOptions{SharedArena: true})
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.Dial("unix", d.path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(in); err != nil {
			return
		}
		_ = c.(*net.UnixConn).CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("daemon did not close: %v", err)
		}
		if _, err := good.Stats(); err != nil {
			t.Fatal("daemon stopped serving:", err)
		}
	})
}

func TestSeedFramesDecode(t *testing.T) {
	d := NewDecoder()
	var m Message
	for _, s := range seedFrames() {
		if err := d.Decode(s[4:], &m); err != nil {
			t.Fatalf("%v: % x", err, s)
		}
	}
}

func TestDecodeAndEncodeDoNotAllocate(t *testing.T) {
	d := NewDecoder()
	var m Message
	frames := seedFrames()
	for _, s := range frames { // grow the Message's slices
		_ = d.Decode(s[4:], &m)
	}
	for _, s := range frames {
		payload := s[4:]
		if n := testing.AllocsPerRun(100, func() { _ = d.Decode(payload, &m) }); n != 0 {
			t.Errorf("decoding %s allocates %v", opNameOf(payload), n)
		}
	}
	en := NewEncoder()
	k := key(1)
	if n := testing.AllocsPerRun(100, func() {
		en.Begin(OpGetSharedResponse, 5)
		en.Int("slot_offset", 16)
		en.Int("length", 10)
		en.Int("version", 2)
		en.Str("retention", "short")
		en.Int("slot_size", 64)
		en.Bin("key", k)
		_ = en.Frame()
	}); n != 0 {
		t.Errorf("encoding allocates %v", n)
	}
}

func opNameOf(payload []byte) string {
	var m Message
	_ = NewDecoder().Decode(payload, &m)
	return m.Op.String()
}

func TestStoreGetHitDoesNotAllocate(t *testing.T) {
	s := newTestStore(t, 1<<20, 1<<20, nil, nil)
	set(s, 1, 1000, "short")
	m, ck, k := []byte(ns.Model), []byte(ns.CompatKey), key(1)
	if n := testing.AllocsPerRun(100, func() {
		if h := s.Get(m, ck, k, nil); !h.Found {
			t.Fatal("miss")
		}
	}); n != 0 {
		t.Fatalf("get allocates %v", n)
	}
}

// TestArenaGetDoesNotAllocate: a zero-copy get through the client and the
// daemon (both in this process) allocates nothing once warmed.
func TestArenaGetDoesNotAllocate(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20})
	c := dial(t, d, ClientOptions{SharedArena: true})
	k := key(1)
	c.Set(ns, k, value(1, 4096), SetOptions{})
	dst := make([]byte, 0, 4096)
	keys := [][]byte{k}
	var present []bool
	if n := testing.AllocsPerRun(200, func() {
		var ok bool
		dst, _, ok, _ = c.Get(ns, k, dst)
		present, _ = c.Exists(ns, keys, present)
		if !ok || !present[0] {
			t.Fatal("miss")
		}
	}); n != 0 {
		t.Fatalf("get + exists round trips allocate %v", n)
	}
}

// TestBatchGetDoesNotAllocate: batch gets, shared and inline, allocate
// nothing in the daemon once its scratch has grown (measured with the raw
// frames, as the client's BatchGet copies its results).
func TestBatchGetDoesNotAllocate(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20})
	keys := [][]byte{key(1), key(2), key(3), key(4)}
	setter := dial(t, d, ClientOptions{})
	for i, k := range keys[:3] {
		setter.Set(ns, k, value(i, 2000), SetOptions{})
	}
	for _, arena := range []bool{true, false} {
		c := dial(t, d, ClientOptions{SharedArena: arena})
		c.keysOp(OpBatchGet, ns, keys, 0)
		frame := append([]byte(nil), c.enc.Frame()...)
		roundTrip := func() {
			if _, err := c.c.Write(frame); err != nil {
				t.Fatal(err)
			}
			if err := c.read(OpBatchGetResponse, OpBatchGetSharedResponse); err != nil {
				t.Fatal(err)
			}
		}
		roundTrip()
		if n := testing.AllocsPerRun(100, roundTrip); n != 0 {
			t.Errorf("batch get (arena %v) allocates %v", arena, n)
		}
	}
}

// TestL3MissDoesNotAllocate: a RAM miss that asks the tablespace, and an
// exists that does, allocate nothing in the store.
func TestL3MissDoesNotAllocate(t *testing.T) {
	s := newTestStore(t, 1<<20, 1<<20, newTablespace(t), nil)
	m, ck, k := []byte(ns.Model), []byte(ns.CompatKey), key(1)
	var sc Scratch
	if n := testing.AllocsPerRun(100, func() {
		if h := s.Get(m, ck, k, &sc); h.Found {
			t.Fatal("hit")
		}
		if s.Exists(m, ck, k, &sc) {
			t.Fatal("exists")
		}
	}); n != 0 {
		t.Fatalf("l3 miss allocates %v", n)
	}
}
