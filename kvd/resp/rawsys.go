package resp

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The event loop's read, write and epoll_wait never block (the sockets
// are non-blocking and the wait's timeout is 0), so they are made as raw
// system calls: without the runtime's entersyscall/exitsyscall around
// each, which cost a request more than the parse and the store together
// (and, after an idle spell, a futex wake of the runtime's monitor
// thread). A write of a large reply copies at most the socket's buffer
// space, so none holds its P for long.

func rawRead(fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func rawWrite(fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawEpollPoll is epoll_wait with a timeout of 0 (epoll_pwait without a
// signal mask, which every Linux architecture has).
func rawEpollPoll(ep int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
