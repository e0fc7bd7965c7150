//go:build amd64 && !purego

package continuation

import "golang.org/x/sys/cpu"

var haveIDScan = cpu.X86.HasAVX2

// idScanInGo: scanIDBlocks is the assembly, which needs AVX2.
const idScanInGo = false

// scanIDBlocks returns the offset of the first byte idStop stops at in
// p[:n&^31] (whole 32-byte blocks), or -1 (idscan_amd64.s).
//
//go:noescape
func scanIDBlocks(p *byte, n int) int
