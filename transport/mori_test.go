//go:build mori && cgo

package transport

import (
	"context"
	"errors"
	"testing"
)

func moriPair(t *testing.T) (prefill, decode *Mori, lib string) {
	t.Helper()
	lib = buildStub(t, "mori_stub.c", "libinfera_mori.so")
	var err error
	prefill, err = NewMori(MoriConfig{Library: lib, Key: "prefill-0", Host: "10.0.0.1", Port: 17100})
	if err != nil {
		t.Fatal(err)
	}
	decode, err = NewMori(MoriConfig{Library: lib, Key: "decode-0", Host: "10.0.0.2", Port: 17100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := decode.Close(); err != nil {
			t.Error(err)
		}
		if err := prefill.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := decode.AddPeer("prefill-0", "10.0.0.1", 17100); err != nil {
		t.Fatal(err)
	}
	if err := prefill.AddPeer("decode-0", "10.0.0.2", 17100); err != nil {
		t.Fatal(err)
	}
	return prefill, decode, lib
}

func TestMoriConformance(t *testing.T) {
	prefill, decode, _ := moriPair(t)
	conformance(t, prefill, decode)
}

func TestMoriErrors(t *testing.T) {
	prefill, decode, lib := moriPair(t)
	ctx := context.Background()
	remote := mustRegister(t, prefill, "kv", hostBuf(t, 4096))
	local := mustRegister(t, decode, "l", hostBuf(t, 4096))
	read := []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: 4096}}

	t.Run("missing library", func(t *testing.T) {
		if _, err := NewMori(MoriConfig{Library: "/nonexistent/libinfera_mori.so", Key: "x"}); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%v, want ErrUnavailable", err)
		}
	})
	t.Run("duplicate key", func(t *testing.T) {
		if _, err := NewMori(MoriConfig{Library: lib, Key: "decode-0"}); !errors.Is(err, ErrExists) {
			t.Fatalf("%v, want ErrExists", err)
		}
	})
	t.Run("unknown peer", func(t *testing.T) {
		if err := decode.AddPeer("nobody", "10.9.9.9", 1); !errors.Is(err, ErrNotFound) {
			t.Fatalf("add peer: %v, want ErrNotFound", err)
		}
		d := remote.Desc()
		d.Peer = "nobody"
		if err := Transfer(ctx, decode, []Op{{Kind: Read, Local: local, Remote: d, Len: 8}}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%v, want ErrNotFound", err)
		}
	})
	t.Run("range checked by the library", func(t *testing.T) {
		d := remote.Desc()
		d.Len = 0 // no Go-side bound: the wrapper refuses
		if err := Transfer(ctx, decode, []Op{{Kind: Read, Local: local, Remote: d, RemoteOff: 4000, Len: 100}}); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("%v, want ErrOutOfRange", err)
		}
	})
	t.Run("register fails", func(t *testing.T) {
		t.Setenv("INFERA_STUB_FAIL", "register")
		if _, err := decode.Register("x", hostBuf(t, 64)); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%v, want ErrUnavailable", err)
		}
	})
	t.Run("submit refused", func(t *testing.T) {
		t.Setenv("INFERA_STUB_FAIL", "submit")
		if _, err := decode.Submit(ctx, read); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%v, want ErrUnavailable", err)
		}
	})
	t.Run("failed transfer", func(t *testing.T) {
		pattern(remote.Bytes(), 7)
		clear(local.Bytes())
		t.Setenv("INFERA_STUB_FAIL", "transfer")
		err := Transfer(ctx, decode, read)
		if !errors.Is(err, ErrTransfer) {
			t.Fatalf("%v, want ErrTransfer", err)
		}
		if local.Bytes()[1] != 0 {
			t.Fatal("a failed transfer copied bytes")
		}
	})
	t.Run("completion needs polling", func(t *testing.T) {
		b, err := decode.Submit(ctx, read)
		if err != nil {
			t.Fatal(err)
		}
		if done, _ := b.Poll(); done {
			t.Fatal("stub reports IN_PROGRESS on the first poll; batch claimed done")
		}
		if err := Wait(ctx, b); err != nil {
			t.Fatal(err)
		}
		b.Release()
	})
}
