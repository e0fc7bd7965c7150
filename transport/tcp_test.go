package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// tcpPair starts a serving engine and a client-only engine, closed at
// cleanup.
func tcpPair(t testing.TB) (srv, cli *TCP) {
	t.Helper()
	log := zerolog.Nop()
	if tt, ok := t.(*testing.T); ok {
		log = zerolog.New(zerolog.NewTestWriter(tt))
	}
	srv, err := NewTCP(TCPConfig{Listener: listen(t), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	cli, err = NewTCP(TCPConfig{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cli.Close(); err != nil {
			t.Error(err)
		}
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	})
	return srv, cli
}

func TestTCPConformance(t *testing.T) {
	srv, cli := tcpPair(t)
	conformance(t, srv, cli)
}

// A Desc without Len leaves range checks to the serving side.
func TestTCPPeerChecksRange(t *testing.T) {
	srv, cli := tcpPair(t)
	remote := mustRegister(t, srv, "r", make([]byte, 100))
	local := mustRegister(t, cli, "l", make([]byte, 100))
	d := remote.Desc()
	d.Len = 0
	for _, k := range []Kind{Read, Write} {
		err := Transfer(context.Background(), cli, []Op{{Kind: k, Local: local, Remote: d, RemoteOff: 50, Len: 51}})
		if !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("%s: %v, want ErrOutOfRange", k, err)
		}
	}
	// The connection survived both refusals.
	if err := Transfer(context.Background(), cli, []Op{{Kind: Write, Local: local, Remote: d, RemoteOff: 50, Len: 50}}); err != nil {
		t.Fatal(err)
	}
}

func TestTCPUnreachablePeer(t *testing.T) {
	ln := listen(t)
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	cli, err := NewTCP(TCPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	local := mustRegister(t, cli, "l", make([]byte, 8))
	err = Transfer(context.Background(), cli, []Op{{Kind: Read, Local: local, Remote: Desc{Peer: addr, Name: "x"}, Len: 8}})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("%v, want ErrUnavailable", err)
	}
}

// TestTCPAdmitAndLocalAddr: a serving engine with Admit serves only the
// remote addresses it admits; a client dialing from LocalAddr is one of
// them, a client dialing from another loopback address is not.
func TestTCPAdmitAndLocalAddr(t *testing.T) {
	admitted := net.ParseIP("127.0.0.2")
	srv, err := NewTCP(TCPConfig{Listener: listen(t), Log: zerolog.Nop(), Admit: func(a net.Addr) bool {
		ta, ok := a.(*net.TCPAddr)
		return ok && ta.IP.Equal(admitted)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	remote := mustRegister(t, srv, "r", []byte("12345678"))
	for _, tt := range []struct {
		local net.Addr
		ok    bool
	}{{nil, false}, {&net.TCPAddr{IP: admitted}, true}} {
		cli, err := NewTCP(TCPConfig{LocalAddr: tt.local, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 8)
		local := mustRegister(t, cli, "l", buf)
		err = Transfer(context.Background(), cli, []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: 8}})
		if tt.ok && (err != nil || string(buf) != "12345678") {
			t.Errorf("from %v: %v %q", tt.local, err, buf)
		}
		if !tt.ok && err == nil {
			t.Errorf("from %v: served, want refused", tt.local)
		}
		_ = cli.Close()
	}
}

func TestTCPClosed(t *testing.T) {
	srv, cli := tcpPair(t)
	remote := mustRegister(t, srv, "r", make([]byte, 8))
	local := mustRegister(t, cli, "l", make([]byte, 8))
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Register("again", make([]byte, 8)); !errors.Is(err, ErrClosed) {
		t.Fatalf("register after close: %v", err)
	}
	if err := Transfer(context.Background(), cli, []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: 8}}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("read from closed peer: %v, want ErrUnavailable", err)
	}
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Transfer(context.Background(), cli, []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: 8}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("submit on closed engine: %v, want ErrClosed", err)
	}
}

func TestTCPContextDone(t *testing.T) {
	srv, cli := tcpPair(t)
	remote := mustRegister(t, srv, "r", make([]byte, 8))
	local := mustRegister(t, cli, "l", make([]byte, 8))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Transfer(ctx, cli, []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: 8}}); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want ErrTimeout and context.Canceled", err)
	}
}

// A client sending a malformed header is disconnected; the server keeps
// serving others.
func TestTCPServerDropsBadFrame(t *testing.T) {
	srv, cli := tcpPair(t)
	remote := mustRegister(t, srv, "r", []byte("hello"))
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	bad := make([]byte, reqHeaderLen)
	copy(bad, "IFT1")
	bad[4] = 9 // no such op
	if _, err := c.Write(bad); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after bad frame: %d, %v, want EOF", n, err)
	}
	local := mustRegister(t, cli, "l", make([]byte, 5))
	if err := Transfer(context.Background(), cli, []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: 5}}); err != nil {
		t.Fatal(err)
	}
	if string(local.Bytes()) != "hello" {
		t.Fatalf("got %q", local.Bytes())
	}
}

