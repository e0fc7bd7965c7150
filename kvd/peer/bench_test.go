package peer_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/kvd"
	"github.com/infera/infera/kvd/peer"
	"github.com/infera/infera/transport"
)

const (
	benchBlocks = 64
	benchBlock  = 64 << 10
)

// BenchmarkPull: 64 blocks of 64 KiB pulled from a source kvd on
// loopback (locate, the reads, the headers again); compare its MB/s with
// BenchmarkRawTCPCopy's, the same bytes over one loopback TCP connection.
func BenchmarkPull(b *testing.B) {
	a, _, err := kvd.OpenArena(16<<20, false, false)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	st, err := kvd.NewStore(kvd.StoreOptions{MaxBytes: 16 << 20, Arena: a, SlotBytes: benchBlock + kvd.HeaderBytes, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	eng, err := transport.NewTCP(transport.TCPConfig{Listener: ln, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	srv, err := peer.NewServer(st, eng, peer.ServerOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	var keys [][]byte
	for i := range benchBlocks {
		k := []byte(fmt.Sprintf("blk-%03d", i))
		set(b, st, string(k), bytes.Repeat([]byte{byte(i)}, benchBlock))
		keys = append(keys, k)
	}
	addr := serveBench(b, srv)
	p := newPuller(b, benchBlocks*(benchBlock+64), nil)
	b.SetBytes(benchBlocks * benchBlock)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		n := 0
		if _, err := p.Pull(b.Context(), addr, model, compat, keys, func(k, v []byte) { n++ }); err != nil || n != benchBlocks {
			b.Fatalf("%d pulled: %v", n, err)
		}
	}
}

// BenchmarkRawTCPCopy: the baseline, the same bytes written and read over
// one loopback TCP connection per iteration's request (no framing, no
// checks).
func BenchmarkRawTCPCopy(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	total := benchBlocks * benchBlock
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		src := bytes.Repeat([]byte{7}, total)
		var req [1]byte
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
	dst := make([]byte, total)
	b.SetBytes(int64(total))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write([]byte{1}); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, dst); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	c.Close()
	<-done
}
