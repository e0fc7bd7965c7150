package router

// SetStreamChunksDirect sets whether the relay writes a stream's chunks
// itself (writehold.go) or through fasthttp's chunked writer, for routers
// started after it, and returns the setting to restore. Only tests whose
// routers are all stopped before the restore may call it (it is not
// synchronised with the handlers reading it).
func SetStreamChunksDirect(on bool) (was bool) {
	was, streamDirect = streamDirect, on
	return was
}

// SetStreamHeadDirect sets whether the relay writes a stream's head lines
// itself (relayhead.go) or fasthttp's header carries them, as
// SetStreamChunksDirect does for the chunks.
func SetStreamHeadDirect(on bool) (was bool) {
	was, streamHeadDirect = streamHeadDirect, on
	return was
}

// SetUnaryHeadDirect sets whether the relay writes a unary answer's head
// lines itself (relayhead.go), as SetStreamHeadDirect does for a stream's.
func SetUnaryHeadDirect(on bool) (was bool) {
	was, unaryHeadDirect = unaryHeadDirect, on
	return was
}
