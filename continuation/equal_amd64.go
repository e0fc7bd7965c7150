//go:build amd64 && !purego

package continuation

// haveVecEqual: vecEqual is the assembly, which needs AVX2 (as
// scanIDBlocks does).
var haveVecEqual = haveIDScan

// vecEqual reports whether a[:n] and b[:n] hold the same bytes; n >= 32
// (equal_amd64.s).
//
//go:noescape
func vecEqual(a, b *byte, n int) bool
