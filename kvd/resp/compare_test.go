package resp

import (
	"bytes"
	"strings"
	"testing"

	"github.com/infera/infera/internal/redistest"
	"github.com/infera/infera/kvd"
)

// step is one request of a session replayed against both servers.
type step struct {
	raw  []byte // sent as is
	eof  bool   // the server closes the connection after the reply
	note string
}

func cmd(args ...string) step { return step{raw: encode(args...), note: strings.Join(args, " ")} }

// replay sends the same session to redis-server and to the listener and
// requires byte-identical replies.
func replay(t *testing.T, redisAddr, kvdAddr string, steps []step) {
	t.Helper()
	rc, kc := dialRaw(t, redisAddr), dialRaw(t, kvdAddr)
	for i, s := range steps {
		want := rc.do(s.raw)
		got := kc.do(s.raw)
		if !bytes.Equal(got, want) {
			t.Errorf("step %d (%s):\n redis %q\n kvd   %q", i, s.note, trim(want), trim(got))
		}
		if s.eof {
			if !rc.eof() || !kc.eof() {
				t.Errorf("step %d (%s): both servers should close the connection", i, s.note)
			}
			return
		}
	}
}

func trim(b []byte) []byte {
	if len(b) > 200 {
		return append(b[:200:200], "..."...)
	}
	return b
}

// TestRedisParity replays client sessions against a real redis-server
// and the listener: every reply must be the same bytes.
func TestRedisParity(t *testing.T) {
	rs := redistest.Start(t)
	kl := startListener(t, Options{}, nil)
	big := strings.Repeat("v", 3<<20) // inline in kvd (over the 2 MiB slot)
	mid := strings.Repeat("m", 100<<10)
	binary := "a\r\nb\x00c$*\r\n"
	replay(t, rs.Addr, kl.addr, []step{
		cmd("PING"), cmd("ping", "hello"), cmd("PING", "a", "b"), cmd("ECHO", "x"), cmd("ECHO"),
		cmd("GET", "missing"), cmd("SET", "k", "v"), cmd("GET", "k"), cmd("get", "k"),
		cmd("SET", "k", "v2", "NX"), cmd("GET", "k"), cmd("SET", "k2", "v", "nx"), cmd("SET", "k", "v3", "XX"),
		cmd("SET", "k3", "v", "XX"), cmd("GET", "k3"), cmd("SET", "k", "v", "EX", "100"), cmd("SET", "k", "v", "PX", "100000"),
		cmd("SET", "k", "v", "EX", "0"), cmd("SET", "k", "v", "EX", "-1"), cmd("SET", "k", "v", "EX", "abc"),
		cmd("SET", "k", "v", "EX", "01"), cmd("SET", "k", "v", "EX"), cmd("SET", "k", "v", "NX", "XX"),
		cmd("SET", "k", "v", "EX", "10", "PX", "10"), cmd("SET", "k", "v", "FOO"), cmd("SET", "k", "new", "GET"),
		cmd("SET", "fresh", "x", "GET"), cmd("SET", "k", "v4", "NX", "GET"), cmd("SET", "nk", "v", "XX", "GET"),
		cmd("SET"), cmd("SET", "k"), cmd("GET"), cmd("GET", "a", "b"),
		cmd("MSET", "a", "1", "b", "2"), cmd("MSET", "a"), cmd("MSET", "a", "1", "b"), cmd("MGET", "a", "b", "nope", "a"), cmd("MGET"),
		cmd("EXISTS", "a", "b", "nope", "a"), cmd("EXISTS"), cmd("DEL", "a", "nope"), cmd("DEL", "b", "b"), cmd("EXISTS", "a", "b"), cmd("DEL"),
		cmd("SET", "e", ""), cmd("GET", "e"), cmd("SET", "bin", binary), cmd("GET", "bin"),
		cmd("SET", "mid", mid), cmd("GET", "mid"), cmd("SET", "big", big), cmd("GET", "big"), cmd("MGET", "mid", "big", "e"),
		cmd("SELECT", "0"), cmd("SELECT", "x"), cmd("SELECT", "99"), cmd("SELECT", "99999999999"), cmd("SELECT"),
		cmd("CLIENT", "SETNAME", "myname"), cmd("CLIENT", "GETNAME"), cmd("CLIENT", "SETNAME", "bad name"),
		cmd("CLIENT", "SETNAME"), cmd("CLIENT"), cmd("client", "foo"), cmd("CLIENT", "SETNAME", ""), cmd("CLIENT", "GETNAME"),
		cmd("FOO"), cmd("foo", "bar", "baz"), cmd("FOO", strings.Repeat("x", 200), "y"), cmd("FOO", "a\r\nb"),
		cmd("HELLO", "4"), cmd("HELLO", "x"), cmd("HELLO", "1"), cmd("HELLO", "2", "FOO"), cmd("HELLO", "2", "SETNAME", "bad name"),
		cmd("AUTH", "pass"), cmd("AUTH", "default", "whatever"), cmd("AUTH", "alice", "x"), cmd("AUTH", "a", "b", "c"),
		cmd("CONFIG", "GET", "appendonly"), cmd("CONFIG", "GET", "nosuchparam"), cmd("CONFIG"), cmd("COMMAND", "INFO", "nosuchcmd"),
		cmd("DBSIZE"),
		{raw: []byte("PING\r\n"), note: "inline PING"}, {raw: []byte("ECHO  hi  \n"), note: "inline ECHO"},
		{raw: []byte("*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n"), note: "multibulk ECHO"},
		{raw: []byte("*0\r\n*1\r\n$4\r\nPING\r\n"), note: "empty multibulk then PING"},
		{raw: []byte("\r\nPING\r\n"), note: "empty inline line then PING"},
		cmd("QUIT"),
	})
	// RESP3 is refused as Redis refuses a version it lacks; HELLO 2 and
	// HELLO without a version answer as Redis does but for the server's
	// own connection id.
	kc := dialRaw(t, kl.addr)
	if got := kc.do(encode("HELLO", "3")); string(got) != "-NOPROTO unsupported protocol version\r\n" {
		t.Errorf("HELLO 3: %q", got)
	}
	rc := dialRaw(t, rs.Addr)
	for _, hello := range [][]string{{"HELLO"}, {"HELLO", "2"}, {"HELLO", "2", "SETNAME", "lm", "AUTH", "default", "x"}} {
		want, got := rc.do(encode(hello...)), kc.do(encode(hello...))
		if norm(want) != norm(got) {
			t.Errorf("%v:\n redis %q\n kvd   %q", hello, want, got)
		}
	}
	if got := kc.do(encode("CLIENT", "SETINFO", "LIB-NAME", "redis-py")); string(got) != "+OK\r\n" {
		t.Errorf("CLIENT SETINFO: %q", got) // Redis 7.2's reply; 7.0 lacks the subcommand
	}
	if got := kc.do(encode("CLIENT", "SETINFO", "lib-ver", "5.0.1")); string(got) != "+OK\r\n" {
		t.Errorf("CLIENT SETINFO lib-ver: %q", got)
	}
	if got := kc.do(encode("CLIENT", "SETINFO", "color", "red")); string(got) != "-ERR Unrecognized option 'color'\r\n" {
		t.Errorf("CLIENT SETINFO color: %q", got)
	}
	// Redis 7.2 replies with addReplyErrorFormat, which turns CR and LF
	// into spaces: no reply injection.
	if got := kc.do(encode("CLIENT", "SETINFO", "x\r\n+OK", "red")); string(got) != "-ERR Unrecognized option 'x  +OK'\r\n" {
		t.Errorf("CLIENT SETINFO with CR/LF: %q", got)
	}
}

