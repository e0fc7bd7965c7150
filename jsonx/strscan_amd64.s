//go:build amd64 && !purego

#include "textflag.h"

// The bytes broadcast into the compared vectors: 0x20 (the signed bound),
// '"' and '\\', each one load.
DATA strBounds<>+0(SB)/1, $0x20
DATA strBounds<>+1(SB)/1, $0x22
DATA strBounds<>+2(SB)/1, $0x5c
GLOBL strBounds<>(SB), RODATA|NOPTR, $3

// func plainBlocks(p *byte, n int) int
//
// One pass over 32-byte blocks for every byte String must look at: as
// signed bytes, 0x20 > c holds for the control characters and for every
// byte from 0x80; '"' and '\\' are compared for equality. Two blocks a
// round while two are left (their marks ORed, one VPTEST and one branch
// for 64 bytes), then one.
TEXT ·plainBlocks(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	ANDQ $~31, CX
	XORQ AX, AX
	VPBROADCASTB strBounds<>+0(SB), Y1
	VPBROADCASTB strBounds<>+1(SB), Y2
	VPBROADCASTB strBounds<>+2(SB), Y3

pairs:
	LEAQ      64(AX), DX
	CMPQ      DX, CX
	JA        loop
	VMOVDQU   (SI)(AX*1), Y0
	VMOVDQU   32(SI)(AX*1), Y7
	VPCMPGTB  Y0, Y1, Y4
	VPCMPEQB  Y0, Y2, Y5
	VPCMPEQB  Y0, Y3, Y6
	VPOR      Y4, Y5, Y4
	VPOR      Y4, Y6, Y4
	VPCMPGTB  Y7, Y1, Y8
	VPCMPEQB  Y7, Y2, Y5
	VPCMPEQB  Y7, Y3, Y6
	VPOR      Y8, Y5, Y8
	VPOR      Y8, Y6, Y8
	VPOR      Y4, Y8, Y9
	VPTEST    Y9, Y9
	JNZ       pairFound
	MOVQ      DX, AX
	JMP       pairs

pairFound:
	VPMOVMSKB Y4, DX
	TESTL     DX, DX
	JNZ       found
	VPMOVMSKB Y8, DX
	ADDQ      $32, AX
	JMP       found

loop:
	CMPQ AX, CX
	JAE  none
	VMOVDQU   (SI)(AX*1), Y0
	VPCMPGTB  Y0, Y1, Y4
	VPCMPEQB  Y0, Y2, Y5
	VPCMPEQB  Y0, Y3, Y6
	VPOR      Y4, Y5, Y4
	VPOR      Y4, Y6, Y4
	VPMOVMSKB Y4, DX
	TESTL     DX, DX
	JNZ       found
	ADDQ      $32, AX
	JMP       loop

found:
	BSFL DX, DX
	ADDQ DX, AX
	VZEROUPPER
	MOVQ AX, ret+16(FP)
	RET

none:
	VZEROUPPER
	MOVQ CX, ret+16(FP)
	RET
