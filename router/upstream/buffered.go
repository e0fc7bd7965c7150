package upstream

// Buffered returns how many bytes of the streamed answer have already come
// off the connection and wait in its reader (chunk framing included): when
// it is above zero, the next Read returns at once, without a system call,
// save in the rare case where what waits is only part of a chunk's framing.
// The relay reads on while bytes wait, so that whatever the engine has
// already sent leaves in one write to the client (and the end of a stream
// with its last events). A held leg, or no stream, has none (0).
func (x *Exchange) Buffered() int {
	if x.leg != nil || x.br == nil || x.body == nil {
		return 0
	}
	return x.br.Buffered()
}
