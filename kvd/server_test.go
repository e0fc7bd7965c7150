package kvd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/internal/testkit"
)

var ns = Namespace{Model: "m", CompatKey: "tp0of1"}

func key(i int) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(i))
}

func value(i, n int) []byte {
	v := make([]byte, n)
	for j := range v {
		v[j] = byte(i*31 + j)
	}
	return v
}

func TestListenSocketModeAndStale(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvd.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode %v", fi.Mode())
	}
	if _, err := Listen(path); !errors.Is(err, ErrSocketInUse) {
		t.Fatalf("second Listen on a live socket: %v", err)
	}
	ln.Close() // leaves the file behind, as a crashed daemon would
	if _, err := os.Stat(path); err != nil {
		t.Fatal("socket file gone after close:", err)
	}
	ln2, err := Listen(path)
	if err != nil {
		t.Fatal("stale socket not replaced:", err)
	}
	ln2.Close()
	if err := os.WriteFile(path+".f", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path + ".f"); err == nil {
		t.Fatal("Listen replaced a regular file")
	}
}

func TestGoClientArenaRoundTrip(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20})
	c := dial(t, d, ClientOptions{SharedArena: true})
	if !c.HasArena() || c.ServerID != d.srv.ID() || c.ArenaPID != int64(os.Getpid()) {
		t.Fatalf("arena %v server %q pid %d", c.HasArena(), c.ServerID, c.ArenaPID)
	}
	v := value(1, 4000)
	if ok, reason, err := c.Set(ns, key(1), v, SetOptions{}); err != nil || !ok {
		t.Fatalf("set: %v %q %v", ok, reason, err)
	}
	got, ret, ok, err := c.Get(ns, key(1), nil)
	if err != nil || !ok || !bytes.Equal(got, v) || ret != RetentionShort {
		t.Fatalf("get: ok=%v ret=%q err=%v equal=%v", ok, ret, err, bytes.Equal(got, v))
	}
	ref, ok, err := c.GetRef(ns, key(1))
	if err != nil || !ok || !bytes.Equal(c.View(ref), v) || !c.Valid(ref) {
		t.Fatalf("zero-copy get: %+v %v %v", ref, ok, err)
	}
	// An overwrite moves the value: the old reference stops being valid.
	if ok, _, _ := c.Set(ns, key(1), value(2, 4000), SetOptions{}); !ok {
		t.Fatal("overwrite refused")
	}
	if ok, _, _ := c.Set(ns, key(9), value(9, 4000), SetOptions{}); !ok {
		t.Fatal("set refused")
	}
	if _, _, ok, _ := c.Get(Namespace{Model: "other"}, key(1), nil); ok {
		t.Fatal("namespaces leak into each other")
	}
	// Values larger than the largest slot (the 64 KiB page of a 1 MiB
	// arena) stay inline.
	big := value(3, 100_000)
	if ok, reason, _ := c.Set(ns, key(3), big, SetOptions{}); ok {
		t.Fatalf("a value larger than the slot was accepted with no inline budget (%q)", reason)
	}

	// Lease path.
	l, err := c.Reserve(3000)
	if err != nil || l.Token == 0 || l.PayloadMaxSize < 3000 || (l.PayloadMaxSize+HeaderBytes)%SlotAlign != 0 {
		t.Fatalf("reserve: %+v %v", l, err)
	}
	lv := value(4, 3000)
	copy(c.Arena()[l.PayloadOffset:], lv)
	if ok, reason, err := c.Commit(l.Token, ns, key(4), len(lv), SetOptions{Retention: "long"}); err != nil || !ok {
		t.Fatalf("commit: %v %q %v", ok, reason, err)
	}
	if got, ret, ok, _ := c.Get(ns, key(4), nil); !ok || !bytes.Equal(got, lv) || ret != RetentionLong {
		t.Fatalf("get after commit: %v %q", ok, ret)
	}
	if ok, reason, _ := c.Commit(l.Token, ns, key(5), 10, SetOptions{}); ok || reason != ReasonUnknownLease {
		t.Fatalf("second commit of a lease: %v %q", ok, reason)
	}
	if l, _ := c.Reserve(100_000); l.Token != 0 || l.Reason != ReasonOversize {
		t.Fatalf("oversize reserve: %+v", l)
	}
	l2, _ := c.Reserve(100)
	if ok, reason, _ := c.Commit(l2.Token, ns, key(6), 200, SetOptions{}); ok || reason != ReasonOversizeCommit {
		t.Fatalf("oversize commit: %v %q", ok, reason)
	}
	if err := c.Cancel(l2.Token); err != nil {
		t.Fatal(err)
	}
	if err := c.Cancel(l2.Token); err != nil {
		t.Fatal("cancel is not idempotent:", err)
	}

	vals, err := c.BatchGet(ns, [][]byte{key(4), key(77), key(9)})
	if err != nil || !bytes.Equal(vals[0], lv) || vals[1] != nil || !bytes.Equal(vals[2], value(9, 4000)) {
		t.Fatalf("batch get: %v", err)
	}
	present, err := c.Exists(ns, [][]byte{key(1), key(77), key(4)}, nil)
	if err != nil || !present[0] || present[1] || !present[2] {
		t.Fatalf("exists: %v %v", present, err)
	}
	st, err := c.Stats()
	if err != nil || st.Entries != 3 || st.HostBytes != 4000+4000+3000 || st.HitsTotal == 0 || st.MissesTotal == 0 {
		t.Fatalf("stats: %+v %v", st, err)
	}
	if n, err := c.Clear(Namespace{}); err != nil || n != 3 {
		t.Fatalf("clear: %d %v", n, err)
	}
	if st, _ := c.Stats(); st.Entries != 0 || st.HostBytes != 0 {
		t.Fatalf("stats after clear: %+v", st)
	}
}

