//go:build !amd64 || purego

package continuation

import "unsafe"

// haveVecEqual is false here: sameFixed compares as Go does.
const haveVecEqual = false

// vecEqual is equal_amd64.s's contract in Go (a[:n] and b[:n] hold the
// same bytes), kept so both builds have the same function.
func vecEqual(a, b *byte, n int) bool {
	return string(unsafe.Slice(a, n)) == string(unsafe.Slice(b, n))
}
