//go:build unix

package transport

import (
	"io"
	"net"
	"syscall"
	"unsafe"
)

// vecReader reads one response header and the payload after it with a
// single readv into two buffers (the header's and the region's), on a
// connection the runtime poller drives (deadlines apply as for Read).
type vecReader struct {
	rc   syscall.RawConn
	iov  [2]syscall.Iovec
	n    int
	err  syscall.Errno
	read func(fd uintptr) bool // v.readv, bound once: no allocation per call
}

func newVecReader(c net.Conn) *vecReader {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	v := &vecReader{rc: rc}
	v.read = v.readv
	return v
}

func (v *vecReader) readv(fd uintptr) bool {
	for {
		n, _, e := syscall.Syscall(syscall.SYS_READV, fd, uintptr(unsafe.Pointer(&v.iov[0])), uintptr(len(v.iov)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false // wait until readable
		case 0:
			v.n, v.err = int(n), 0
		default:
			v.n, v.err = 0, e
		}
		return true
	}
}

// readHeaderPayload fills hdr completely, and dst with as many payload
// bytes as arrived with it; it returns how many of dst it filled. The
// caller must know that nothing but this response's own payload can follow
// the header on the wire (it is the last response outstanding).
func (v *vecReader) readHeaderPayload(hdr, dst []byte) (int, error) {
	got, pay := 0, 0
	for got < len(hdr) {
		v.iov[0].Base, v.iov[1].Base = &hdr[got], &dst[0]
		v.iov[0].SetLen(len(hdr) - got)
		v.iov[1].SetLen(len(dst))
		err := v.rc.Read(v.read)
		v.iov[0].Base, v.iov[1].Base = nil, nil
		if err != nil {
			return pay, err
		}
		if v.err != 0 {
			return pay, v.err
		}
		if v.n == 0 {
			if got == 0 {
				return 0, io.EOF
			}
			return 0, io.ErrUnexpectedEOF
		}
		h := min(v.n, len(hdr)-got)
		got += h
		if v.n > h { // the header is complete: the rest went into dst
			pay = v.n - h
		}
	}
	return pay, nil
}