// TestRedisParityHostile: the replies a hostile or careless client could
// make differ, compared with redis-server 7.0.
func TestRedisParityHostile(t *testing.T) {
	rs := redistest.Start(t)
	kl := startListener(t, Options{}, nil)
	replay(t, rs.Addr, kl.addr, []step{
		cmd("HELLO", "2", "x\r\n+OK"), cmd("HELLO", "2", "\n"),
		cmd("SET", "k", "v", "EX", "9223372036854775"), cmd("SET", "k", "v", "EX", "9223372036854774"),
		cmd("SET", "k", "v", "PX", "9223372036854775807"), cmd("SET", "k", "v", "PX", "9223372036854000000"),
		cmd("SET", "k", "v", "EX", "9223372036854776"), cmd("SET", "k", "v", "EXAT", "9223372036854775"),
		cmd("SET", "k", "v", "PX", "9223372036854775808"), cmd("GET", "k"),
	})
}

// TestRedisParityFailedSetGet: a SET … GET refused for memory answers the
// error in place of the old value and keeps the replies pipelined before
// it (redis-server at maxmemory answers -OOM the same way).
func TestRedisParityFailedSetGet(t *testing.T) {
	rs := redistest.Start(t, "--maxmemory", "1")
	kl := startListener(t, Options{}, func(o *kvd.StoreOptions) { o.Arena, o.SlotBytes, o.MaxBytes = nil, 0, 1<<20 })
	big := strings.Repeat("b", 2<<20) // over kvd's whole store
	pipe := append(append(encode("PING"), encode("ECHO", "before")...), encode("SET", "k", big, "GET")...)
	pipe = append(pipe, encode("PING")...)
	var replies [2][]byte
	for i, addr := range []string{rs.Addr, kl.addr} {
		c := dialRaw(t, addr)
		replies[i] = c.do(pipe)
		for range 3 {
			replies[i] = append(replies[i], c.read()...)
		}
	}
	// Redis's OOM text, then kvd's reason (which value held the memory)
	// before the period: clients match the "-OOM" code and the prefix.
	const oom = "-OOM command not allowed when used memory > 'maxmemory'"
	want := "+PONG\r\n$6\r\nbefore\r\n" + oom + ".\r\n+PONG\r\n"
	if string(replies[0]) != want {
		t.Fatalf("redis: %q, want %q", replies[0], want)
	}
	k := string(replies[1])
	head, tail, ok := strings.Cut(k, oom)
	if !ok || head != "+PONG\r\n$6\r\nbefore\r\n" || !strings.HasSuffix(tail, ".\r\n+PONG\r\n") || strings.Count(tail, "\r\n") != 2 {
		t.Fatalf("pipelined PING ECHO SET-GET(oom) PING:\n redis %q\n kvd   %q", replies[0], replies[1])
	}
}

