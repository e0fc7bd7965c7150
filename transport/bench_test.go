package transport

import (
	"context"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// BenchmarkLoopback compares, per region size and in the same run, a read
// through the TCP engine with a raw TCP copy of the same bytes: the raw
// client sends an 8-byte request and reads the region straight into its
// buffer, the least any request/response transfer over one connection can
// do. Both connections stay open for the whole benchmark and every
// iteration does one raw and one transport read (which goes first
// alternates), each timed on its own, so load drift on a shared machine
// hits both alike. Reported: raw-MB/s, transport-MB/s and ratio
// (transport/raw over the same iterations); allocs/op counts both reads.
// scripts/bench-transport.sh runs it -count times and prints medians.
func BenchmarkLoopback(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
		b.Run(strconv.Itoa(size>>10)+"KiB", func(b *testing.B) { benchLoopback(b, size) })
	}
}

func benchLoopback(b *testing.B, size int) {
	raw := newRawPair(b, size)
	srv, cli := tcpPair(b)
	remote := mustRegister(b, srv, "kv", make([]byte, size))
	pattern(remote.Bytes(), 5)
	local := mustRegister(b, cli, "l", make([]byte, size))
	ops := []Op{{Kind: Read, Local: local, Remote: remote.Desc(), Len: uint64(size)}}
	ctx := context.Background()
	transfer := func() {
		if err := Transfer(ctx, cli, ops); err != nil {
			b.Fatal(err)
		}
	}
	for range 3 { // warm both connections (socket buffer autotuning, page faults)
		raw.read(b)
		transfer()
	}
	var rawT, trT time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			t0 := time.Now()
			raw.read(b)
			t1 := time.Now()
			transfer()
			t2 := time.Now()
			rawT, trT = rawT+t1.Sub(t0), trT+t2.Sub(t1)
		} else {
			t0 := time.Now()
			transfer()
			t1 := time.Now()
			raw.read(b)
			t2 := time.Now()
			trT, rawT = trT+t1.Sub(t0), rawT+t2.Sub(t1)
		}
	}
	b.StopTimer()
	total := float64(size) * float64(b.N) / 1e6
	b.ReportMetric(total/rawT.Seconds(), "raw-MB/s")
	b.ReportMetric(total/trT.Seconds(), "transport-MB/s")
	b.ReportMetric(rawT.Seconds()/trT.Seconds(), "ratio")
	b.ReportMetric(0, "ns/op")
}

// rawPair is the baseline: one loopback connection whose server answers
// every 8-byte request with the whole region in one write.
type rawPair struct {
	c   net.Conn
	dst []byte
	req [8]byte
}

func newRawPair(b *testing.B, size int) *rawPair {
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
	b.Cleanup(func() {
		_ = c.Close()
		_ = ln.Close()
		<-done
	})
	return &rawPair{c: c, dst: make([]byte, size)}
}

func (r *rawPair) read(b *testing.B) {
	if _, err := r.c.Write(r.req[:]); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(r.c, r.dst); err != nil {
		b.Fatal(err)
	}
}
