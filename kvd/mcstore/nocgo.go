//go:build !mooncake || !cgo

package mcstore

import (
	"errors"
	"unsafe"
)

// Store is unavailable in a build without the mooncake tag.
type Store struct{}

// Open reports ErrUnavailable: this binary was built without Mooncake
// Store support (make build-gpu builds it with).
func Open(cfg Config) (*Store, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return nil, errors.Join(ErrUnavailable, errors.New("this infera binary was built without the mooncake tag (make build-gpu)"))
}

// Put is never reached (Open fails).
func (*Store) Put(string, []byte) error { return ErrUnavailable }

// Get is never reached (Open fails).
func (*Store) Get(string, []byte) ([]byte, error) { return nil, ErrUnavailable }

// Exists is never reached (Open fails).
func (*Store) Exists(string) (bool, error) { return false, ErrUnavailable }

// Remove is never reached (Open fails).
func (*Store) Remove(string) error { return ErrUnavailable }

// Healthy is never reached (Open fails).
func (*Store) Healthy() error { return ErrUnavailable }

// RegisterBuffer is never reached (Open fails).
func (*Store) RegisterBuffer(unsafe.Pointer, uintptr) error { return ErrUnavailable }

// UnregisterBuffer is never reached (Open fails).
func (*Store) UnregisterBuffer(unsafe.Pointer) error { return ErrUnavailable }

// Close does nothing.
func (*Store) Close() error { return nil }