// norm blanks the connection id in a HELLO reply.
func norm(b []byte) string {
	s := string(b)
	i := strings.Index(s, "$2\r\nid\r\n:")
	if i < 0 {
		return s
	}
	j := strings.Index(s[i+9:], "\r\n")
	return s[:i+9] + "N" + s[i+9+j:]
}

// TestRedisParityProtocolErrors: malformed requests get Redis's error and
// the connection is closed.
func TestRedisParityProtocolErrors(t *testing.T) {
	rs := redistest.Start(t)
	kl := startListener(t, Options{}, nil)
	for _, raw := range []string{
		"*1\r\n:x\r\n", "*abc\r\n", "*1\r\n$-5\r\n", "*1\r\n$abc\r\n", "*-1\r\n*1\r\n+x\r\n",
		"*1\r\n$" + "9999999999" + "\r\n", "*01\r\n",
	} {
		replay(t, rs.Addr, kl.addr, []step{{raw: []byte(raw), eof: true, note: raw}})
	}
}

// TestRedisParityAuth compares password and ACL-user sessions.
func TestRedisParityAuth(t *testing.T) {
	t.Run("requirepass", func(t *testing.T) {
		rs := redistest.Start(t, "--requirepass", "secret")
		kl := startListener(t, Options{Password: "secret"}, nil)
		replay(t, rs.Addr, kl.addr, []step{
			cmd("GET", "k"), cmd("PING"), cmd("FOO"), cmd("GET"), cmd("HELLO", "2"), cmd("HELLO", "2", "AUTH", "default", "bad"),
			cmd("AUTH", "bad"), cmd("AUTH", "default", "bad"), cmd("AUTH", "secret"), cmd("SET", "k", "v"), cmd("GET", "k"),
		})
		replay(t, rs.Addr, kl.addr, []step{cmd("AUTH", "default", "secret"), cmd("GET", "k")})
		replay(t, rs.Addr, kl.addr, []step{{raw: []byte("*11\r\n"), eof: true, note: "unauthenticated 11 args"}})
		replay(t, rs.Addr, kl.addr, []step{{raw: []byte("*2\r\n$4\r\nAUTH\r\n$16385\r\n"), eof: true, note: "unauthenticated long bulk"}})
	})
	t.Run("acl-user", func(t *testing.T) {
		rs := redistest.Start(t, "--user", "default", "off", "--user", "alice", "on", ">pw", "~*", "&*", "+@all")
		kl := startListener(t, Options{User: "alice", Password: "pw"}, nil)
		replay(t, rs.Addr, kl.addr, []step{
			cmd("GET", "k"), cmd("AUTH", "pw"), cmd("AUTH", "alice", "bad"), cmd("AUTH", "alice", "pw"), cmd("SET", "k", "v"), cmd("GET", "k"),
		})
		rc, kc := dialRaw(t, rs.Addr), dialRaw(t, kl.addr)
		h := encode("HELLO", "2", "AUTH", "alice", "pw")
		if want, got := rc.do(h), kc.do(h); norm(want) != norm(got) {
			t.Errorf("HELLO AUTH:\n redis %q\n kvd   %q", want, got)
		}
	})
}

// TestRedisParityMSetAllOrNothing: an MSET one of whose values kvd cannot
// store is refused whole, as redis-server at maxmemory refuses it (-OOM,
// no pair stored), and the pairs before the refused one are not stored.
func TestRedisParityMSetAllOrNothing(t *testing.T) {
	rs := redistest.Start(t, "--maxmemory", "1")
	kl := startListener(t, Options{}, func(o *kvd.StoreOptions) { o.Arena, o.SlotBytes, o.MaxBytes = nil, 0, 1<<20 })
	big := strings.Repeat("b", 2<<20) // over kvd's whole store
	const oom = "-OOM command not allowed when used memory > 'maxmemory'"
	pipe := append(encode("MSET", "a", "1", "b", big, "c", "3"), encode("PING")...)
	var replies [2][]byte
	for i, addr := range []string{rs.Addr, kl.addr} {
		c := dialRaw(t, addr)
		replies[i] = append(c.do(pipe), c.read()...)
	}
	if string(replies[0]) != oom+".\r\n+PONG\r\n" {
		t.Fatalf("redis: %q", replies[0])
	}
	if k := string(replies[1]); !strings.HasPrefix(k, oom) || !strings.HasSuffix(k, ".\r\n+PONG\r\n") || strings.Count(k, "\r\n") != 2 {
		t.Fatalf("MSET with a value over kvd's store:\n redis %q\n kvd   %q", replies[0], replies[1])
	}
	replay(t, rs.Addr, kl.addr, []step{cmd("EXISTS", "a", "b", "c"), cmd("MGET", "a", "b", "c"), cmd("DBSIZE")})
}
