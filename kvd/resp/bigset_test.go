package resp

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/infera/infera/internal/redistest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd"
)

// bigValue is a value a SET reads straight into its slot.
func bigValue(n int, seed byte) []byte {
	v := make([]byte, n)
	for i := range v {
		v[i] = seed + byte(i%251)
	}
	return v
}

// noLeakedSlots: every used arena slot holds an entry (no slot taken for
// a value was left behind).
func noLeakedSlots(t *testing.T, st *kvd.Store) {
	t.Helper()
	c := st.Counters()
	var used int64
	for _, cs := range c.Classes {
		used += cs.UsedSlots
	}
	if used != c.ArenaEntries || c.LeasesActive != 0 {
		t.Fatalf("%d arena slots used for %d entries (%d leases)", used, c.ArenaEntries, c.LeasesActive)
	}
}

// drip writes b in pieces cut at the given offsets, pausing between them
// so the server reads them separately.
func drip(t *testing.T, c *rconn, b []byte, cuts ...int) {
	t.Helper()
	prev := 0
	for _, cut := range append(cuts, len(b)) {
		cut = min(max(cut, prev), len(b))
		if _, err := c.c.Write(b[prev:cut]); err != nil {
			t.Fatal(err)
		}
		prev = cut
		time.Sleep(2 * time.Millisecond)
	}
}

// TestBigSet: large SET values read straight into their slots are stored
// byte for byte, whole or dripped in pieces cut anywhere (in the header,
// in the value, between its CR and LF, in the options), pipelined among
// other requests, with options; a SET that does not store gives its slot
// back, and so does a connection closed in the middle of a value.
func TestBigSet(t *testing.T) {
	l := startListener(t, Options{}, nil)
	c := dialRaw(t, l.addr)
	expect := func(req, want []byte, cuts ...int) {
		t.Helper()
		drip(t, c, req, cuts...)
		if got := c.read(); !bytes.Equal(got, want) {
			t.Fatalf("%.50q: got %.80q, want %.80q", req, got, want)
		}
	}
	ok := []byte("+OK\r\n")
	for i, n := range []int{bigSetMin, 64 << 10, 256<<10 + 7, 1 << 20} {
		v := bigValue(n, byte(i))
		k := "k" + strconv.Itoa(n)
		req := encode("SET", k, string(v))
		hdr := bytes.Index(req, []byte("$"+strconv.Itoa(n)))
		start := hdr + len("$"+strconv.Itoa(n)+"\r\n")
		expect(req, ok)                                                     // whole
		expect(req, ok, 5, hdr+2, start+100, start+n/2, start+n, start+n+1) // dripped
		expect(req, ok, start+n-1)
		expect(encode("GET", k), appendBulk(nil, v))
	}
	// Every one but maybe the first (whole in the first read, before the
	// connection was known to send large values).
	if l.srv.C.BigSets.Load() < 11 {
		t.Fatalf("%d values read into their slots, want every large SET's but the first", l.srv.C.BigSets.Load())
	}
	// Options, and SETs that do not store.
	v1, v2 := bigValue(70<<10, 1), bigValue(70<<10, 2)
	expect(encode("SET", "o", string(v1), "EX", "100"), ok, 40, 70<<10)
	expect(encode("SET", "o", string(v2), "NX"), []byte("$-1\r\n"), 40, 1000)
	expect(encode("SET", "o", string(v2), "XX", "GET"), appendBulk(nil, v1), 30, 5000, 70<<10+30)
	expect(encode("SET", "o", string(v1), "FOO"), []byte(replySyntax), 50)
	expect(encode("SET", "o", string(v1), "EXAT", "1"), ok, 50)
	expect(encode("GET", "o"), []byte("$-1\r\n"))
	expect(encode("SET", "x", string(v2), "XX"), []byte("$-1\r\n"), 50)
	noLeakedSlots(t, l.store)
	// Pipelined: small requests and two large SETs in one write.
	var req, want []byte
	req = append(append(req, encode("PING")...), encode("SET", "p1", string(v1))...)
	req = append(append(req, encode("SET", "p2", string(v2), "PX", "100000")...), encode("GET", "p1")...)
	req = append(req, encode("MGET", "p2", "nope")...)
	want = append(append(want, "+PONG\r\n+OK\r\n+OK\r\n"...), appendBulk(nil, v1)...)
	want = append(appendBulk(appendArray(want, 2), v2), "$-1\r\n"...)
	drip(t, c, req, 100, 200, 70<<10)
	got := make([]byte, 0, len(want))
	for len(got) < len(want) {
		got = append(got, c.read()...)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("pipelined: got %d bytes, want %d", len(got), len(want))
	}
	noLeakedSlots(t, l.store)
	// A header's claim alone takes no slot: a new connection's 1 MiB SET
	// with 1000 bytes of its value sent holds none.
	c3 := dialRaw(t, l.addr)
	sets := l.srv.C.BigSets.Load()
	drip(t, c3, encode("SET", "claim", string(bigValue(1<<20, 4)))[:1100])
	if _, err := c.c.Write(encode("PING")); err != nil || string(c.read()) != "+PONG\r\n" {
		t.Fatal("PING after the claim")
	}
	noLeakedSlots(t, l.store)
	if l.srv.C.BigSets.Load() != sets {
		t.Fatal("a slot was taken for a value's header")
	}
	c3.c.Close()
	// A connection closed in the middle of a value gives its slot back.
	c2 := dialRaw(t, l.addr)
	drip(t, c2, encode("SET", "gone", string(v1))[:40<<10])
	c2.c.Close()
	testkit.Eventually(t, "one connection open", func() bool { return l.srv.C.ConnsActive.Load() == 1 }) // c's
	if l.srv.C.BigSets.Load() != sets+1 {
		t.Fatal("the value was not being read into a slot")
	}
	noLeakedSlots(t, l.store)
	expect(encode("EXISTS", "gone"), []byte(":0\r\n"))
}