func TestInlineClientAndBatch(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20, maxBytes: 2 << 20})
	c := dial(t, d, ClientOptions{}) // no arena: values come inline
	keys := [][]byte{key(1), key(2), key(3)}
	vals := [][]byte{value(1, 500), value(2, 500), value(3, 100_000)} // the last one (over the 64 KiB page) is inline on the daemon
	oks, reasons, err := c.BatchSet(ns, keys, vals, SetOptions{Retention: "ephemeral"})
	if err != nil || len(oks) != 3 || !oks[0] || !oks[1] || !oks[2] {
		t.Fatalf("batch set: %v %v %v", oks, reasons, err)
	}
	got, err := c.BatchGet(ns, append(keys, key(4)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range vals {
		if !bytes.Equal(got[i], vals[i]) {
			t.Fatalf("batch get %d differs", i)
		}
	}
	if got[3] != nil {
		t.Fatal("miss returned a value")
	}
	if v, ret, ok, _ := c.Get(ns, key(1), nil); !ok || !bytes.Equal(v, vals[0]) || ret != RetentionEphemeral {
		t.Fatal("inline get over an arena entry")
	}
	// An arena client sees inline-only entries as batch misses, and gets
	// them inline with a single get.
	ac := dial(t, d, ClientOptions{SharedArena: true})
	got, err = ac.BatchGet(ns, keys)
	if err != nil || !bytes.Equal(got[0], vals[0]) || got[2] != nil {
		t.Fatalf("arena batch get: %v", err)
	}
	if v, _, ok, _ := ac.Get(ns, key(3), nil); !ok || !bytes.Equal(v, vals[2]) {
		t.Fatal("arena client get of an inline entry")
	}
	// Arity mismatch is an error frame, and the connection stays usable.
	_, _, err = c.BatchSet(ns, keys, vals[:2], SetOptions{})
	if !errors.Is(err, ErrServer) {
		t.Fatalf("arity mismatch: %v", err)
	}
	if _, err := c.Stats(); err != nil {
		t.Fatal("connection unusable after an error frame:", err)
	}
	if _, err := c.Reserve(100); !errors.Is(err, ErrNoArena) {
		t.Fatalf("reserve without a mapped arena: %v", err)
	}
}

func TestNoArenaDaemon(t *testing.T) {
	d := startDaemon(t, daemonOpts{maxBytes: 10000})
	c := dial(t, d, ClientOptions{SharedArena: true})
	if c.HasArena() {
		t.Fatal("arena negotiated without one")
	}
	raw := rawConn(t, d)
	en := NewEncoder()
	en.Begin(OpSetReserve, 1)
	en.Int("size", 100)
	writeFrame(t, raw, en.Frame()[4:])
	if m, err := readMsg(t, raw); err != nil || m.LeaseToken != 0 || string(m.Reason) != ReasonNoArena || m.SlotID != -1 {
		t.Fatalf("reserve: %+v %v", m, err)
	}
	if ok, reason, _ := c.Commit(1, ns, key(1), 1, SetOptions{}); ok || reason != ReasonNoArena {
		t.Fatalf("commit: %v %q", ok, reason)
	}
	if ok, reason, _ := c.Set(ns, key(1), value(1, 20000), SetOptions{}); ok || reason != ReasonLargerThanStore {
		t.Fatalf("value larger than the store: %v %q", ok, reason)
	}
}

// rawConn sends frames without the client library.
func rawConn(t *testing.T, d *daemon) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", d.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func writeFrame(t *testing.T, c net.Conn, payload []byte) {
	t.Helper()
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(payload)))
	if _, err := c.Write(append(hdr[:], payload...)); err != nil {
		t.Fatal(err)
	}
}

