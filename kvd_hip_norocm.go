//go:build !rocm || !cgo

package main

import (
	"errors"

	"github.com/rs/zerolog"
)

// pinArena: a build without the rocm tag (or without cgo) never registers the arena with
// HIP; --arena-hip-register on is then an error that names the build.
func pinArena(mem []byte, mode, _ string, _ zerolog.Logger) (unpin func(), registered bool, err error) {
	if mode == "on" && len(mem) > 0 {
		return nil, false, errors.New("kvd: --arena-hip-register on: this infera binary was built without the rocm tag (make build-gpu)")
	}
	return func() {}, false, nil
}
