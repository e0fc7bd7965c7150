//go:build amd64 && !purego

#include "textflag.h"

// func fold(init uint32, p *byte, n int, k *foldKeys, out *[2]uint64)
//
// Z0..Z3 hold 256 bytes; each step moves every 128-bit lane forward by 256
// bytes (lo qword × k.lo xor hi qword × k.hi) and XORs the next 256 bytes
// in. Then Z0 is folded into Z1, Z1 into Z2, Z2 into Z3 (64 bytes each),
// and Z3's lanes 0..2 into lane 3.
TEXT ·fold(SB), NOSPLIT, $0-40
	MOVL init+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ k+24(FP), DX
	MOVQ out+32(FP), DI

	VMOVDQU64 (SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVD     AX, X4
	VPXORQ    Z4, Z0, Z0
	ADDQ      $256, SI
	SUBQ      $256, CX
	VBROADCASTI32X4 (DX), Z4

loop:
	CMPQ CX, $256
	JB   reduce
	VPCLMULQDQ $0x00, Z4, Z0, Z5
	VPCLMULQDQ $0x11, Z4, Z0, Z0
	VPTERNLOGD $0x96, (SI), Z5, Z0
	VPCLMULQDQ $0x00, Z4, Z1, Z6
	VPCLMULQDQ $0x11, Z4, Z1, Z1
	VPTERNLOGD $0x96, 64(SI), Z6, Z1
	VPCLMULQDQ $0x00, Z4, Z2, Z7
	VPCLMULQDQ $0x11, Z4, Z2, Z2
	VPTERNLOGD $0x96, 128(SI), Z7, Z2
	VPCLMULQDQ $0x00, Z4, Z3, Z8
	VPCLMULQDQ $0x11, Z4, Z3, Z3
	VPTERNLOGD $0x96, 192(SI), Z8, Z3
	ADDQ $256, SI
	SUBQ $256, CX
	JMP  loop

reduce:
	VBROADCASTI32X4 16(DX), Z4
	VPCLMULQDQ $0x00, Z4, Z0, Z5
	VPCLMULQDQ $0x11, Z4, Z0, Z0
	VPTERNLOGD $0x96, Z5, Z0, Z1
	VPCLMULQDQ $0x00, Z4, Z1, Z5
	VPCLMULQDQ $0x11, Z4, Z1, Z1
	VPTERNLOGD $0x96, Z5, Z1, Z2
	VPCLMULQDQ $0x00, Z4, Z2, Z5
	VPCLMULQDQ $0x11, Z4, Z2, Z2
	VPTERNLOGD $0x96, Z5, Z2, Z3

	VMOVDQU64  32(DX), Z4
	VPCLMULQDQ $0x00, Z4, Z3, Z5
	VPCLMULQDQ $0x11, Z4, Z3, Z6
	VPXORQ     Z6, Z5, Z5
	VEXTRACTI32X4 $1, Z5, X6
	VEXTRACTI32X4 $2, Z5, X7
	VEXTRACTI32X4 $3, Z3, X8
	VPXOR      X6, X5, X5
	VPXOR      X7, X5, X5
	VPXOR      X8, X5, X5
	VMOVDQU    X5, (DI)
	VZEROUPPER
	RET
