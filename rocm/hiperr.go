package rocm

import (
	"errors"
	"fmt"
)

// Errors of the HIP shim (build tag rocm); declared in every build so
// callers can test for them without the tag.
var (
	// ErrHIP is wrapped by every error a HIP call returns.
	ErrHIP = errors.New("hip")
	// ErrHIPUnavailable: the HIP runtime library cannot be loaded.
	ErrHIPUnavailable = errors.New("hip runtime unavailable")
	// ErrHIPArgument: a call the shim refuses before reaching HIP.
	ErrHIPArgument = errors.New("invalid hip argument")
	// ErrHIPOutOfMemory is hipErrorOutOfMemory.
	ErrHIPOutOfMemory = errors.New("hip out of memory")
	// ErrHIPNoDevice is hipErrorNoDevice / hipErrorInvalidDevice.
	ErrHIPNoDevice = errors.New("hip device unavailable")
)

// hipError_t codes the shim maps to sentinels (hip_runtime_api.h).
const (
	hipErrorOutOfMemory   = 2
	hipErrorNoDevice      = 100
	hipErrorInvalidDevice = 101
)

// HIPError is a failed HIP call: errors.Is matches ErrHIP and, for the codes
// it knows, a specific sentinel.
type HIPError struct {
	Op   string // the HIP function, e.g. "hipMalloc"
	Code int    // its hipError_t
	Name string // hipGetErrorName of it
}

func (e *HIPError) Error() string {
	return fmt.Sprintf("%s: %s (%d)", e.Op, e.Name, e.Code)
}

// Unwrap lets errors.Is see ErrHIP and the code's sentinel.
func (e *HIPError) Unwrap() []error {
	switch e.Code {
	case hipErrorOutOfMemory:
		return []error{ErrHIP, ErrHIPOutOfMemory}
	case hipErrorNoDevice, hipErrorInvalidDevice:
		return []error{ErrHIP, ErrHIPNoDevice}
	}
	return []error{ErrHIP}
}
