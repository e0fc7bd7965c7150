//go:build !amd64 || purego

package continuation

import "unsafe"

// haveIDScan is false here: idArrayEnd takes its three IndexByte passes,
// which beat a byte loop without vector instructions.
const haveIDScan = false

// idScanInGo: scanIDBlocks below runs anywhere (its test calls it).
const idScanInGo = true

// scanIDBlocks is idscan_amd64.s's contract in Go (the first byte idStop
// stops at in p[:n&^31], or -1), kept so both builds have the same function.
func scanIDBlocks(p *byte, n int) int {
	for i, c := range unsafe.Slice(p, n&^31) {
		if idStop(c) {
			return i
		}
	}
	return -1
}
