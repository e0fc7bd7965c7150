package resp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/kvd"
)

type listener struct {
	addr  string
	store *kvd.Store
	srv   *Server
}

// startListener runs a RESP Server over a fresh Store (a 64 MiB arena
// with 2 MiB slots, larger values inline). opt.Log is as given (the zero
// Logger writes nothing).
func startListener(t testing.TB, opt Options, storeOpt func(*kvd.StoreOptions)) *listener {
	t.Helper()
	return startListenerMode(t, opt, storeOpt, false)
}

// startListenerMode is startListener; plain serves each connection from
// a goroutine of its own (connections the event loops cannot take).
func startListenerMode(t testing.TB, opt Options, storeOpt func(*kvd.StoreOptions), plain bool) *listener {
	t.Helper()
	a, _, err := kvd.OpenArena(64<<20, false, false)
	if err != nil {
		t.Fatal(err)
	}
	so := kvd.StoreOptions{MaxBytes: 256 << 20, Arena: a, SlotBytes: 2 << 20, Log: zerolog.Nop()}
	if storeOpt != nil {
		storeOpt(&so)
	}
	st, err := kvd.NewStore(so)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(st, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the server has stopped: cleanups run last-in first-out
		st.Close()
		a.Close()
	})
	serve := srv.Serve
	if plain {
		serve = func(ctx context.Context, ln net.Listener) error { return srv.Serve(ctx, plainListener{ln}) }
	}
	addr := servetest.Loopback(t, "resp", serve)
	return &listener{addr: addr, store: st, srv: srv}
}

// rconn is a raw RESP client that returns replies as bytes.
type rconn struct {
	t testing.TB
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t testing.TB, addr string) *rconn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rconn{t: t, c: c, r: bufio.NewReaderSize(c, 1<<20)}
}

// encode builds a multibulk request.
func encode(args ...string) []byte {
	b := appendArray(nil, len(args))
	for _, a := range args {
		b = appendBulkString(b, a)
	}
	return b
}

// do sends raw bytes and reads one reply's raw bytes.
func (r *rconn) do(req []byte) []byte {
	r.t.Helper()
	if _, err := r.c.Write(req); err != nil {
		r.t.Fatalf("write: %v", err)
	}
	return r.read()
}

func (r *rconn) read() []byte {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var buf bytes.Buffer
	if err := readReply(r.r, &buf); err != nil {
		r.t.Fatalf("read reply: %v (so far %q)", err, buf.Bytes())
	}
	return buf.Bytes()
}

// eof reports whether the server closed the connection.
func (r *rconn) eof() bool {
	_ = r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := r.r.ReadByte()
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// readReply copies one RESP2 reply from r to w.
func readReply(r *bufio.Reader, w *bytes.Buffer) error {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return err
	}
	w.Write(line)
	if len(line) < 3 {
		return fmt.Errorf("short line %q", line)
	}
	switch line[0] {
	case '+', '-', ':':
		return nil
	case '$':
		n, err := strconv.Atoi(string(line[1 : len(line)-2]))
		if err != nil {
			return err
		}
		if n < 0 {
			return nil
		}
		_, err = io.CopyN(w, r, int64(n)+2)
		return err
	case '*':
		n, err := strconv.Atoi(string(line[1 : len(line)-2]))
		if err != nil {
			return err
		}
		for range max(n, 0) {
			if err := readReply(r, w); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("bad reply line %q", line)
}
