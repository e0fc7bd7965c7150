package transport

import (
	"context"
	"io"
	"net"
	"slices"
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
// hits both alike. Reported: raw-MB/s and transport-MB/s over all
// iterations, and ratio, the median over iterations of raw time /
// transport time (transport throughput relative to raw; a descheduled
// outlier moves it little); allocs/op counts both reads.
// scripts/bench-transport.sh runs it -count times and prints medians.
func BenchmarkLoopback(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
		b.Run(strconv.Itoa(size>>10)+"KiB", func(b *testing.B) { benchLoopback(b, newRawPair(b, size, false), size) })
	}
}

// BenchmarkLoopbackFramed is BenchmarkLoopback against a raw copy that
// moves its bytes the way the engine does: the server writev()s a 24-byte
// header and the region, the client readv()s header and payload straight
// into its buffer. On loopback the small header going first lets the
// receiver start copying out while the sender still copies in, which a
// single write of the region does not; this baseline has that too, so it
// isolates what the engine itself costs (framing, lookup, pooling,
// deadlines).
func BenchmarkLoopbackFramed(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
		b.Run(strconv.Itoa(size>>10)+"KiB", func(b *testing.B) { benchLoopback(b, newRawPair(b, size, true), size) })
	}
}

// BenchmarkLoopbackControl is the harness checking itself: two raw
// connections measured exactly as BenchmarkLoopback measures raw against
// transport; its ratio should be 1.00 within the noise.
func BenchmarkLoopbackControl(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
		b.Run(strconv.Itoa(size>>10)+"KiB", func(b *testing.B) {
			r1, r2 := newRawPair(b, size, false), newRawPair(b, size, false)
			paired(b, size, func() { r1.read(b) }, func() { r2.read(b) }, "raw2-MB/s")
		})
	}
}

func benchLoopback(b *testing.B, raw *rawPair, size int) {
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
	paired(b, size, func() { raw.read(b) }, transfer, "transport-MB/s")
}

// paired times base and other alternately, b.N times each (which goes
// first alternates), and reports raw-MB/s (base), name (other) and ratio:
// the median over iterations of base time / other time.
func paired(b *testing.B, size int, base, other func(), name string) {
	for range 3 { // warm both connections (socket buffer autotuning, page faults)
		base()
		other()
	}
	var baseT, otherT time.Duration
	ratios := make([]float64, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var tb, to time.Duration
		if i%2 == 0 {
			t0 := time.Now()
			base()
			t1 := time.Now()
			other()
			tb, to = t1.Sub(t0), time.Since(t1)
		} else {
			t0 := time.Now()
			other()
			t1 := time.Now()
			base()
			to, tb = t1.Sub(t0), time.Since(t1)
		}
		baseT, otherT = baseT+tb, otherT+to
		ratios[i] = tb.Seconds() / to.Seconds()
	}
	b.StopTimer()
	slices.Sort(ratios)
	total := float64(size) * float64(b.N) / 1e6
	b.ReportMetric(total/baseT.Seconds(), "raw-MB/s")
	b.ReportMetric(total/otherT.Seconds(), name)
	b.ReportMetric(ratios[len(ratios)/2], "ratio")
	b.ReportMetric(0, "ns/op")
}

// rawPair is the baseline: one loopback connection whose server answers
// every 8-byte request with the whole region in one write (framed: a
// 24-byte header and the region in one writev, read back with one readv).
type rawPair struct {
	c      net.Conn
	dst    []byte
	req    [8]byte
	framed bool
	hdr    [respHeaderLen]byte
	vr     *vecReader
}

func newRawPair(b *testing.B, size int, framed bool) *rawPair {
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
		hdr := make([]byte, respHeaderLen)
		iov, vec := make([][]byte, 2), new(net.Buffers)
		for {
			if _, err := io.ReadFull(c, req[:]); err != nil {
				return
			}
			if framed {
				iov[0], iov[1] = hdr, src
				*vec = iov
				_, err = vec.WriteTo(c)
			} else {
				_, err = c.Write(src)
			}
			if err != nil {
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
	r := &rawPair{c: c, dst: make([]byte, size), framed: framed}
	if framed {
		if r.vr = newVecReader(c); r.vr == nil {
			b.Skip("no readv on this connection")
		}
	}
	return r
}

func (r *rawPair) read(b *testing.B) {
	if _, err := r.c.Write(r.req[:]); err != nil {
		b.Fatal(err)
	}
	n := 0
	if r.framed {
		var err error
		if n, err = r.vr.readHeaderPayload(r.hdr[:], r.dst); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := io.ReadFull(r.c, r.dst[n:]); err != nil {
		b.Fatal(err)
	}
}
