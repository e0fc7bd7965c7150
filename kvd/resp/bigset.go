package resp

import (
	"github.com/infera/infera/internal/epoll"

	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/infera/infera/kvd"
)

// A large SET's value is read from the socket straight into its arena
// slot (as redis-server reads a large argument straight into the string
// object it stores), not into the input buffer and then copied into the
// slot: at 64 KiB that copy was most of what kvd spent on a SET beyond
// redis-server.
//
// When the request at the front of an event-loop connection's input is
// `SET key <value>` (any options after it) whose value of bigSetMin bytes
// or more has not all arrived, the loop takes a slot for the value
// (Store.BeginWrite), moves the value bytes already read into it and
// reads the rest with readv: the value's remaining bytes into the slot,
// what follows them into the input buffer. The request's value header
// "$<n>\r\n" is rewritten in the input buffer to "$0\r\n", so once the
// value is complete the parser reads the same request with an empty value
// (every other byte, options and protocol errors included, is what the
// client sent) and SET stores the slot (Store.CommitWrite) instead. A SET
// that does not store (NX/XX, an expiry in the past, a syntax error) or a
// connection that closes gives the slot back (Store.AbortWrite).
//
// A slot is taken for a value only once an eighth of it has arrived, or
// when the connection already sent a large value at least half as large
// in full: as the input buffer grows only with bytes that arrived, a
// header's claim alone does not take arena memory (nor evict for it).
//
// Once a connection sent a large SET, a read into its empty input buffer
// takes at most bigPeek bytes (enough for the next request's header), so
// the next large value is not read into the buffer first; the first read
// that does not start a large SET turns this off again.

// bigSetMin is the smallest value read straight into its slot (Redis's
// PROTO_MBULK_BIG_ARG): below it the extra read costs more than the copy.
const bigSetMin = 32 << 10

// bigPeek is what a read into an empty input buffer takes while large
// SETs arrive.
const bigPeek = 4 << 10

// bigSet is a connection's large SET in progress (event-loop only).
type bigSet struct {
	w     kvd.SlotWrite
	val   []byte // the slot's payload, the value's length
	got   int    // bytes of val read
	ready bool   // val is complete; the request at the front of in names it
	last  int    // the last large value read in full (0: none, or peeking is off)
	iov   [2]unix.Iovec
}

// reading reports whether the socket's next bytes belong to a value.
func (b *bigSet) reading() bool { return b.w.Held() && !b.ready }

// read reads what the socket has: into the input buffer, or while a large
// SET's value arrives into its slot first. n is the bytes read (0: the
// client closed), space what the read could have taken; cn.w is advanced.
func (cn *conn) read() (n, space int, err error) {
	if !cn.big.w.Held() && cn.w < cn.need {
		cn.startBig()
	}
	if cn.big.reading() {
		return cn.readBig()
	}
	b := cn.in[cn.w:]
	peek := cn.big.last > 0 && cn.w == 0 && len(b) > bigPeek
	if peek {
		b = b[:bigPeek]
	}
	n, err = epoll.Read(cn.fd, b)
	cn.w += n
	if peek && n > 0 {
		if _, _, vlen, ok := bigSetHeader(cn.in[:cn.w]); !ok || vlen < bigSetMin || vlen > 2*cn.big.last {
			cn.big.last = 0
		}
	}
	return n, len(b), err
}

// startBig begins reading the value of the large SET at the front of the
// input buffer into a slot, when there is one (see above).
func (cn *conn) startBig() {
	if !cn.authed || cn.r != 0 {
		return
	}
	hdr, start, vlen, ok := bigSetHeader(cn.in[:cn.w])
	if !ok || vlen < bigSetMin || vlen > cn.s.opt.MaxBulkBytes || start+vlen <= cn.w ||
		(cn.w-start < vlen/8 && vlen > 2*cn.big.last) {
		return
	}
	val, ok := cn.s.st.BeginWrite(&cn.big.w, vlen, cn.s.ret)
	if !ok {
		return // the usual path, whose Set gives the reason
	}
	cn.big.val, cn.big.ready = val, false
	cn.big.got = copy(val, cn.in[start:cn.w])
	cn.w = hdr + copy(cn.in[hdr:], "$0\r\n")
	cn.need = 0
	cn.s.C.BigSets.Add(1)
}

