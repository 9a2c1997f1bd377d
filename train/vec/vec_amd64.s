#include "textflag.h"

// func sgdMomentum16(p, grad, v *float32, n int, lr, mu, wd float32)
// n is a positive multiple of 16. Per value, in the Go loop's order:
// t = wd·w; d = g + t; u = mu·v; m = u + d; v = m; p = w − lr·m.
TEXT ·sgdMomentum16(SB), NOSPLIT, $0-44
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ v+16(FP), DX
	MOVQ n+24(FP), CX
	VBROADCASTSS lr+32(FP), Z10
	VBROADCASTSS mu+36(FP), Z11
	VBROADCASTSS wd+40(FP), Z12
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z13
	MOVL $0x00800000, AX
	VPBROADCASTD AX, Z14
	VPXORD Z31, Z31, Z31
sgdloop:
	VMOVUPS (DI), Z0
	VMULPS Z0, Z12, Z1
	VADDPS (SI), Z1, Z1
	VMULPS (DX), Z11, Z2
	VADDPS Z1, Z2, Z2
	// |m| < 2⁻¹²⁶ (ordered: not NaN) → +0
	VANDPS Z2, Z13, Z4
	VCMPPS $0x11, Z14, Z4, K1
	VMOVUPS Z31, K1, Z2
	VMOVUPS Z2, (DX)
	VMULPS Z2, Z10, Z3
	VSUBPS Z3, Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, DX
	SUBQ $16, CX
	JNZ sgdloop
	VZEROUPPER
	RET

