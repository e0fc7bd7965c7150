//go:build amd64 && !purego

#include "textflag.h"

// func scanIDBlocks(p *byte, n int) int
//
// The first byte outside ' '..'9' (idStop) in whole 32-byte blocks. Adding
// 0x60 maps ' '..'9' (0x20..0x39) to 0x80..0x99, the signed bytes
// -128..-103, so one signed compare with -103 finds every other byte: an
// add (with the load folded in) and a compare a block, four blocks a round
// (a prompt's ids are thousands of bytes) with one test of the four.
TEXT ·scanIDBlocks(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	ANDQ $~31, CX
	MOVQ CX, BX
	ANDQ $~127, BX
	XORQ AX, AX
	MOVQ $0x60, DX
	MOVQ DX, X1
	VPBROADCASTB X1, Y1
	MOVQ $0x99, DX
	MOVQ DX, X2
	VPBROADCASTB X2, Y2
	CMPQ AX, BX
	JAE  block

round:
	VPADDB    (SI)(AX*1), Y1, Y3
	VPADDB    32(SI)(AX*1), Y1, Y4
	VPADDB    64(SI)(AX*1), Y1, Y5
	VPADDB    96(SI)(AX*1), Y1, Y6
	VPCMPGTB  Y2, Y3, Y3
	VPCMPGTB  Y2, Y4, Y4
	VPCMPGTB  Y2, Y5, Y5
	VPCMPGTB  Y2, Y6, Y6
	VPOR      Y3, Y4, Y7
	VPOR      Y5, Y6, Y8
	VPOR      Y7, Y8, Y7
	VPTEST    Y7, Y7
	JNZ       inround
	ADDQ      $128, AX
	CMPQ      AX, BX
	JB        round

block:
	CMPQ AX, CX
	JAE  none
	VPADDB    (SI)(AX*1), Y1, Y3
	VPCMPGTB  Y2, Y3, Y3
	VPMOVMSKB Y3, DX
	TESTL     DX, DX
	JNZ       found
	ADDQ      $32, AX
	JMP       block

inround:
	VPMOVMSKB Y3, DX
	TESTL     DX, DX
	JNZ       found
	ADDQ      $32, AX
	VPMOVMSKB Y4, DX
	TESTL     DX, DX
	JNZ       found
	ADDQ      $32, AX
	VPMOVMSKB Y5, DX
	TESTL     DX, DX
	JNZ       found
	ADDQ      $32, AX
	VPMOVMSKB Y6, DX

found:
	BSFL DX, DX
	ADDQ DX, AX
	VZEROUPPER
	MOVQ AX, ret+16(FP)
	RET

none:
	VZEROUPPER
	MOVQ $-1, ret+16(FP)
	RET
