package transport

import (
	"context"
	"io"
	"net"
	"strconv"
	"testing"
)

// BenchmarkLoopback compares, per region size and in the same run, a read
// through the TCP engine with a raw TCP copy of the same bytes: the raw
// client sends an 8-byte request and reads the region straight into its
// buffer, the least any request/response transfer over one connection can
// do. Compare the MB/s columns of .../raw and .../transport. On a shared
// machine whichever runs first tends to win, so the two alternate for
// loopbackRounds rounds (repeats are named #01, #02).
func BenchmarkLoopback(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
		name := strconv.Itoa(size>>10) + "KiB"
		for r := 0; r < loopbackRounds; r++ {
			b.Run(name+"/raw", func(b *testing.B) { benchRaw(b, size) })
			b.Run(name+"/transport", func(b *testing.B) { benchTransport(b, size) })
		}
	}
}

const loopbackRounds = 5

func benchTransport(b *testing.B, size int) {
	srv, cli := tcpPair(b)
	remote := mustRegister(b, srv, "kv", make([]byte, size))
	pattern(remote.Bytes(), 5)
	local := mustRegister(b, cli, "l", make([]byte, size))
	ops := []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: uint64(size)}}
	ctx := context.Background()
	if err := Transfer(ctx, cli, ops); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := Transfer(ctx, cli, ops); err != nil {
			b.Fatal(err)
		}
	}
}

func benchRaw(b *testing.B, size int) {
	ln := listen(b)
	src := make([]byte, size)
	pattern(src, 5)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		var req [8]byte
		for {
			if _, err := io.ReadFull(c, req[:]); err != nil {
				return
			}
			if _, err := c.Write(src); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, size)
	var req [8]byte
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(req[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, dst); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	_ = c.Close()
	_ = ln.Close()
	<-done
}
