#include "textflag.h"

// The AVX2 twins of vec_amd64.s's kernels: 8 lanes, the same operations in
// the same order. n is a positive multiple of 8.

// The flush's constants: |x| as x AND absMask, and the smallest normal
// float32 (adam8, which has no register to spare for them, broadcasts them
// into its temporaries each time).
DATA absMask<>+0(SB)/4, $0x7fffffff
GLOBL absMask<>(SB), RODATA|NOPTR, $4
DATA minNormal<>+0(SB)/4, $0x00800000
GLOBL minNormal<>(SB), RODATA|NOPTR, $4

// func sgdMomentum8(p, grad, v *float32, n int, lr, mu, wd float32)
TEXT ·sgdMomentum8(SB), NOSPLIT, $0-44
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ v+16(FP), DX
	MOVQ n+24(FP), CX
	VBROADCASTSS lr+32(FP), Y10
	VBROADCASTSS mu+36(FP), Y11
	VBROADCASTSS wd+40(FP), Y12
	VBROADCASTSS absMask<>(SB), Y13
	VBROADCASTSS minNormal<>(SB), Y14
sgd8loop:
	VMOVUPS (DI), Y0
	VMULPS Y0, Y12, Y1
	VADDPS (SI), Y1, Y1
	VMULPS (DX), Y11, Y2
	VADDPS Y1, Y2, Y2
	// |m| < 2⁻¹²⁶ (ordered: not NaN) → +0
	VANDPS Y2, Y13, Y4
	VCMPPS $0x11, Y14, Y4, Y4
	VANDNPS Y2, Y4, Y2
	VMOVUPS Y2, (DX)
	VMULPS Y2, Y10, Y3
	VSUBPS Y3, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, DX
	SUBQ $8, CX
	JNZ sgd8loop
	VZEROUPPER
	RET

// func adam8(p, grad, m, v *float32, n int, c *AdamConsts)
TEXT ·adam8(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ m+16(FP), R8
	MOVQ v+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ c+40(FP), AX
	VBROADCASTSS 0(AX), Y8
	VBROADCASTSS 4(AX), Y9
	VBROADCASTSS 8(AX), Y10
	VBROADCASTSS 12(AX), Y11
	VBROADCASTSS 16(AX), Y12
	VBROADCASTSS 20(AX), Y13
	VBROADCASTSS 24(AX), Y14
	VBROADCASTSS 28(AX), Y15
adam8loop:
	VMOVUPS (DI), Y0
	VMULPS Y0, Y14, Y1
	VADDPS (SI), Y1, Y1
	VMULPS (R8), Y10, Y2
	VMULPS Y1, Y11, Y3
	VADDPS Y3, Y2, Y2
	VBROADCASTSS absMask<>(SB), Y3
	VANDPS Y2, Y3, Y3
	VBROADCASTSS minNormal<>(SB), Y6
	VCMPPS $0x11, Y6, Y3, Y3
	VANDNPS Y2, Y3, Y2
	VMOVUPS Y2, (R8)
	VMULPS (R9), Y12, Y4
	VMULPS Y1, Y13, Y5
	VMULPS Y1, Y5, Y5
	VADDPS Y5, Y4, Y4
	VBROADCASTSS absMask<>(SB), Y5
	VANDPS Y4, Y5, Y5
	VBROADCASTSS minNormal<>(SB), Y6
	VCMPPS $0x11, Y6, Y5, Y5
	VANDNPS Y4, Y5, Y4
	VMOVUPS Y4, (R9)
	VSQRTPS Y4, Y6
	VDIVPS Y9, Y6, Y6
	VADDPS Y15, Y6, Y6
	VMULPS Y2, Y8, Y7
	VDIVPS Y6, Y7, Y7
	VSUBPS Y7, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $32, R9
	SUBQ $8, CX
	JNZ adam8loop
	VZEROUPPER
	RET

// func relu8(x, y *float32, n int)
// y = x AND (NOT x ≤ 0): the unordered not-less-or-equal is true for NaN,
// so a NaN passes.
TEXT ·relu8(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Y15, Y15, Y15
relu8loop:
	VMOVUPS (SI), Y0
	VCMPPS $0x06, Y15, Y0, Y1
	VANDPS Y1, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ relu8loop
	VZEROUPPER
	RET

// func reluGrad8(y, dy, dx *float32, n int)
// dx = dy AND (y > 0, ordered).
TEXT ·reluGrad8(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), SI
	MOVQ dy+8(FP), DX
	MOVQ dx+16(FP), DI
	MOVQ n+24(FP), CX
	VXORPS Y15, Y15, Y15
relugrad8loop:
	VMOVUPS (SI), Y0
	VCMPPS $0x1e, Y15, Y0, Y1
	VANDPS (DX), Y1, Y1
	VMOVUPS Y1, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ relugrad8loop
	VZEROUPPER
	RET

// func finite8(x *float32, n int) bool
TEXT ·finite8(SB), NOSPLIT, $0-17
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS expMask<>(SB), Y1
finite8loop:
	VPAND (SI), Y1, Y0
	VPCMPEQD Y1, Y0, Y0
	VPTEST Y0, Y0
	JNZ notfinite8
	ADDQ $32, SI
	SUBQ $8, CX
	JNZ finite8loop
	MOVB $1, ret+16(FP)
	VZEROUPPER
	RET
notfinite8:
	MOVB $0, ret+16(FP)
	VZEROUPPER
	RET

DATA expMask<>+0(SB)/4, $0x7f800000
GLOBL expMask<>(SB), RODATA|NOPTR, $4

// func copyFinite8(dst, src *float32, n int) bool
// n is a positive multiple of 8: copyFinite16 in eight lanes, the
// non-finite lanes ORed into Y3.
TEXT ·copyFinite8(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS expMask<>(SB), Y1
	VPXOR Y3, Y3, Y3
copyfinite8loop:
	VMOVUPS (SI), Y0
	VMOVUPS Y0, (DI)
	VPAND Y0, Y1, Y2
	VPCMPEQD Y1, Y2, Y2
	VPOR Y2, Y3, Y3
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ copyfinite8loop
	VPTEST Y3, Y3
	SETEQ ret+24(FP)
	VZEROUPPER
	RET