// TestBigSetRedisParity: large SETs (read into their slots) answer as
// redis-server does, byte for byte, protocol errors after the value
// included.
func TestBigSetRedisParity(t *testing.T) {
	rs := redistest.Start(t)
	kl := startListener(t, Options{}, nil)
	v := strings.Repeat("b", 64<<10)
	w := strings.Repeat("w", 40<<10)
	raw := func(note, s string) step { return step{raw: []byte(s), note: note} }
	replay(t, rs.Addr, kl.addr, []step{
		cmd("SET", "k", v), cmd("GET", "k"), cmd("SET", "k", w, "NX"), cmd("SET", "k", w, "XX", "GET"), cmd("GET", "k"),
		cmd("SET", "k", v, "EX", "0"), cmd("SET", "k", v, "EX", "abc"), cmd("SET", "k", v, "BAR"), cmd("SET", "k", v, "EX"),
		cmd("set", "n", v, "nx", "get"), cmd("SET", "n", w, "PXAT", "1"), cmd("GET", "n"),
		raw("no CRLF after the value", "*3\r\n$3\r\nSET\r\n$1\r\nz\r\n$40000\r\n"+strings.Repeat("z", 40000)+"XY"), cmd("GET", "z"),
		{raw: []byte("*4\r\n$3\r\nSET\r\n$1\r\nq\r\n$40000\r\n" + strings.Repeat("q", 40000) + "\r\nXYZ\r\n"), eof: true, note: "garbage after the value"},
	})
}

