//go:build !mooncake || !cgo

package main

import (
	"errors"

	"github.com/infera/infera/config"
	"github.com/infera/infera/transport"
)

// newMooncakeEngine: a build without the mooncake tag has no Mooncake
// Transfer Engine.
func newMooncakeEngine(config.KVD, string) (transport.Engine, error) {
	return nil, errors.New("this infera binary was built without the mooncake tag (make build-gpu)")
}
