package tablespace

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestCRC32Combine: the combined CRC of two parts is the CRC of the whole,
// for every split of random buffers, empty parts included.
func TestCRC32Combine(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 7, 64, 4096, 5000, 1 << 20} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		for _, cut := range []int{0, n / 3, n / 2, n} {
			if got, want := crc32Combine(crc(b[:cut]), crc(b[cut:]), n-cut), crc(b); got != want {
				t.Fatalf("n %d cut %d: combined %08x, want %08x", n, cut, got, want)
			}
		}
	}
}

// TestCopyCRC: split or not, busy helper or not, copyCRC copies and sums
// exactly as copy and crc do.
func TestCopyCRC(t *testing.T) {
	c := newCRCSplitter()
	defer c.close()
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{100, crcSplitMin - 1, crcSplitMin, 1 << 20, 1<<20 + 12345} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		dst := make([]byte, n+100)
		if got := c.copyCRC(dst, src); got != crc(src) || !bytes.Equal(dst[:n], src) {
			t.Fatalf("n %d: crc %08x want %08x, copy equal %v", n, got, crc(src), bytes.Equal(dst[:n], src))
		}
		if got := c.copyCRC(nil, src); got != crc(src) {
			t.Fatalf("n %d, no copy: crc %08x want %08x", n, got, crc(src))
		}
	}
	// Concurrent callers: some find the helper busy and do it all.
	src := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	want := crc(src)
	done := make(chan bool)
	for range 4 {
		go func() {
			ok := true
			for range 20 {
				ok = ok && c.copyCRC(nil, src) == want
			}
			done <- ok
		}()
	}
	for range 4 {
		if !<-done {
			t.Fatal("a concurrent copyCRC got a wrong sum")
		}
	}
}

func FuzzCRC32Combine(f *testing.F) {
	f.Add([]byte("hello, world"), 5)
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		if cut < 0 || cut > len(b) {
			return
		}
		if got, want := crc32Combine(crc(b[:cut]), crc(b[cut:]), len(b)-cut), crc(b); got != want {
			t.Fatalf("cut %d of %d: %08x want %08x", cut, len(b), got, want)
		}
	})
}

// TestReadCRC: reading a slot with the check overlapped (first half summed
// by the helper while the second half is read) gives the bytes and the
// CRC-32C of a plain read then sum, split or not, helper busy or not; a
// failed read is an error, with the helper released.
func TestReadCRC(t *testing.T) {
	c := newCRCSplitter()
	defer c.close()
	r := rand.New(rand.NewPCG(5, 6))
	f, err := os.CreateTemp(t.TempDir(), "slots")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	fd := int(f.Fd())
	for _, busy := range []bool{false, true} {
		if busy {
			c.busy.Store(true)
		}
		for _, n := range []int{100, crcSplitMin - 1, crcSplitMin, 1 << 20, 1<<20 + 12345} {
			const off = 8192
			buf := make([]byte, n+64) // the slot header and key after the value
			got, err := c.readCRC(fd, buf, off, n)
			if err != nil || got != crc(data[off:off+n]) || !bytes.Equal(buf, data[off:off+n+64]) {
				t.Fatalf("busy %v n %d: %v crc %08x want %08x", busy, n, err, got, crc(data[off:off+n]))
			}
		}
		c.busy.Store(false)
	}
	for _, off := range []int64{int64(len(data)), int64(len(data)) - 600<<10} { // first half or second half fails
		if _, err := c.readCRC(fd, make([]byte, 1<<20), off, 1<<20); err == nil {
			t.Fatal("read past the end succeeded")
		}
	}
	if c.busy.Load() {
		t.Fatal("a failed read kept the helper")
	}
	var none *crcSplitter
	if got, err := none.readCRC(fd, make([]byte, 1<<20), 0, 1<<20); err != nil || got != crc(data[:1<<20]) {
		t.Fatal("nil splitter")
	}
}

// TestReadCRCAllocs: the overlapped read and check allocates nothing.
func TestReadCRCAllocs(t *testing.T) {
	c := newCRCSplitter()
	defer c.close()
	f, err := os.CreateTemp(t.TempDir(), "slots")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 2<<20)); err != nil {
		t.Fatal(err)
	}
	fd, buf := int(f.Fd()), make([]byte, 1<<20)
	if n := testing.AllocsPerRun(20, func() { _, _ = c.readCRC(fd, buf, 4096, len(buf)) }); n != 0 {
		t.Fatalf("readCRC allocates %v", n)
	}
}

// TestAIOReadCRC: an O_DIRECT slot read with AIO (every chunk submitted at
// once, each summed once it arrived) gives the bytes and CRC-32C of a
// plain read then sum, for values of one chunk to a whole 2 MiB buffer; a
// read past the end of the file is the error pread gives. Skipped only
// where the kernel refuses AIO (Gets then never use it).
func TestAIOReadCRC(t *testing.T) {
	r, err := newAIOReader()
	if err != nil {
		t.Skipf("no AIO: %v", err)
	}
	defer r.close()
	path := filepath.Join(t.TempDir(), "c")
	f, err := openContainer(path, 4<<20, true, false)
	if err != nil { // no O_DIRECT here: AIO on a buffered file reads the same
		if f, err = openContainer(path, 4<<20, false, false); err != nil {
			t.Fatal(err)
		}
	}
	defer f.Close()
	data := alignedBuf(4 << 20)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	fd := int(f.Fd())
	if err := pwriteFull(fd, data, 0); err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(2 << 20)
	for _, vlen := range []int{1, 4096, 100 << 10, crcSplitMin, 1<<20 - 5000, 1 << 20, 2<<20 - 30} {
		for _, off := range []int64{0, 8192, 2 << 20} {
			n := alignUp(vlen + 30)
			clear(buf)
			got, err := r.readCRC(fd, buf[:n], off, vlen)
			if err != nil || got != crc(data[off:off+int64(vlen)]) || !bytes.Equal(buf[:n], data[off:off+int64(n)]) {
				t.Fatalf("vlen %d off %d: %v crc %08x want %08x", vlen, off, err, got, crc(data[off:off+int64(vlen)]))
			}
		}
	}
	if _, err := r.readCRC(fd, buf[:1<<20], 3<<20+4096, 1<<20); err == nil {
		t.Fatal("a read past the end succeeded")
	}
	if got, err := r.readCRC(fd, buf[:1<<20], 0, 1<<20); err != nil || got != crc(data[:1<<20]) {
		t.Fatalf("after a failed read: %v", err)
	}
	if n := testing.AllocsPerRun(20, func() { _, _ = r.readCRC(fd, buf[:1<<20], 4096, 1<<20) }); n != 0 {
		t.Fatalf("AIO readCRC allocates %v", n)
	}
}
