package kvd

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePage is the size a hugetlb arena is rounded up to.
const hugePage = 2 << 20

// maxTornRetries is how often a reader retries a slot seen mid-write.
const maxTornRetries = 3

// Arena is the L2 shared arena: one memfd ("infera-kvd-arena") mapped
// MAP_SHARED, handed to clients with SCM_RIGHTS. Slot s starts at
// s*slotSize with a 16-byte little-endian header — version u32 (even =
// stable, odd = being written), payload length u32, 8 reserved zero bytes —
// and its payload at +16. Slot geometry is the Store's (decided by the
// first put); the Arena only owns the memory and the seqlock.
type Arena struct {
	fd      int
	mem     []byte
	Hugetlb bool // backed by 2 MiB pages
	Locked  bool // mlock succeeded
}

// OpenArena creates and maps an arena of size bytes. hugetlb asks for 2 MiB
// pages (size rounded up) and falls back to normal pages; mlock pins it and
// falls back to unpinned memory. fallbacks lists what fell back, for the log.
func OpenArena(size int64, hugetlb, mlock bool) (a *Arena, fallbacks []string, err error) {
	if size < 2*SlotAlign {
		return nil, nil, fmt.Errorf("%w: arena of %d bytes", ErrConfig, size)
	}
	a = &Arena{fd: -1}
	if hugetlb {
		hs := (size + hugePage - 1) / hugePage * hugePage
		fd, err := unix.MemfdCreate("infera-kvd-arena", unix.MFD_CLOEXEC|unix.MFD_HUGETLB|unix.MFD_HUGE_2MB)
		if err == nil {
			if err = unix.Ftruncate(fd, hs); err == nil {
				if mem, merr := unix.Mmap(fd, 0, int(hs), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); merr == nil {
					a.fd, a.mem, a.Hugetlb = fd, mem, true
				} else {
					err = merr
				}
			}
			if a.fd < 0 {
				unix.Close(fd)
			}
		}
		if err != nil {
			fallbacks = append(fallbacks, "hugetlb: "+err.Error())
		}
	}
	if a.fd < 0 {
		fd, err := unix.MemfdCreate("infera-kvd-arena", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fallbacks, fmt.Errorf("memfd_create: %w", err)
		}
		if err := unix.Ftruncate(fd, size); err != nil {
			unix.Close(fd)
			return nil, fallbacks, fmt.Errorf("size arena: %w", err)
		}
		mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			unix.Close(fd)
			return nil, fallbacks, fmt.Errorf("map arena: %w", err)
		}
		a.fd, a.mem = fd, mem
	}
	if mlock {
		if err := unix.Mlock(a.mem); err != nil {
			fallbacks = append(fallbacks, "mlock: "+err.Error())
		} else {
			a.Locked = true
		}
	}
	return a, fallbacks, nil
}

// Size is the arena's capacity in bytes.
func (a *Arena) Size() int64 { return int64(len(a.mem)) }

// FD is the memfd, owned by the Arena.
func (a *Arena) FD() int { return a.fd }

// Close unmaps and closes the arena; clients keep their own mappings.
func (a *Arena) Close() error {
	err := unix.Munmap(a.mem)
	if cerr := unix.Close(a.fd); err == nil {
		err = cerr
	}
	return err
}

func word(mem []byte, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&mem[off]))
}

// beginWrite makes the version of the slot at base odd (readers then see
// it mid-write) and returns it. The caller owns the slot.
func beginWrite(mem []byte, base int) uint32 {
	v := atomic.LoadUint32(word(mem, base))
	if v%2 == 0 {
		v++
	} else {
		v += 2
	}
	atomic.StoreUint32(word(mem, base), v)
	return v
}

// endWrite publishes length and an even version after the payload write.
func endWrite(mem []byte, base int, length int) uint32 {
	atomic.StoreUint32(word(mem, base+4), uint32(length))
	binary.LittleEndian.PutUint64(mem[base+8:base+16], 0)
	v := atomic.LoadUint32(word(mem, base)) + 1
	if v%2 == 1 {
		v++
	}
	atomic.StoreUint32(word(mem, base), v)
	return v
}

// slotVersion reads the version of the slot whose payload is at off.
func slotVersion(mem []byte, off int) uint32 {
	return atomic.LoadUint32(word(mem, off-HeaderBytes))
}

// ReadSlot copies the payload at off (as returned by get_shared_response)
// into dst and checks the slot header around the copy: the version must be
// even, equal to version, and unchanged afterwards, and the header length
// must equal length. A slot rewritten on every retry gives ErrTornRead.
func ReadSlot(mem []byte, off, length int, version uint32, dst []byte) ([]byte, error) {
	if off < HeaderBytes || length < 0 || off+length > len(mem) || (off-HeaderBytes)%4 != 0 {
		return dst, fmt.Errorf("%w: slot %d+%d outside the %d-byte arena", ErrProtocol, off, length, len(mem))
	}
	for range maxTornRetries {
		if v := slotVersion(mem, off); v != version || v%2 != 0 {
			if v%2 == 0 {
				return dst, ErrTornRead // rewritten for another value: retrying cannot help
			}
			continue
		}
		if int(atomic.LoadUint32(word(mem, off-HeaderBytes+4))) != length {
			return dst, ErrTornRead
		}
		out := append(dst[:0], mem[off:off+length]...)
		if slotVersion(mem, off) == version {
			return out, nil
		}
		dst = out
	}
	return dst, ErrTornRead
}