// func adam16(p, grad, m, v *float32, n int, c *AdamConsts)
// AdamConsts: Step, Sq, B1, C1, B2, C2, WD, Eps at offsets 0…28.
// Per value: d = g + WD·w; m = B1·m + C1·d; v = B2·v + (C2·d)·d;
// p = w − (Step·m) / (√v / Sq + Eps).
TEXT ·adam16(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ m+16(FP), R8
	MOVQ v+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ c+40(FP), AX
	VBROADCASTSS 0(AX), Z20
	VBROADCASTSS 4(AX), Z21
	VBROADCASTSS 8(AX), Z22
	VBROADCASTSS 12(AX), Z23
	VBROADCASTSS 16(AX), Z24
	VBROADCASTSS 20(AX), Z25
	VBROADCASTSS 24(AX), Z26
	VBROADCASTSS 28(AX), Z27
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z28
	MOVL $0x00800000, AX
	VPBROADCASTD AX, Z29
	VPXORD Z31, Z31, Z31
adamloop:
	VMOVUPS (DI), Z0
	VMULPS Z0, Z26, Z1
	VADDPS (SI), Z1, Z1
	VMULPS (R8), Z22, Z2
	VMULPS Z1, Z23, Z3
	VADDPS Z3, Z2, Z2
	VANDPS Z2, Z28, Z3
	VCMPPS $0x11, Z29, Z3, K1
	VMOVUPS Z31, K1, Z2
	VMOVUPS Z2, (R8)
	VMULPS (R9), Z24, Z4
	VMULPS Z1, Z25, Z5
	VMULPS Z1, Z5, Z5
	VADDPS Z5, Z4, Z4
	VANDPS Z4, Z28, Z5
	VCMPPS $0x11, Z29, Z5, K1
	VMOVUPS Z31, K1, Z4
	VMOVUPS Z4, (R9)
	VSQRTPS Z4, Z6
	VDIVPS Z21, Z6, Z6
	VADDPS Z27, Z6, Z6
	VMULPS Z2, Z20, Z7
	VDIVPS Z6, Z7, Z7
	VSUBPS Z7, Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, R8
	ADDQ $64, R9
	SUBQ $16, CX
	JNZ adamloop
	VZEROUPPER
	RET

// func relu16(x, y *float32, n int)
// y = x where x > 0 or x is NaN, else 0: x ≤ 0 (an ordered compare, false
// for NaN) picks the lanes that become 0.
TEXT ·relu16(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DI
	MOVQ n+16(FP), CX
	VPXORD Z31, Z31, Z31
reluloop:
	VMOVUPS (SI), Z0
	VCMPPS $0x12, Z31, Z0, K1
	VMOVUPS Z31, K1, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ reluloop
	VZEROUPPER
	RET

// func reluGrad16(y, dy, dx *float32, n int)
// dx = dy where y > 0 (ordered: false for NaN), else 0.
TEXT ·reluGrad16(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), SI
	MOVQ dy+8(FP), DX
	MOVQ dx+16(FP), DI
	MOVQ n+24(FP), CX
	VPXORD Z31, Z31, Z31
relugradloop:
	VMOVUPS (SI), Z0
	VCMPPS $0x1e, Z31, Z0, K1
	VMOVUPS.Z (DX), K1, Z1
	VMOVUPS Z1, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ relugradloop
	VZEROUPPER
	RET

// func finite16(x *float32, n int) bool
// A value is NaN or ±Inf when its exponent bits are all ones.
TEXT ·finite16(SB), NOSPLIT, $0-17
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z1
finiteloop:
	VPANDD (SI), Z1, Z0
	VPCMPEQD Z1, Z0, K1
	KORTESTW K1, K1
	JNZ notfinite
	ADDQ $64, SI
	SUBQ $16, CX
	JNZ finiteloop
	MOVB $1, ret+16(FP)
	VZEROUPPER
	RET
notfinite:
	MOVB $0, ret+16(FP)
	VZEROUPPER
	RET

// func addRows16(dst *float32, ldd int, src *float32, lds, rows, n int)
// Each row: whole vectors, then the rest under a mask (K1 = 2^rest − 1),
// whose lanes outside it are neither read nor written.
TEXT ·addRows16(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ ldd+8(FP), R8
	SHLQ $2, R8
	MOVQ src+16(FP), SI
	MOVQ lds+24(FP), R9
	SHLQ $2, R9
	MOVQ rows+32(FP), R10
	MOVQ n+40(FP), R11
	MOVQ R11, CX
	ANDQ $15, CX
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K1
addrowsrow:
	MOVQ DI, DX
	MOVQ SI, BX
	MOVQ R11, CX
addrowsvec:
	CMPQ CX, $16
	JLT addrowstail
	VMOVUPS (BX), Z0
	VADDPS (DX), Z0, Z0
	VMOVUPS Z0, (DX)
	ADDQ $64, BX
	ADDQ $64, DX
	SUBQ $16, CX
	JMP addrowsvec
addrowstail:
	TESTQ CX, CX
	JZ addrowsnext
	VMOVUPS.Z (BX), K1, Z0
	VMOVUPS.Z (DX), K1, Z1
	VADDPS Z1, Z0, Z0
	VMOVUPS Z0, K1, (DX)
addrowsnext:
	ADDQ R8, DI
	ADDQ R9, SI
	DECQ R10
	JNZ addrowsrow
	VZEROUPPER
	RET

// func copyRows16(dst *float32, ldd int, src *float32, lds, rows, n int)
// addRows16's walk, copying.
TEXT ·copyRows16(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ ldd+8(FP), R8
	SHLQ $2, R8
	MOVQ src+16(FP), SI
	MOVQ lds+24(FP), R9
	SHLQ $2, R9
	MOVQ rows+32(FP), R10
	MOVQ n+40(FP), R11
	MOVQ R11, CX
	ANDQ $15, CX
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K1
copyrowsrow:
	MOVQ DI, DX
	MOVQ SI, BX
	MOVQ R11, CX
copyrowsvec:
	CMPQ CX, $16
	JLT copyrowstail
	VMOVUPS (BX), Z0
	VMOVUPS Z0, (DX)
	ADDQ $64, BX
	ADDQ $64, DX
	SUBQ $16, CX
	JMP copyrowsvec
copyrowstail:
	TESTQ CX, CX
	JZ copyrowsnext
	VMOVUPS.Z (BX), K1, Z0
	VMOVUPS Z0, K1, (DX)
copyrowsnext:
	ADDQ R8, DI
	ADDQ R9, SI
	DECQ R10
	JNZ copyrowsrow
	VZEROUPPER
	RET
