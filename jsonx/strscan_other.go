//go:build !amd64 || purego

package jsonx

import "unsafe"

// haveStrScan is false here: String's eight-byte loop is the fastest
// portable skip.
const haveStrScan = false

// strScanInGo: plainBlocks below runs anywhere (its test calls it).
const strScanInGo = true

// plainBlocks is strscan_amd64.s's contract in Go (the offset of the first
// byte in p[:n&^31] that is not plain string content, or n&^31), kept so
// both builds have the same function.
func plainBlocks(p *byte, n int) int {
	for i, c := range unsafe.Slice(p, n&^31) {
		if c >= 0x80 || !strSafe[c] {
			return i
		}
	}
	return n &^ 31
}
