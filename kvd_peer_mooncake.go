//go:build mooncake && cgo

package main

import (
	"github.com/infera/infera/config"
	"github.com/infera/infera/transport"
)

// newMooncakeEngine is kvd's Mooncake Transfer Engine for pulls, named
// name (host:port) in the metadata service.
func newMooncakeEngine(cfg config.KVD, name string) (transport.Engine, error) {
	return transport.NewMooncake(transport.MooncakeConfig{Library: cfg.PeerMooncakeLibrary, Metadata: cfg.PeerMooncakeMetadata,
		LocalName: name, Protocol: cfg.PeerMooncakeProtocol})
}
