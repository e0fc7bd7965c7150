package kvcache

import "github.com/infera/infera/zmtp"

// The subscriber speaks ZMTP through the zmtp package (zmq4's connection
// API on a net.Conn dialed here, with a handshake deadline and a frame-size
// limit) rather than zmq4's Socket type, whose goroutines cannot be
// cancelled mid-dial and may block on an unread queue at Close.

// RankEndpoint returns the endpoint data-parallel rank publishes on: the base
// endpoint's port plus rank (DESIGN §7), as vLLM offsets its publishers.
func RankEndpoint(endpoint string, rank int) (string, error) {
	return zmtp.RankEndpoint(endpoint, rank)
}
