//go:build amd64 && !purego

package tokenizer

import "golang.org/x/sys/cpu"

// haveWiden: widenBytes is the assembly, which needs AVX2.
var haveWiden = cpu.X86.HasAVX2

// widenInGo is false here: widenBytes is the assembly, which its test can
// run only where haveWiden.
const widenInGo = false

// widenBytes writes src[i] as dst[i] for i < n, n a multiple of 32:
// VPMOVZXBD widens eight bytes into eight ids an instruction
// (widen_amd64.s).
//
//go:noescape
func widenBytes(dst *uint32, src *byte, n int)
