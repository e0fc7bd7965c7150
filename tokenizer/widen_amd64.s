//go:build amd64 && !purego

#include "textflag.h"

// func widenBytes(dst *uint32, src *byte, n int)
//
// n is a positive multiple of 32: four VPMOVZXBD loads (eight bytes each,
// zero-extended to eight 32-bit ids) and four 32-byte stores a round.
TEXT ·widenBytes(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VPMOVZXBD 0(SI), Y0
	VPMOVZXBD 8(SI), Y1
	VPMOVZXBD 16(SI), Y2
	VPMOVZXBD 24(SI), Y3
	VMOVDQU   Y0, 0(DI)
	VMOVDQU   Y1, 32(DI)
	VMOVDQU   Y2, 64(DI)
	VMOVDQU   Y3, 96(DI)
	ADDQ      $32, SI
	ADDQ      $128, DI
	SUBQ      $32, CX
	JNZ       loop
	VZEROUPPER
	RET
