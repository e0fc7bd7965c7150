package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
)

// pattern fills b with bytes derived from seed and the position.
func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) ^ seed ^ byte(i>>9)
	}
}

// hostBuf returns size bytes from AllocHost, freed at cleanup.
func hostBuf(t testing.TB, size int) []byte {
	t.Helper()
	b, err := AllocHost(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := FreeHost(b); err != nil {
			t.Error(err)
		}
	})
	return b
}

func mustRegister(t testing.TB, e Engine, name string, buf []byte) *Region {
	t.Helper()
	r, err := e.Register(name, buf)
	if err != nil {
		t.Fatalf("register %s: %v", name, err)
	}
	return r
}

// conformance runs the behaviour every Engine shares against a pair of
// engines: prefill serves regions, decode reads and writes them.
func conformance(t *testing.T, prefill, decode Engine) {
	ctx := context.Background()
	const size = 256 << 10
	remote := mustRegister(t, prefill, "kv/req-1", hostBuf(t, size))
	pattern(remote.Bytes(), 1)
	local := mustRegister(t, decode, "local", hostBuf(t, size))

	t.Run("read", func(t *testing.T) {
		op := Op{Kind: Read, Local: local, LocalOff: 1000, Remote: remote.Desc(), RemoteOff: 4096, Len: 64 << 10}
		if err := Transfer(ctx, decode, []Op{op}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(local.Bytes()[1000:1000+64<<10], remote.Bytes()[4096:4096+64<<10]) {
			t.Fatal("read bytes differ")
		}
	})
	t.Run("write", func(t *testing.T) {
		pattern(local.Bytes()[:8192], 9)
		op := Op{Kind: Write, Local: local, Remote: remote.Desc(), RemoteOff: 100000, Len: 8192}
		if err := Transfer(ctx, decode, []Op{op}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(remote.Bytes()[100000:100000+8192], local.Bytes()[:8192]) {
			t.Fatal("written bytes differ")
		}
	})
	t.Run("batch", func(t *testing.T) {
		// 150 ops alternating runs of reads and writes on disjoint blocks.
		pattern(remote.Bytes(), 3)
		pattern(local.Bytes(), 4)
		const blk = 1024
		var ops []Op
		for i := 0; i < 150; i++ {
			k := Read
			if (i/40)%2 == 1 {
				k = Write
			}
			ops = append(ops, Op{Kind: k, Local: local, LocalOff: uint64(i * blk), Remote: remote.Desc(), RemoteOff: uint64(i * blk), Len: blk})
		}
		wantLocal := bytes.Clone(local.Bytes())
		wantRemote := bytes.Clone(remote.Bytes())
		for _, op := range ops {
			if op.Kind == Read {
				copy(wantLocal[op.LocalOff:op.LocalOff+blk], wantRemote[op.RemoteOff:op.RemoteOff+blk])
			} else {
				copy(wantRemote[op.RemoteOff:op.RemoteOff+blk], wantLocal[op.LocalOff:op.LocalOff+blk])
			}
		}
		b, err := decode.Submit(ctx, ops)
		if err != nil {
			t.Fatal(err)
		}
		if err := Wait(ctx, b); err != nil {
			t.Fatal(err)
		}
		b.Release()
		if !bytes.Equal(local.Bytes(), wantLocal) || !bytes.Equal(remote.Bytes(), wantRemote) {
			t.Fatal("batch results differ")
		}
	})
	t.Run("invalid", func(t *testing.T) {
		bad := []Op{
			{Kind: 0, Local: local, Remote: remote.Desc(), Len: 1},
			{Kind: Read, Local: nil, Remote: remote.Desc(), Len: 1},
			{Kind: Read, Local: local, Remote: remote.Desc(), Len: 0},
			{Kind: Read, Local: local, Remote: Desc{}, Len: 1},
		}
		for i, op := range bad {
			if _, err := decode.Submit(ctx, []Op{op}); !errors.Is(err, ErrInvalid) {
				t.Errorf("op %d: %v, want ErrInvalid", i, err)
			}
		}
		if _, err := decode.Register("", hostBuf(t, 64)); !errors.Is(err, ErrInvalid) {
			t.Errorf("empty name: %v", err)
		}
		if _, err := prefill.Register("kv/req-1", hostBuf(t, 64)); !errors.Is(err, ErrExists) {
			t.Errorf("duplicate: %v", err)
		}
	})
	t.Run("out of range", func(t *testing.T) {
		ops := []Op{
			{Kind: Read, Local: local, LocalOff: size - 10, Remote: remote.Desc(), Len: 11},
			{Kind: Read, Local: local, Remote: remote.Desc(), RemoteOff: size - 10, Len: 11},
			{Kind: Read, Local: local, Remote: remote.Desc(), RemoteOff: ^uint64(0) - 5, Len: 11},
		}
		for i, op := range ops {
			if err := Transfer(ctx, decode, []Op{op}); !errors.Is(err, ErrOutOfRange) {
				t.Errorf("op %d: %v, want ErrOutOfRange", i, err)
			}
		}
	})
	t.Run("foreign local region", func(t *testing.T) {
		op := Op{Kind: Read, Local: remote, Remote: remote.Desc(), Len: 8}
		if err := Transfer(ctx, decode, []Op{op}); !errors.Is(err, ErrNotRegistered) {
			t.Fatalf("%v, want ErrNotRegistered", err)
		}
	})
	t.Run("deregistered", func(t *testing.T) {
		gone := mustRegister(t, prefill, "kv/gone", hostBuf(t, 4096))
		desc := gone.Desc()
		if err := prefill.Deregister(gone); err != nil {
			t.Fatal(err)
		}
		if err := prefill.Deregister(gone); !errors.Is(err, ErrNotRegistered) {
			t.Fatalf("second deregister: %v", err)
		}
		err := Transfer(ctx, decode, []Op{{Kind: Read, Local: local, Remote: desc, Len: 64}})
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("read of deregistered region: %v, want ErrNotFound", err)
		}
		// The engine still works after a failed op.
		if err := Transfer(ctx, decode, []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: 64}}); err != nil {
			t.Fatalf("after failure: %v", err)
		}
		lgone := mustRegister(t, decode, "local-gone", hostBuf(t, 64))
		if err := decode.Deregister(lgone); err != nil {
			t.Fatal(err)
		}
		if err := Transfer(ctx, decode, []Op{{Kind: Read, Local: lgone, Remote: remote.Desc(), Len: 64}}); !errors.Is(err, ErrNotRegistered) {
			t.Fatalf("deregistered local: %v", err)
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		const workers = 4
		bufs := make([]*Region, workers)
		for i := range bufs {
			bufs[i] = mustRegister(t, decode, fmt.Sprintf("c%d", i), hostBuf(t, 16<<10))
		}
		errc := make(chan error, workers)
		for i := 0; i < workers; i++ {
			go func(r *Region, off uint64) {
				for n := 0; n < 20; n++ {
					if err := Transfer(ctx, decode, []Op{{Kind: Read, Local: r, Remote: remote.Desc(), RemoteOff: off, Len: 16 << 10}}); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}(bufs[i], uint64(i)*(16<<10))
		}
		for i := 0; i < workers; i++ {
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		}
		for i, r := range bufs {
			if !bytes.Equal(r.Bytes(), remote.Bytes()[i*16<<10:(i+1)*16<<10]) {
				t.Fatalf("worker %d bytes differ", i)
			}
		}
	})
}
