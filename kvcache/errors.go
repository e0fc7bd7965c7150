package kvcache

import (
	"errors"

	"github.com/infera/infera/zmtp"
)

var (
	// ErrBadEvent wraps every KV-event decoding failure (malformed msgpack,
	// wrong shapes, out-of-range values).
	ErrBadEvent = errors.New("kvcache: bad kv event")
	// ErrBadEndpoint: an endpoint is not tcp://host:port with a dialable host.
	ErrBadEndpoint = zmtp.ErrBadEndpoint
	// ErrInvalidConfig: a configuration value is out of range.
	ErrInvalidConfig = errors.New("kvcache: invalid config")
	// ErrTooManyWorkers: the index has no free worker slot.
	ErrTooManyWorkers = errors.New("kvcache: too many workers")
	// ErrClosed: the subscriber has been closed.
	ErrClosed = errors.New("kvcache: closed")
	// ErrFrameTooLarge: a peer announced a ZMTP frame above the configured
	// limit; the connection is dropped before the frame is allocated.
	ErrFrameTooLarge = zmtp.ErrFrameTooLarge
	// ErrReplay: the replay exchange failed (bad reply, timeout).
	ErrReplay = errors.New("kvcache: replay failed")
)