// readBig reads the rest of the value into its slot and what follows it
// (at most bigPeek bytes) into the input buffer, with one readv.
func (cn *conn) readBig() (n, space int, err error) {
	b := &cn.big
	rest := b.val[b.got:]
	tail := cn.in[cn.w:]
	if len(tail) > bigPeek {
		tail = tail[:bigPeek]
	}
	b.iov[0].Base = unsafe.SliceData(rest)
	b.iov[0].SetLen(len(rest))
	iovs := 1
	if len(tail) > 0 {
		b.iov[1].Base = unsafe.SliceData(tail)
		b.iov[1].SetLen(len(tail))
		iovs = 2
	}
	r, _, e := unix.RawSyscall(unix.SYS_READV, uintptr(cn.fd), uintptr(unsafe.Pointer(&b.iov[0])), uintptr(iovs))
	b.iov[0].Base, b.iov[1].Base = nil, nil
	if e != 0 {
		return 0, 0, e
	}
	n = int(r)
	v := min(n, len(rest))
	b.got += v
	cn.w += n - v
	if b.got == len(b.val) {
		b.ready, b.last = true, len(b.val)
	}
	return n, len(rest) + len(tail), nil
}

// storeBig stores the value read into its slot under a's key.
func (cn *conn) storeBig(a *kvd.SetArgs) (bool, string) {
	cn.big.val, cn.big.ready = nil, false
	return cn.s.st.CommitWrite(&cn.big.w, a)
}

// dropBig gives back a slot the SET did not store, or a connection left
// unfinished.
func (cn *conn) dropBig() {
	if cn.big.w.Held() {
		cn.s.st.AbortWrite(&cn.big.w)
	}
	cn.big.val, cn.big.ready = nil, false
}

// bigSetHeader parses the front of b as far as a SET's value: "*<n>\r\n"
// (n ≥ 3), "$3\r\nSET\r\n" in any case, the key as a bulk string, then
// "$<len>\r\n". hdr is where that value header starts, start where the
// value does. Stricter than Parse (the bytes after each bulk must be
// CRLF), so whatever it accepts Parse reads the same way.
func bigSetHeader(b []byte) (hdr, start, vlen int, ok bool) {
	count, p, ok := bigLine(b, 0, '*')
	if !ok || count < 3 || count > maxMultibulk {
		return 0, 0, 0, false
	}
	l, p, ok := bigLine(b, p, '$')
	if !ok || l != 3 || p+5 > len(b) || !eqFold(b[p:p+3], "set") || b[p+3] != '\r' || b[p+4] != '\n' {
		return 0, 0, 0, false
	}
	kl, p, ok := bigLine(b, p+5, '$')
	if !ok || p+kl+2 > len(b) || b[p+kl] != '\r' || b[p+kl+1] != '\n' {
		return 0, 0, 0, false
	}
	hdr = p + kl + 2
	vl, start, ok := bigLine(b, hdr, '$')
	if !ok {
		return 0, 0, 0, false
	}
	return hdr, start, vl, true
}

// bigLine reads "<c><int>\r\n" at b[p:], a non-negative int of at most
// 10 digits; it returns the int and the position after the line.
func bigLine(b []byte, p int, c byte) (int, int, bool) {
	if p >= len(b) || b[p] != c {
		return 0, 0, false
	}
	for i := p + 1; i < len(b) && i <= p+11; i++ {
		if b[i] == '\r' {
			v, ok := parseInt(b[p+1 : i])
			if !ok || v < 0 || i+1 >= len(b) || b[i+1] != '\n' {
				return 0, 0, false
			}
			return int(v), i + 2, true
		}
	}
	return 0, 0, false
}
