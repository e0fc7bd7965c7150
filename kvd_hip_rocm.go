//go:build rocm && cgo

package main

import (
	"fmt"

	"github.com/rs/zerolog"

	"github.com/infera/infera/rocm"
)

// pinArena registers the arena with the GPUs (hipHostRegister) when mode
// allows and a HIP runtime with a GPU is there: engines' copies into and
// out of it then are DMA from pinned memory. mode "auto" goes on without
// (one log line), "on" makes a missing runtime fatal, "off" skips it. The
// returned function unregisters, once, at shutdown.
func pinArena(mem []byte, mode, lib string, log zerolog.Logger) (unpin func(), registered bool, err error) {
	none := func() {}
	if mode == "off" || len(mem) == 0 {
		return none, false, nil
	}
	fail := func(err error) (func(), bool, error) {
		if mode == "on" {
			return nil, false, fmt.Errorf("kvd arena hip register (--arena-hip-register on): %w", err)
		}
		log.Info().Err(err).Msg("arena not registered with HIP: no HIP runtime or GPU here (engines copy through unpinned memory)")
		return none, false, nil
	}
	h, err := rocm.OpenHIP(lib)
	if err != nil {
		return fail(err)
	}
	n, err := h.DeviceCount()
	if err == nil && n == 0 {
		err = fmt.Errorf("%w: no GPU", rocm.ErrHIPUnavailable)
	}
	if err == nil {
		err = h.HostRegister(mem)
	}
	if err != nil {
		_ = h.Close()
		return fail(err)
	}
	log.Info().Int("gpus", n).Int("arena_bytes", len(mem)).Msg("arena registered with HIP (hipHostRegister)")
	return func() {
		if err := h.HostUnregister(mem); err != nil {
			log.Warn().Err(err).Msg("hipHostUnregister of the arena failed")
		} else {
			log.Info().Msg("arena unregistered from HIP")
		}
		_ = h.Close()
	}, true, nil
}