// A peer answering with a malformed or mismatched response fails the batch
// with ErrProtocol, and the connection is not reused.
func TestTCPClientRejectsBadResponse(t *testing.T) {
	cases := map[string]func(req []byte) []byte{
		"bad magic": func([]byte) []byte { return make([]byte, respHeaderLen) },
		"wrong seq": func(req []byte) []byte {
			b := make([]byte, respHeaderLen)
			putRespHeader(b, &respHeader{seq: 77, n: 4})
			return b
		},
		"wrong length": func(req []byte) []byte {
			var h reqHeader
			_ = decodeReqHeader(req, &h)
			b := make([]byte, respHeaderLen)
			putRespHeader(b, &respHeader{seq: h.seq, n: 3})
			return b
		},
		"bytes after a failed read": func(req []byte) []byte {
			var h reqHeader
			_ = decodeReqHeader(req, &h)
			b := make([]byte, respHeaderLen, respHeaderLen+4)
			putRespHeader(b, &respHeader{status: statusNotFound, seq: h.seq})
			return append(b, 1, 2, 3, 4)
		},
	}
	for name, answer := range cases {
		t.Run(name, func(t *testing.T) {
			ln := listen(t)
			done := make(chan struct{})
			go func() {
				defer close(done)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer func() { _ = c.Close() }()
				req := make([]byte, reqHeaderLen+1)
				if _, err := io.ReadFull(c, req); err != nil {
					return
				}
				_, _ = c.Write(answer(req))
				_, _ = io.Copy(io.Discard, c)
			}()
			cli, err := NewTCP(TCPConfig{IOTimeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			local := mustRegister(t, cli, "l", make([]byte, 4))
			err = Transfer(context.Background(), cli, []Op{{Kind: Read, Local: local, Remote: Desc{Peer: ln.Addr().String(), Name: "x"}, Len: 4}})
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("%v, want ErrProtocol", err)
			}
			if err := cli.Close(); err != nil {
				t.Fatal(err)
			}
			_ = ln.Close()
			<-done
		})
	}
}

// A read's response arriving in pieces (a header split across segments,
// then the payload in parts) is reassembled, in batches of one and many.
func TestTCPResponseInPieces(t *testing.T) {
	ln := listen(t)
	want := []byte("0123456789abcdef")
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		req := make([]byte, reqHeaderLen+1)
		for {
			if _, err := io.ReadFull(c, req); err != nil {
				return
			}
			var h reqHeader
			_ = decodeReqHeader(req, &h)
			msg := make([]byte, respHeaderLen, respHeaderLen+len(want))
			putRespHeader(msg, &respHeader{seq: h.seq, n: h.n})
			msg = append(msg, want[h.off:h.off+h.n]...)
			for _, cut := range [][2]int{{0, 5}, {5, 23}, {23, 27}, {27, len(msg)}} {
				if _, err := c.Write(msg[cut[0]:cut[1]]); err != nil {
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
	}()
	cli, err := NewTCP(TCPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	local := mustRegister(t, cli, "l", make([]byte, 2*len(want)))
	remote := Desc{Peer: ln.Addr().String(), Name: "x", Len: uint64(len(want))}
	for _, n := range []int{1, 2} {
		clear(local.Bytes())
		ops := make([]Op, n)
		for i := range ops {
			ops[i] = Op{Kind: Read, Local: local, LocalOff: uint64(i * len(want)), Remote: remote, Len: uint64(len(want))}
		}
		if err := Transfer(context.Background(), cli, ops); err != nil {
			t.Fatal(err)
		}
		for i := range ops {
			if got := local.Bytes()[i*len(want) : (i+1)*len(want)]; !bytes.Equal(got, want) {
				t.Fatalf("batch of %d, op %d: %q", n, i, got)
			}
		}
	}
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	_ = ln.Close()
	<-done
}

func TestTCPZeroAllocs(t *testing.T) {
	srv, cli := tcpPair(t)
	const size = 64 << 10
	remote := mustRegister(t, srv, "kv", make([]byte, size))
	local := mustRegister(t, cli, "l", make([]byte, size))
	ctx := context.Background()
	ops := []Op{
		{Kind: Read, Local: local, Remote: remote.Desc(), Len: size},
		{Kind: Write, Local: local, Remote: remote.Desc(), Len: size},
	}
	if err := Transfer(ctx, cli, ops); err != nil { // warm the connection
		t.Fatal(err)
	}
	var err error
	allocs := testing.AllocsPerRun(200, func() {
		if e := Transfer(ctx, cli, ops); e != nil {
			err = e
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per transfer, want 0", allocs)
	}
}

func FuzzDecodeRequestHeader(f *testing.F) {
	good := make([]byte, reqHeaderLen)
	putReqHeader(good, &reqHeader{op: Write, nameLen: 3, seq: 9, off: 4096, n: 65536})
	f.Add(good)
	f.Add(make([]byte, reqHeaderLen))
	f.Add([]byte("IFT1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h reqHeader
		if decodeReqHeader(b, &h) != nil {
			return
		}
		if h.nameLen == 0 || h.nameLen > MaxNameLen || h.n == 0 || h.n > MaxOpLen || (h.op != Read && h.op != Write) {
			t.Fatalf("accepted invalid header %+v", h)
		}
		again := make([]byte, reqHeaderLen)
		putReqHeader(again, &h)
		if !bytes.Equal(again, b[:reqHeaderLen]) {
			t.Fatalf("round trip differs: %x vs %x", again, b[:reqHeaderLen])
		}
	})
}

func FuzzDecodeResponseHeader(f *testing.F) {
	good := make([]byte, respHeaderLen)
	putRespHeader(good, &respHeader{seq: 3, n: 1 << 20})
	f.Add(good)
	bad := make([]byte, respHeaderLen)
	putRespHeader(bad, &respHeader{status: statusNotFound, seq: 4})
	f.Add(bad)
	f.Add([]byte("IFR1\x09"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h respHeader
		if decodeRespHeader(b, &h) != nil {
			return
		}
		if h.status > statusMax || h.n > MaxOpLen || (h.status != statusOK && h.n != 0) {
			t.Fatalf("accepted invalid header %+v", h)
		}
		again := make([]byte, respHeaderLen)
		putRespHeader(again, &h)
		if !bytes.Equal(again, b[:respHeaderLen]) {
			t.Fatalf("round trip differs: %x vs %x", again, b[:respHeaderLen])
		}
	})
}

// Connections outlive IOTimeout while idle: the server re-arms instead of
// dropping, the client re-arms a pooled connection before using it.
func TestTCPIdlePastIOTimeout(t *testing.T) {
	const timeout = 20 * time.Millisecond
	srv, err := NewTCP(TCPConfig{Listener: listen(t), IOTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	cli, err := NewTCP(TCPConfig{IOTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	remote := mustRegister(t, srv, "r", []byte("abcdefgh"))
	local := mustRegister(t, cli, "l", make([]byte, 8))
	ops := []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: 8}}
	for i := 0; i < 3; i++ {
		if err := Transfer(context.Background(), cli, ops); err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
		time.Sleep(3 * timeout) // idle well past both deadlines
	}
	cli.mu.Lock()
	pooled := len(cli.idle[srv.Addr()])
	cli.mu.Unlock()
	if pooled != 1 {
		t.Fatalf("%d pooled connections, want the one reused throughout", pooled)
	}
	if string(local.Bytes()) != "abcdefgh" {
		t.Fatalf("got %q", local.Bytes())
	}
}

// A peer that restarts on the same address is reached again: the broken
// pooled connection is retried once on a fresh one.
func TestTCPPeerRestart(t *testing.T) {
	ln := listen(t)
	addr := ln.Addr().String()
	srv, err := NewTCP(TCPConfig{Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := NewTCP(TCPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	local := mustRegister(t, cli, "l", make([]byte, 3))
	remote := mustRegister(t, srv, "r", []byte("one"))
	ops := []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: 3}}
	if err := Transfer(context.Background(), cli, ops); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv2, err := NewTCP(TCPConfig{Listener: ln2})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv2.Close() }()
	mustRegister(t, srv2, "r", []byte("two"))
	if err := Transfer(context.Background(), cli, ops); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if string(local.Bytes()) != "two" {
		t.Fatalf("got %q", local.Bytes())
	}
}

// FuzzServe feeds arbitrary bytes to a serving connection: the server must
// answer or drop the connection, never panic, hang or touch memory outside
// the registered region.
func FuzzServe(f *testing.F) {
	req := func(op Kind, name string, off, n uint64, payload string) []byte {
		b := make([]byte, reqHeaderLen)
		putReqHeader(b, &reqHeader{op: op, nameLen: uint16(len(name)), seq: 1, off: off, n: n})
		return append(append(b, name...), payload...)
	}
	f.Add(req(Read, "r", 0, 4, ""))
	f.Add(req(Write, "r", 2, 3, "xyz"))
	f.Add(append(req(Read, "r", 10, 100, ""), req(Write, "nope", 0, 2, "ab")...))
	f.Add(req(Write, "r", 0, 5, "ab")) // truncated payload
	f.Add([]byte("IFT1garbage"))
	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := NewTCP(TCPConfig{IOTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		region := make([]byte, 64)
		guard := bytes.Repeat([]byte{0xee}, 256)
		mem := append(append(bytes.Clone(guard), region...), guard...)
		if _, err := e.Register("r", mem[256:320:320]); err != nil {
			t.Fatal(err)
		}
		cli, srv := net.Pipe()
		e.mu.Lock()
		e.served[srv] = struct{}{}
		e.wg.Add(1)
		e.mu.Unlock()
		go e.serve(srv)
		drained := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, cli)
			close(drained)
		}()
		_, _ = cli.Write(in) // fails once the server drops the connection
		_ = cli.Close()
		<-drained
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mem[:256], guard) || !bytes.Equal(mem[320:], guard) {
			t.Fatal("server wrote outside the region")
		}
	})
}
