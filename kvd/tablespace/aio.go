package tablespace

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A large Get under O_DIRECT reads its slot with Linux native AIO: the
// slot's chunks (aioChunkMin or more each, whole pages) are all submitted
// at once with one io_submit, so the device has the whole slot in flight
// as it has for one pread of it, and the caller sums each chunk as soon as
// it and the chunks before it have arrived, while the later ones are
// still being read. Only the last chunk's sum follows the read (about
// 25 µs for 128 KiB, where the whole slot's sum after a pread costs about
// 200 µs per MiB), and no other goroutine or core is involved: the
// overlap holds on a machine whose cores are all busy, where handing a
// half to the CRC helper (readCRC) waits for the helper to be scheduled.
//
// An aioReader is one AIO context and its buffers; the Tablespace makes up
// to aioReaders of them as large Gets need them and keeps them in a
// channel, and a Get that finds none free reads with readCRC. Without AIO
// (io_setup refused), or when the slots are too small to hold a value of
// crcSplitMin, there are none (io_destroy waits tens of milliseconds: a
// tablespace that never reads a large value does not pay it).

const (
	aioChunks    = 16        // chunks per read at most
	aioChunkMin  = 128 << 10 // smallest chunk: a smaller one costs more in completions than it saves
	aioReaders   = 4         // AIO contexts per Tablespace (concurrent large Gets)
	iocbCmdPRead = 0
)

// iocb and ioEvent are the kernel's struct iocb and struct io_event
// (little-endian field order; every Linux architecture Go runs on with
// io_submit is little-endian or lays them out the same for 64-bit).
type iocb struct {
	data      uint64
	key       uint32
	rwFlags   int32
	opcode    uint16
	reqPrio   int16
	fd        uint32
	buf       uint64
	nbytes    uint64
	offset    int64
	reserved2 uint64
	flags     uint32
	resfd     uint32
}

type ioEvent struct {
	data, obj uint64
	res, res2 int64
}

type aioReader struct {
	ctx    uintptr
	cbs    [aioChunks]iocb
	cbp    [aioChunks]uintptr
	events [aioChunks]ioEvent
	done   [aioChunks]bool
}

func newAIOReader() (*aioReader, error) {
	r := &aioReader{}
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, aioChunks, uintptr(unsafe.Pointer(&r.ctx)), 0); e != 0 {
		return nil, e
	}
	return r, nil
}

func (r *aioReader) close() {
	_, _, _ = unix.Syscall(unix.SYS_IO_DESTROY, r.ctx, 0, 0)
}

// readCRC reads buf (whole pages, aligned) from fd at off and returns the
// CRC-32C of its first vlen bytes, summing each chunk once it arrived
// while the later ones are still read. A failed or short chunk read is
// read again with pread (whose error is the answer).
func (r *aioReader) readCRC(fd int, buf []byte, off int64, vlen int) (uint32, error) {
	chunk := max(aioChunkMin, alignUp((len(buf)+aioChunks-1)/aioChunks))
	k := (len(buf) + chunk - 1) / chunk
	for i := range k {
		a, b := i*chunk, min((i+1)*chunk, len(buf))
		r.cbs[i] = iocb{data: uint64(i), opcode: iocbCmdPRead, fd: uint32(fd),
			buf: uint64(uintptr(unsafe.Pointer(&buf[a]))), nbytes: uint64(b - a), offset: off + int64(a)}
		r.cbp[i] = uintptr(unsafe.Pointer(&r.cbs[i]))
		r.done[i] = false
	}
	submitted, failed := 0, false
	for submitted < k && !failed {
		n, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, r.ctx, uintptr(k-submitted), uintptr(unsafe.Pointer(&r.cbp[submitted])))
		switch {
		case e == syscall.EINTR:
		case e != 0:
			failed = true // reap what was submitted, then pread
		default:
			submitted += int(n)
		}
	}
	var sum uint32
	next, reaped := 0, 0
	for reaped < submitted {
		n, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, r.ctx, 1, uintptr(submitted-reaped), uintptr(unsafe.Pointer(&r.events[0])), 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 { // cannot happen with a valid context; the chunks stay in flight
			panic("tablespace: io_getevents: " + e.Error())
		}
		for _, ev := range r.events[:n] {
			i := int(ev.data)
			if ev.res != int64(r.cbs[i].nbytes) {
				failed = true
			}
			r.done[i] = true
		}
		reaped += int(n)
		for !failed && next < k && r.done[next] {
			a, b := next*chunk, min((next+1)*chunk, vlen)
			if a < b {
				sum = crcUpdate(sum, buf[a:b])
			}
			next++
		}
	}
	if failed || submitted < k {
		// A chunk failed, came short or was not submitted: read the
		// slot again as a Get without AIO does.
		if err := preadFull(fd, buf, off); err != nil {
			return 0, err
		}
		return crc(buf[:vlen]), nil
	}
	return sum, nil
}