func readMsg(t *testing.T, c net.Conn) (*Message, error) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf, err := ReadFrame(c, nil, DefaultMaxFrameBytes)
	if err != nil {
		return nil, err
	}
	var m Message
	if err := NewDecoder().Decode(buf, &m); err != nil {
		t.Fatal(err)
	}
	return &m, nil
}

func TestNoHelloRepeatedHelloBadOp(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20})
	c := dial(t, d, ClientOptions{NoHello: true})
	if ok, _, err := c.Set(ns, key(1), value(1, 100), SetOptions{}); err != nil || !ok {
		t.Fatalf("no-hello set: %v %v", ok, err)
	}
	if v, _, ok, err := c.Get(ns, key(1), nil); err != nil || !ok || !bytes.Equal(v, value(1, 100)) {
		t.Fatal("no-hello get returned no inline value", err)
	}
	raw := rawConn(t, d)
	en := NewEncoder()
	en.Begin(OpHello, 3)
	en.Str("client_id", "x")
	en.Int("protocol_version", 1)
	en.Bool("prefers_shared_arena", false)
	hello := append([]byte(nil), en.Frame()[4:]...)
	writeFrame(t, raw, hello)
	if m, err := readMsg(t, raw); err != nil || m.Op != OpHelloAck || m.HasArena {
		t.Fatalf("hello: %+v %v", m, err)
	}
	// A repeated hello asking for the arena is acked without it (no fd).
	en.Begin(OpHello, 3)
	en.Str("client_id", "x")
	en.Int("protocol_version", 1)
	en.Bool("prefers_shared_arena", true)
	writeFrame(t, raw, en.Frame()[4:])
	if m, err := readMsg(t, raw); err != nil || m.Op != OpHelloAck || m.HasArena {
		t.Fatalf("repeated hello: %+v %v", m, err)
	}
	en.Begin(OpStatsResponse, 0) // a response op sent as a request
	writeFrame(t, raw, en.Frame()[4:])
	if m, err := readMsg(t, raw); err != nil || m.Op != OpError || string(m.Code) != "bad_op" {
		t.Fatalf("bad op: %+v %v", m, err)
	}
	en.Begin(Op(numOps), 0) // "op": "" is well-formed but unknown
	writeFrame(t, raw, en.Frame()[4:])
	if m, err := readMsg(t, raw); err != nil || m.Op != OpError || string(m.Code) != "bad_op" {
		t.Fatalf("unknown op: %+v %v", m, err)
	}
}

func TestBadFramesCloseOnlyThatConnection(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20, serverOpt: ServerOptions{MaxFrameBytes: 1 << 16}})
	good := dial(t, d, ClientOptions{SharedArena: true})
	cases := map[string][]byte{
		"not msgpack":     {0xc1},
		"not a map":       {0x93, 1, 2, 3},
		"no op":           {0x80},
		"op not a string": {0x81, 0xa2, 'o', 'p', 0x01},
		"key wrong type":  append([]byte{0x82, 0xa2, 'o', 'p', 0xa3, 'g', 'e', 't', 0xa3, 'k', 'e', 'y'}, 0xc3),
		"get without key": {0x81, 0xa2, 'o', 'p', 0xa3, 'g', 'e', 't'},
		"truncated":       {0x82, 0xa2, 'o', 'p', 0xa3, 'g', 'e'},
		"trailing bytes":  {0x81, 0xa2, 'o', 'p', 0xa5, 's', 't', 'a', 't', 's', 0x00},
	}
	for name, payload := range cases {
		t.Run(name, func(t *testing.T) {
			raw := rawConn(t, d)
			writeFrame(t, raw, payload)
			if _, err := readMsg(t, raw); !errors.Is(err, io.EOF) {
				t.Fatalf("connection not closed: %v", err)
			}
		})
	}
	t.Run("zero length", func(t *testing.T) {
		raw := rawConn(t, d)
		if _, err := raw.Write([]byte{0, 0, 0, 0}); err != nil {
			t.Fatal(err)
		}
		if _, err := readMsg(t, raw); !errors.Is(err, io.EOF) {
			t.Fatalf("connection not closed: %v", err)
		}
	})
	t.Run("too large", func(t *testing.T) {
		raw := rawConn(t, d)
		if _, err := raw.Write([]byte{0, 2, 0, 0}); err != nil {
			t.Fatal(err)
		}
		if _, err := readMsg(t, raw); !errors.Is(err, io.EOF) {
			t.Fatalf("connection not closed: %v", err)
		}
	})
	if _, err := good.Stats(); err != nil {
		t.Fatal("a bad frame on another connection broke this one:", err)
	}
	if d.srv.BadFrames.Load() < int64(len(cases)) {
		t.Fatalf("bad frames counted %d", d.srv.BadFrames.Load())
	}
}

