//go:build amd64 && !purego

package jsonx

import "golang.org/x/sys/cpu"

var haveStrScan = cpu.X86.HasAVX2

// strScanInGo: plainBlocks is the assembly, which needs AVX2.
const strScanInGo = false

// plainBlocks returns the offset of the first byte in p[:n&^31] (whole
// 32-byte blocks) that is not plain string content (a control character,
// '"', '\\' or a byte from 0x80), or n&^31 when there is none
// (strscan_amd64.s).
//
//go:noescape
func plainBlocks(p *byte, n int) int
