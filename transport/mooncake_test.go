//go:build mooncake && cgo

package transport

import (
	"context"
	"errors"
	"testing"
)

func mooncakePair(t *testing.T) (prefill, decode *Mooncake) {
	t.Helper()
	lib := buildStub(t, "mooncake_stub.c", "libtransfer_engine.so")
	var err error
	prefill, err = NewMooncake(MooncakeConfig{Library: lib, LocalName: "10.0.0.1:17001", Protocol: "rdma"})
	if err != nil {
		t.Fatal(err)
	}
	decode, err = NewMooncake(MooncakeConfig{Library: lib, LocalName: "10.0.0.2:17001", Protocol: "rdma"})
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
	return prefill, decode
}

func TestMooncakeConformance(t *testing.T) {
	prefill, decode := mooncakePair(t)
	conformance(t, prefill, decode)
}

func TestMooncakeErrors(t *testing.T) {
	prefill, decode := mooncakePair(t)
	ctx := context.Background()
	remote := mustRegister(t, prefill, "kv", hostBuf(t, 4096))
	local := mustRegister(t, decode, "l", hostBuf(t, 4096))
	read := []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: 4096}}

	t.Run("missing library", func(t *testing.T) {
		_, err := NewMooncake(MooncakeConfig{Library: "/nonexistent/libtransfer_engine.so", LocalName: "x"})
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%v, want ErrUnavailable", err)
		}
	})
	t.Run("unknown segment", func(t *testing.T) {
		d := remote.Desc()
		d.Peer = "10.9.9.9:1"
		if err := Transfer(ctx, decode, []Op{{Kind: Read, Local: local, Remote: d, Len: 8}}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%v, want ErrNotFound", err)
		}
	})
	t.Run("overlapping registration", func(t *testing.T) {
		if _, err := decode.Register("alias", local.Bytes()[100:200]); !errors.Is(err, ErrExists) {
			t.Fatalf("%v, want ErrExists", err)
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
		if _, err := decode.Submit(ctx, read); !errors.Is(err, ErrTransfer) {
			t.Fatalf("%v, want ErrTransfer", err)
		}
	})
	t.Run("failed transfer", func(t *testing.T) {
		pattern(remote.Bytes(), 7)
		clear(local.Bytes())
		t.Setenv("INFERA_STUB_FAIL", "transfer")
		b, err := decode.Submit(ctx, read)
		if err != nil {
			t.Fatal(err)
		}
		if err := Wait(ctx, b); !errors.Is(err, ErrTransfer) {
			t.Fatalf("%v, want ErrTransfer", err)
		}
		b.Release()
		if local.Bytes()[1] != 0 {
			t.Fatal("a failed transfer copied bytes")
		}
	})
	t.Run("timed out transfer", func(t *testing.T) {
		t.Setenv("INFERA_STUB_FAIL", "timeout")
		if err := Transfer(ctx, decode, read); !errors.Is(err, ErrTimeout) {
			t.Fatalf("%v, want ErrTimeout", err)
		}
	})
	t.Run("completion needs polling", func(t *testing.T) {
		b, err := decode.Submit(ctx, read)
		if err != nil {
			t.Fatal(err)
		}
		if done, _ := b.Poll(); done {
			t.Fatal("stub reports PENDING on the first poll; batch claimed done")
		}
		if err := Wait(ctx, b); err != nil {
			t.Fatal(err)
		}
		b.Release()
	})
	t.Run("release before completion", func(t *testing.T) {
		b, err := decode.Submit(ctx, read)
		if err != nil {
			t.Fatal(err)
		}
		b.Release() // waits, then frees: the stub refuses to free a busy batch
		if err := decode.Deregister(local); err != nil {
			t.Fatal(err)
		}
	})
}