func TestLeasesCancelledOnDisconnect(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 4 * 1024})
	c, err := Dial(context.Background(), d.path, ClientOptions{SharedArena: true})
	if err != nil {
		t.Fatal(err)
	}
	var tokens []uint64
	for {
		l, err := c.Reserve(1000)
		if err != nil {
			t.Fatal(err)
		}
		if l.Token == 0 {
			if l.Reason != ReasonArenaFull {
				t.Fatalf("reason %q", l.Reason)
			}
			break
		}
		tokens = append(tokens, l.Token)
	}
	if len(tokens) != 4 {
		t.Fatalf("%d leases in a 4-slot arena", len(tokens))
	}
	other := dial(t, d, ClientOptions{SharedArena: true})
	if ok, reason, _ := other.Commit(tokens[0], ns, key(1), 10, SetOptions{}); ok || reason != ReasonWrongOwner {
		t.Fatalf("foreign commit: %v %q", ok, reason)
	}
	c.Close()
	// The server cancels the leases when it sees the connection close;
	// wait for that through the public counters.
	testkit.Eventually(t, "the leases cancelled with their connection", func() bool { return d.store.Counters().LeasesActive == 0 })
	if l, _ := other.Reserve(1000); l.Token == 0 {
		t.Fatalf("slots not freed: %+v", l)
	}
}

func TestPeerCredentialCheck(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20, serverOpt: ServerOptions{AllowUIDs: []int{os.Getuid() + 12345}}})
	_, err := Dial(context.Background(), d.path, ClientOptions{})
	if err == nil {
		t.Fatal("a uid outside --allow-uid was served")
	}
	if d.srv.Rejected.Load() != 1 {
		t.Fatalf("rejected %d", d.srv.Rejected.Load())
	}
}