// TestBigSetAlloc: a large SET read into its slot allocates nothing once
// the connection has sent one.
func TestBigSetAlloc(t *testing.T) {
	l := startListener(t, Options{}, nil)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	cn := &conn{s: l.srv, fd: fds[0], authed: true, in: make([]byte, readBuf)}
	req := encode("SET", "k", string(bigValue(64<<10, 3)))
	one := func() {
		if _, err := unix.Write(fds[1], req); err != nil {
			t.Fatal(err)
		}
		for len(cn.out) == 0 {
			if _, _, err := cn.read(); err != nil {
				t.Fatal(err)
			}
			if cn.incomplete() {
				continue
			}
			if err := cn.process(); err != nil {
				t.Fatal(err)
			}
		}
		if string(cn.out) != "+OK\r\n" {
			t.Fatalf("reply %q", cn.out)
		}
		cn.out = cn.out[:0]
	}
	one()
	before := l.srv.C.BigSets.Load()
	if n := testing.AllocsPerRun(50, one); n != 0 {
		t.Errorf("large SET: %.1f allocations per command", n)
	}
	if l.srv.C.BigSets.Load() < before+50 {
		t.Fatal("the SETs were not read into their slots")
	}
	noLeakedSlots(t, l.store)
}

// FuzzBigSetHeader: whatever bigSetHeader accepts is a SET whose value
// header starts at hdr, and the rewrite a large SET makes (its value
// header turned into "$0\r\n", the value itself elsewhere) parses to the
// same request with an empty value: the parser, options and errors are
// unchanged by reading the value into its slot.
func FuzzBigSetHeader(f *testing.F) {
	for _, s := range []string{
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$40000\r\n", "*5\r\n$3\r\nset\r\n$3\r\nkey\r\n$65536\r\nxx",
		"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n$5\r\n", "*2\r\n$3\r\nSET\r\n$1\r\nk\r\n", "*3\r\n$3\r\nSET\r\n$1\r\nkXY$3\r\n",
		"*4\r\n$3\r\nsEt\r\n$0\r\n\r\n$7\r\n",
	} {
		f.Add([]byte(s), []byte("\r\n$2\r\nNX\r\n"))
	}
	f.Fuzz(func(t *testing.T, b, rest []byte) {
		hdr, start, vlen, ok := bigSetHeader(b)
		if !ok {
			return
		}
		if hdr >= start || start > len(b) || vlen < 0 || !bytes.HasPrefix(b[hdr:], []byte("$"+strconv.Itoa(vlen)+"\r\n")) {
			t.Fatalf("hdr %d start %d vlen %d of %q", hdr, start, vlen, b)
		}
		vlen = min(vlen, 1<<16)
		value := bytes.Repeat([]byte{'v'}, vlen)
		head := append(append([]byte(nil), b[:hdr]...), "$"+strconv.Itoa(vlen)+"\r\n"...)
		whole := append(append(append([]byte(nil), head...), value...), rest...)
		rewritten := append(append(append([]byte(nil), b[:hdr]...), "$0\r\n"...), rest...)
		wargs, wn, _, werr := Parse(whole, nil, 1<<20, false)
		rargs, rn, _, rerr := Parse(rewritten, nil, 1<<20, false)
		if (werr == nil) != (rerr == nil) || (werr != nil && werr.Error() != rerr.Error()) {
			t.Fatalf("errors differ: %v / %v", werr, rerr)
		}
		if (wn == 0) != (rn == 0) || (wn > 0 && wn-rn != len(head)-hdr+vlen-4) || len(wargs) != len(rargs) {
			t.Fatalf("parsed %d (%d args) vs rewritten %d (%d args)", wn, len(wargs), rn, len(rargs))
		}
		if wn == 0 {
			return
		}
		if !eqFold(wargs[0], "set") || len(wargs) < 3 || !bytes.Equal(wargs[2], value) || len(rargs[2]) != 0 {
			t.Fatalf("not a SET of the value: %q", wargs[:min(len(wargs), 3)])
		}
		for i := range wargs {
			if i != 2 && !bytes.Equal(wargs[i], rargs[i]) {
				t.Fatalf("argument %d differs: %q / %q", i, wargs[i], rargs[i])
			}
		}
	})
}
