package resp

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd"
)

// TestNamespaceAndRetention: RESP keys land in the configured kvd
// namespace with the configured retention, so protocol clients see them.
func TestNamespaceAndRetention(t *testing.T) {
	l := startListener(t, Options{Model: "lmcache", CompatKey: "v1", Retention: "long"}, nil)
	c := dialRaw(t, l.addr)
	if got := c.do(encode("SET", "chunk", "payload")); string(got) != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	h := l.store.Get([]byte("lmcache"), []byte("v1"), []byte("chunk"), nil)
	if !h.Found || h.Retention != kvd.RetentionLong {
		t.Fatalf("store hit %+v", h)
	}
	if v, ok := l.store.AppendHit(nil, h); !ok || string(v) != "payload" {
		t.Fatalf("value %q", v)
	}
	if h := l.store.Get(nil, nil, []byte("chunk"), nil); h.Found {
		t.Fatal("key visible outside its namespace")
	}
	// A value a protocol client stored is readable over RESP.
	l.store.Set(&kvd.SetArgs{Model: []byte("lmcache"), CompatKey: []byte("v1"), Key: []byte("fromuds"), Value: []byte("x"), Retention: []byte("long")})
	if got := c.do(encode("GET", "fromuds")); string(got) != "$1\r\nx\r\n" {
		t.Fatalf("GET: %q", got)
	}
	if _, err := NewServer(l.store, Options{Retention: "forever"}); err == nil {
		t.Fatal("bad retention accepted")
	}
}

// TestExpiry: PX and EX become kvd TTLs.
func TestExpiry(t *testing.T) {
	l := startListener(t, Options{}, nil)
	c := dialRaw(t, l.addr)
	c.do(encode("SET", "k", "v", "PX", "50"))
	c.do(encode("SET", "p", "v", "EX", "100"))
	c.do(encode("SET", "gone", "v"))
	if got := c.do(encode("SET", "gone", "v", "PXAT", "1")); string(got) != "+OK\r\n" {
		t.Fatalf("SET PXAT past: %q", got)
	}
	time.Sleep(150 * time.Millisecond)
	if got := c.do(encode("MGET", "k", "p", "gone")); string(got) != "*3\r\n$-1\r\n$1\r\nv\r\n$-1\r\n" {
		t.Fatalf("after expiry: %q", got)
	}
}

// TestPipeline: many requests in one write get their replies in order.
func TestPipeline(t *testing.T) {
	l := startListener(t, Options{}, nil)
	c := dialRaw(t, l.addr)
	var req, want bytes.Buffer
	for i := range 2000 {
		k := "key:" + strconv.Itoa(i)
		req.Write(encode("SET", k, k))
		req.Write(encode("GET", k))
		want.WriteString("+OK\r\n")
		want.Write(appendBulkString(nil, k))
	}
	if _, err := c.c.Write(req.Bytes()); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	for range 4000 {
		got.Write(c.read())
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatal("pipelined replies differ")
	}
}

// TestRequestLimit: a client whose request outgrows MaxRequestBytes is
// disconnected.
func TestRequestLimit(t *testing.T) {
	l := startListener(t, Options{MaxRequestBytes: 1 << 20}, nil)
	c := dialRaw(t, l.addr)
	req := []byte("*1000000\r\n")
	for len(req) < 2<<20 {
		req = append(req, "$10\r\n0123456789\r\n"...)
	}
	_, _ = c.c.Write(req)
	if !c.eof() {
		t.Fatal("connection not closed")
	}
}

func TestAcceptSurvivesFDExhaustion(t *testing.T) {
	l := startListener(t, Options{}, nil)
	servetest.ExhaustFDs(t, func() (io.Closer, error) { return net.Dial("tcp", l.addr) })
	testkit.Eventually(t, "the listener serving after fd exhaustion", func() bool {
		c, err := net.DialTimeout("tcp", l.addr, time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_, _ = c.Write(encode("PING"))
		buf := make([]byte, 7)
		_, err = io.ReadFull(c, buf)
		return err == nil && string(buf) == "+PONG\r\n"
	})
}

func TestMaxClients(t *testing.T) {
	l := startListener(t, Options{MaxClients: 2}, nil)
	a, b := dialRaw(t, l.addr), dialRaw(t, l.addr)
	if got := a.do(encode("PING")); string(got) != "+PONG\r\n" {
		t.Fatalf("PING: %q", got)
	}
	_ = b.do(encode("PING"))
	c, err := net.Dial("tcp", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(c)
	if string(got) != "-ERR max number of clients reached\r\n" {
		t.Fatalf("over maxclients: %q", got)
	}
	if l.srv.C.Refused.Load() != 1 {
		t.Fatalf("refused %d", l.srv.C.Refused.Load())
	}
}