func TestManyClientsConcurrently(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20})
	errs := make(chan error, 4)
	for w := range 4 {
		go func() {
			c, err := Dial(context.Background(), d.path, ClientOptions{SharedArena: w%2 == 0})
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for i := range 200 {
				k := key(w*1000 + i%20)
				v := value(w*1000+i%20, 900)
				if ok, reason, err := c.Set(ns, k, v, SetOptions{}); err != nil || !ok {
					errs <- fmt.Errorf("set: %v %q", err, reason)
					return
				}
				got, _, ok, err := c.Get(ns, k, nil)
				if err != nil {
					errs <- err
					return
				}
				if ok && !bytes.Equal(got, v) {
					errs <- fmt.Errorf("client %d read wrong bytes for key %d", w, i%20)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func TestListenRejectsLongPath(t *testing.T) {
	long := "/" + string(bytes.Repeat([]byte("a"), MaxSocketPath))
	if _, err := Listen(long); !errors.Is(err, ErrConfig) {
		t.Fatalf("err %v", err)
	}
}

func TestAcceptSurvivesFDExhaustion(t *testing.T) {
	d := startDaemon(t, daemonOpts{})
	servetest.ExhaustFDs(t, func() (io.Closer, error) { return net.Dial("unix", d.path) })
	testkit.Eventually(t, "kvd serving after fd exhaustion", func() bool {
		c, err := Dial(context.Background(), d.path, ClientOptions{ClientID: t.Name()})
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func TestMaxConns(t *testing.T) {
	d := startDaemon(t, daemonOpts{serverOpt: ServerOptions{MaxConns: 1}})
	_ = dial(t, d, ClientOptions{})
	if c, err := Dial(context.Background(), d.path, ClientOptions{ClientID: t.Name(), Timeout: 2 * time.Second}); err == nil {
		c.Close()
		t.Fatal("second connection over MaxConns 1 was served")
	}
	if d.srv.Refused.Load() != 1 {
		t.Fatalf("refused %d", d.srv.Refused.Load())
	}
}

// TestBatchGetReplyOverFrameLimit: a batch_get naming one large key many
// times gets reply_too_large, not a giant frame, and the connection's
// next exchange is well formed.
func TestBatchGetReplyOverFrameLimit(t *testing.T) {
	d := startDaemon(t, daemonOpts{maxBytes: 4 << 20, serverOpt: ServerOptions{MaxFrameBytes: 64 << 10}})
	c := dial(t, d, ClientOptions{})
	v := value(1, 10<<10)
	if ok, reason, err := c.Set(ns, key(1), v, SetOptions{}); err != nil || !ok {
		t.Fatalf("set: %v %s", err, reason)
	}
	keys := make([][]byte, 10)
	for i := range keys {
		keys[i] = key(1)
	}
	if _, err := c.BatchGet(ns, keys); !errors.Is(err, ErrServer) || !bytes.Contains([]byte(err.Error()), []byte("reply_too_large")) {
		t.Fatalf("batch_get over the limit: %v", err)
	}
	got, err := c.BatchGet(ns, keys[:3])
	if err != nil || len(got) != 3 || !bytes.Equal(got[2], v) {
		t.Fatalf("next batch_get: %v", err)
	}
	if d.srv.RepliesTooLarge.Load() != 1 {
		t.Fatalf("replies too large %d", d.srv.RepliesTooLarge.Load())
	}
}

// TestLeaseCapPerConnection: one connection cannot lease more than its
// cap (the refusal names the cause, and other writers are unaffected),
// and an uncommitted lease lapses after LeaseTimeout.
func TestLeaseCapPerConnection(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20, serverOpt: ServerOptions{MaxLeasesPerConn: 3, LeaseTimeout: 300 * time.Millisecond}})
	hog := dial(t, d, ClientOptions{SharedArena: true})
	for i := range 3 {
		if l, err := hog.Reserve(1000); err != nil || l.Token == 0 {
			t.Fatalf("reserve %d: %+v %v", i, l, err)
		}
	}
	if l, err := hog.Reserve(1000); err != nil || l.Token != 0 || l.Reason != ReasonTooManyLeases {
		t.Fatalf("reserve over the cap: %+v %v", l, err)
	}
	other := dial(t, d, ClientOptions{SharedArena: true})
	if l, err := other.Reserve(1000); err != nil || l.Token == 0 {
		t.Fatalf("another connection's reserve: %+v %v", l, err)
	}
	// The hog stays silent past its leases' deadline: it is closed and
	// its slots return.
	time.Sleep(400 * time.Millisecond)
	if _, err := hog.Reserve(1000); err == nil {
		t.Fatal("a connection silent past its lease deadline was kept")
	}
	testkit.Eventually(t, "3 leases cancelled", func() bool { return d.store.Counters().LeasesCancelled >= 3 })
	if d.srv.LeasesRefused.Load() != 1 {
		t.Fatalf("refused %d", d.srv.LeasesRefused.Load())
	}
}

// TestLeaseHolderNotReadingClosed: a connection that holds a lease and
// sends requests without reading their replies (its writes block) is
// closed at the lease's deadline like a silent one, and the lease
// released; without leases, what such a connection costs is its own
// blocked reply (back-pressure).
func TestLeaseHolderNotReadingClosed(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 4 << 20, serverOpt: ServerOptions{LeaseTimeout: 300 * time.Millisecond}})
	c := dial(t, d, ClientOptions{})
	v := value(1, 200<<10)
	if ok, reason, err := c.Set(ns, key(1), v, SetOptions{}); err != nil || !ok {
		t.Fatalf("set: %v %s", err, reason)
	}
	raw := rawConn(t, d)
	en := NewEncoder()
	en.Begin(OpSetReserve, 1)
	en.Int("size", 100)
	writeFrame(t, raw, en.Frame()[4:])
	if m, err := readMsg(t, raw); err != nil || m.LeaseToken == 0 {
		t.Fatalf("reserve: %+v %v", m, err)
	}
	// 64 gets of a 200 KiB value, none read: far more than the socket
	// buffers hold, so the server's write blocks.
	en.Begin(OpGet, 3)
	en.Bin("key", key(1))
	en.Str("model", ns.Model)
	en.Str("compat_key", ns.CompatKey)
	get := en.Frame()
	var req []byte
	for range 64 {
		req = append(req, get...)
	}
	if _, err := raw.Write(req); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the lease released with its connection", func() bool {
		c := d.store.Counters()
		return c.LeasesActive == 0 && c.LeasesCancelled == 1
	})
}
