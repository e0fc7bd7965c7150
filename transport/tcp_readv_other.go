//go:build !unix

package transport

import "net"

// vecReader is unix-only; elsewhere responses are read through the buffer.
type vecReader struct{}

func newVecReader(net.Conn) *vecReader { return nil }

func (*vecReader) readHeaderPayload(hdr, dst []byte) (int, error) { panic("unreachable") }
