//go:build unix

package transport

import (
	"fmt"
	"syscall"
)

// AllocHost maps size bytes of anonymous, page-aligned host memory outside
// the Go heap, suitable for registration with any engine (C may keep
// pointers to it). Free it with FreeHost after deregistering.
func AllocHost(size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("alloc host %d bytes: %w", size, ErrInvalid)
	}
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("alloc host %d bytes: %w", size, err)
	}
	return b, nil
}

// FreeHost unmaps memory from AllocHost.
func FreeHost(b []byte) error {
	if err := syscall.Munmap(b); err != nil {
		return fmt.Errorf("free host: %w", err)
	}
	return nil
}
