package kvd

import "errors"

// Sentinel errors. Every error kvd returns wraps one of them.
var (
	// ErrBadFrame: a frame that is not a msgpack map with a known shape
	// (the server closes the connection that sent it).
	ErrBadFrame = errors.New("kvd: bad frame")
	// ErrFrameTooLarge: a frame longer than the configured limit.
	ErrFrameTooLarge = errors.New("kvd: frame too large")
	// ErrServer: the daemon answered with an error frame.
	ErrServer = errors.New("kvd: server error")
	// ErrProtocol: the daemon answered with an unexpected frame.
	ErrProtocol = errors.New("kvd: unexpected response")
	// ErrNoArena: the connection has no shared arena mapped.
	ErrNoArena = errors.New("kvd: no shared arena")
	// ErrTornRead: a zero-copy read saw its slot rewritten on every retry.
	ErrTornRead = errors.New("kvd: slot rewritten during read")
	// ErrConfig: invalid store or server options.
	ErrConfig = errors.New("kvd: invalid options")
	// ErrSocketInUse: another daemon answers on the socket path.
	ErrSocketInUse = errors.New("kvd: socket in use by a running daemon")
	// ErrClientClosed: the client was closed, or gave its connection up
	// after a request failed on the socket (a deadline, a cancellation,
	// an I/O or framing error).
	ErrClientClosed = errors.New("kvd: client connection closed")
)
