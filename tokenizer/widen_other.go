//go:build !amd64 || purego

package tokenizer

import "unsafe"

// haveWiden is false here: AppendByteIDs's eight-byte loop is the fastest
// portable widening.
const haveWiden = false

// widenInGo: widenBytes below runs anywhere (its test calls it).
const widenInGo = true

// widenBytes is widen_amd64.s's contract in Go (src[i] as dst[i] for
// i < n), kept so both builds have the same function and its test runs.
func widenBytes(dst *uint32, src *byte, n int) {
	d, s := unsafe.Slice(dst, n), unsafe.Slice(src, n)
	for i, c := range s {
		d[i] = uint32(c)
	}
}
