//go:build amd64 && !purego

package tablespace

import "golang.org/x/sys/cpu"

var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ

// fold folds p[:n] (n a multiple of 256, at least 256), its first word
// XORed with init, into the 16 bytes out with the same CRC remainder
// (crc32c_amd64.s).
//
//go:noescape
func fold(init uint32, p *byte, n int, k *foldKeys, out *[2]uint64)
