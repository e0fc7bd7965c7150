//go:build amd64 && !purego

#include "textflag.h"

// func vecEqual(a, b *byte, n int) bool
//
// Whether a[:n] and b[:n] hold the same bytes, n >= 32: two 32-byte blocks
// a round, then one block if 32 or more bytes are left, then the last 32
// bytes (overlapping what was compared). A steady chunk's fixed runs are
// 50–150 bytes: memequal's 64-byte rounds end in an 8-byte loop, which
// this replaces with one or two blocks.
TEXT ·vecEqual(SB), NOSPLIT, $0-25
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	LEAQ -32(CX), BX // the last block
	XORQ AX, AX
	CMPQ CX, $64
	JB   tail
	SUBQ $64, CX     // the last round's start

round:
	VMOVDQU   (SI)(AX*1), Y0
	VMOVDQU   32(SI)(AX*1), Y1
	VPCMPEQB  (DI)(AX*1), Y0, Y0
	VPCMPEQB  32(DI)(AX*1), Y1, Y1
	VPAND     Y0, Y1, Y0
	VPMOVMSKB Y0, DX
	CMPL      DX, $0xffffffff
	JNE       differ
	ADDQ      $64, AX
	CMPQ      AX, CX
	JBE       round

tail:
	CMPQ      AX, BX
	JAE       last
	VMOVDQU   (SI)(AX*1), Y0
	VPCMPEQB  (DI)(AX*1), Y0, Y0
	VPMOVMSKB Y0, DX
	CMPL      DX, $0xffffffff
	JNE       differ

last:
	VMOVDQU   (SI)(BX*1), Y0
	VPCMPEQB  (DI)(BX*1), Y0, Y0
	VPMOVMSKB Y0, DX
	VZEROUPPER
	CMPL      DX, $0xffffffff
	SETEQ     ret+24(FP)
	RET

differ:
	VZEROUPPER
	MOVB $0, ret+24(FP)
	RET
