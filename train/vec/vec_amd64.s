#include "textflag.h"

// HALVE_Z0 adds Z0's 16 lanes into lane 0 of X0, halving pairwise: lane
// l plus l+8, then l+4, l+2, l+1 (clobbers Z1).
#define HALVE_Z0 \
	VEXTRACTF32X8 $1, Z0, Y1 \
	VADDPS Y1, Y0, Y0 \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPS X1, X0, X0 \
	VMOVHLPS X0, X0, X1 \
	VADDPS X1, X0, X0 \
	VMOVSHDUP X0, X1 \
	VADDSS X1, X0, X0

// SUM64_BEGIN loads sum16's and sumSquares16's arguments and zeroes
// their 64 running sums, Z0–Z3.
#define SUM64_BEGIN \
	MOVQ x+0(FP), SI \
	MOVQ blocks+8(FP), CX \
	VPXORD Z0, Z0, Z0 \
	VPXORD Z1, Z1, Z1 \
	VPXORD Z2, Z2, Z2 \
	VPXORD Z3, Z3, Z3

// SUM64_TAIL loads the 16 values at off(SI) under the mask in argument
// marg into Z4 (zeros past it) and the mask into K1.
#define SUM64_TAIL(off, marg) \
	MOVQ marg(FP), AX \
	KMOVW AX, K1 \
	VMOVUPS.Z off(SI), K1, Z4

// SUM64_END halves the 64 running sums into the result and returns.
#define SUM64_END \
	VADDPS Z2, Z0, Z0 \
	VADDPS Z3, Z1, Z1 \
	VADDPS Z1, Z0, Z0 \
	HALVE_Z0 \
	MOVSS X0, ret+48(FP) \
	VZEROUPPER \
	RET

// SCALAR16 is the body of a kernel dst = src OP c over n, a positive
// multiple of 16, with c broadcast.
#define SCALAR16(OP, LOOP) \
	MOVQ dst+0(FP), DI \
	MOVQ src+8(FP), SI \
	MOVQ n+16(FP), CX \
	VBROADCASTSS c+24(FP), Z1 \
LOOP: \
	OP (SI), Z1, Z0 \
	VMOVUPS Z0, (DI) \
	ADDQ $64, SI \
	ADDQ $64, DI \
	SUBQ $16, CX \
	JNZ LOOP \
	VZEROUPPER \
	RET

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

// func rows16(dst *float32, ldd int, src *float32, lds, rows, n, add int)
// Each row: whole vectors, then the rest under a mask (K1 = 2^rest − 1),
// whose lanes outside it are neither read nor written; with add ≠ 0 the
// row of src is added into dst's, else copied over it.
TEXT ·rows16(SB), NOSPLIT, $0-56
	MOVQ dst+0(FP), DI
	MOVQ ldd+8(FP), R8
	SHLQ $2, R8
	MOVQ src+16(FP), SI
	MOVQ lds+24(FP), R9
	SHLQ $2, R9
	MOVQ rows+32(FP), R10
	MOVQ n+40(FP), R11
	MOVQ add+48(FP), R12
	MOVQ R11, CX
	ANDQ $15, CX
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K1
rowsrow:
	MOVQ DI, DX
	MOVQ SI, BX
	MOVQ R11, CX
rowsvec:
	CMPQ CX, $16
	JLT rowstail
	VMOVUPS (BX), Z0
	TESTQ R12, R12
	JZ rowsstore
	VADDPS (DX), Z0, Z0
rowsstore:
	VMOVUPS Z0, (DX)
	ADDQ $64, BX
	ADDQ $64, DX
	SUBQ $16, CX
	JMP rowsvec
rowstail:
	TESTQ CX, CX
	JZ rowsnext
	VMOVUPS.Z (BX), K1, Z0
	TESTQ R12, R12
	JZ rowstailstore
	VMOVUPS.Z (DX), K1, Z1
	VADDPS Z1, Z0, Z0
rowstailstore:
	VMOVUPS Z0, K1, (DX)
rowsnext:
	ADDQ R8, DI
	ADDQ R9, SI
	DECQ R10
	JNZ rowsrow
	VZEROUPPER
	RET

// The 2×2 max-pool: lanes i of a, b, c, d are window i's four values (a b
// over c d), taken from two rows of 32 by VPERMI2PS with the even and odd
// indices; the gradient interleaves four zero-masked copies of dy back.
DATA poolEven<>+0(SB)/4, $0
DATA poolEven<>+4(SB)/4, $2
DATA poolEven<>+8(SB)/4, $4
DATA poolEven<>+12(SB)/4, $6
DATA poolEven<>+16(SB)/4, $8
DATA poolEven<>+20(SB)/4, $10
DATA poolEven<>+24(SB)/4, $12
DATA poolEven<>+28(SB)/4, $14
DATA poolEven<>+32(SB)/4, $16
DATA poolEven<>+36(SB)/4, $18
DATA poolEven<>+40(SB)/4, $20
DATA poolEven<>+44(SB)/4, $22
DATA poolEven<>+48(SB)/4, $24
DATA poolEven<>+52(SB)/4, $26
DATA poolEven<>+56(SB)/4, $28
DATA poolEven<>+60(SB)/4, $30
GLOBL poolEven<>(SB), RODATA|NOPTR, $64
DATA poolOdd<>+0(SB)/4, $1
DATA poolOdd<>+4(SB)/4, $3
DATA poolOdd<>+8(SB)/4, $5
DATA poolOdd<>+12(SB)/4, $7
DATA poolOdd<>+16(SB)/4, $9
DATA poolOdd<>+20(SB)/4, $11
DATA poolOdd<>+24(SB)/4, $13
DATA poolOdd<>+28(SB)/4, $15
DATA poolOdd<>+32(SB)/4, $17
DATA poolOdd<>+36(SB)/4, $19
DATA poolOdd<>+40(SB)/4, $21
DATA poolOdd<>+44(SB)/4, $23
DATA poolOdd<>+48(SB)/4, $25
DATA poolOdd<>+52(SB)/4, $27
DATA poolOdd<>+56(SB)/4, $29
DATA poolOdd<>+60(SB)/4, $31
GLOBL poolOdd<>(SB), RODATA|NOPTR, $64
DATA poolLo<>+0(SB)/4, $0
DATA poolLo<>+4(SB)/4, $16
DATA poolLo<>+8(SB)/4, $1
DATA poolLo<>+12(SB)/4, $17
DATA poolLo<>+16(SB)/4, $2
DATA poolLo<>+20(SB)/4, $18
DATA poolLo<>+24(SB)/4, $3
DATA poolLo<>+28(SB)/4, $19
DATA poolLo<>+32(SB)/4, $4
DATA poolLo<>+36(SB)/4, $20
DATA poolLo<>+40(SB)/4, $5
DATA poolLo<>+44(SB)/4, $21
DATA poolLo<>+48(SB)/4, $6
DATA poolLo<>+52(SB)/4, $22
DATA poolLo<>+56(SB)/4, $7
DATA poolLo<>+60(SB)/4, $23
GLOBL poolLo<>(SB), RODATA|NOPTR, $64
DATA poolHi<>+0(SB)/4, $8
DATA poolHi<>+4(SB)/4, $24
DATA poolHi<>+8(SB)/4, $9
DATA poolHi<>+12(SB)/4, $25
DATA poolHi<>+16(SB)/4, $10
DATA poolHi<>+20(SB)/4, $26
DATA poolHi<>+24(SB)/4, $11
DATA poolHi<>+28(SB)/4, $27
DATA poolHi<>+32(SB)/4, $12
DATA poolHi<>+36(SB)/4, $28
DATA poolHi<>+40(SB)/4, $13
DATA poolHi<>+44(SB)/4, $29
DATA poolHi<>+48(SB)/4, $14
DATA poolHi<>+52(SB)/4, $30
DATA poolHi<>+56(SB)/4, $15
DATA poolHi<>+60(SB)/4, $31
GLOBL poolHi<>(SB), RODATA|NOPTR, $64

// func maxPool2x16(x *float32, w int, y, dy, dx *float32, ow, rows int)
// With dx nil, the values into y (rows ow apart); else the gradient: dy
// (rows ow apart) into dx (rows w apart, as x). Window i's winner: d where
// K6, c where K5 and not K6, b where K4 and neither, a where none.
TEXT ·maxPool2x16(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), R8
	SHLQ $2, R8
	MOVQ y+16(FP), DI
	MOVQ dy+24(FP), DX
	MOVQ dx+32(FP), R14
	MOVQ ow+40(FP), R9
	MOVQ rows+48(FP), R10
	VMOVUPS poolEven<>(SB), Z30
	VMOVUPS poolOdd<>(SB), Z31
	VMOVUPS poolLo<>(SB), Z28
	VMOVUPS poolHi<>(SB), Z29
mprow:
	LEAQ (SI)(R8*1), BX
	XORQ R12, R12
	MOVQ R9, R11
mpchunk:
	MOVQ R11, CX
	CMPQ CX, $16
	JLE mpr
	MOVQ $16, CX
mpr:
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K1
	ADDQ CX, CX
	MOVQ CX, R13
	CMPQ CX, $16
	JLE mplo
	MOVQ $16, CX
mplo:
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K2
	SUBQ CX, R13
	MOVQ R13, CX
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K3
	VMOVUPS.Z (SI)(R12*2), K2, Z0
	VMOVUPS.Z 64(SI)(R12*2), K3, Z1
	VMOVUPS.Z (BX)(R12*2), K2, Z2
	VMOVUPS.Z 64(BX)(R12*2), K3, Z3
	VMOVAPS Z30, Z4
	VPERMI2PS Z1, Z0, Z4
	VMOVAPS Z31, Z5
	VPERMI2PS Z1, Z0, Z5
	VMOVAPS Z30, Z6
	VPERMI2PS Z3, Z2, Z6
	VMOVAPS Z31, Z7
	VPERMI2PS Z3, Z2, Z7
	VCMPPS $0x1e, Z4, Z5, K4
	VMOVAPS Z5, K4, Z4
	VCMPPS $0x1e, Z4, Z6, K5
	VMOVAPS Z6, K5, Z4
	VCMPPS $0x1e, Z4, Z7, K6
	VMOVAPS Z7, K6, Z4
	TESTQ R14, R14
	JNZ mpgrad
	VMOVUPS Z4, K1, (DI)(R12*1)
	JMP mpnext
mpgrad:
	VMOVUPS.Z (DX)(R12*1), K1, Z8
	KORW K5, K6, K7
	KANDNW K5, K6, K5
	KANDNW K4, K7, K4
	KORW K4, K7, K7
	KNOTW K7, K7
	VMOVAPS.Z Z8, K7, Z9
	VMOVAPS.Z Z8, K4, Z10
	VMOVAPS.Z Z8, K5, Z11
	VMOVAPS.Z Z8, K6, Z12
	VMOVAPS Z28, Z13
	VPERMI2PS Z10, Z9, Z13
	VMOVAPS Z29, Z14
	VPERMI2PS Z10, Z9, Z14
	VMOVAPS Z28, Z15
	VPERMI2PS Z12, Z11, Z15
	VMOVAPS Z29, Z16
	VPERMI2PS Z12, Z11, Z16
	LEAQ (R14)(R8*1), AX
	VMOVUPS Z13, K2, (R14)(R12*2)
	VMOVUPS Z14, K3, 64(R14)(R12*2)
	VMOVUPS Z15, K2, (AX)(R12*2)
	VMOVUPS Z16, K3, 64(AX)(R12*2)
mpnext:
	ADDQ $64, R12
	SUBQ $16, R11
	JGT mpchunk
	LEAQ (SI)(R8*2), SI
	LEAQ (DI)(R9*4), DI
	LEAQ (DX)(R9*4), DX
	TESTQ R14, R14
	JZ mprownext
	LEAQ (R14)(R8*2), R14
mprownext:
	DECQ R10
	JNZ mprow
	VZEROUPPER
	RET

// func sum16(x *float32, blocks, m0, m1, m2, m3 int) float32
// Z0–Z3 are the 64 running sums; blocks of 64 values, then the rest under
// masks m0–m3 (merge-masked: a lane past the end keeps its sum); then
// halved: Z0+Z2, Z1+Z3 (l and l+32), their sum (l+16), and within a
// vector l+8, l+4, l+2, l+1.
TEXT ·sum16(SB), NOSPLIT, $0-52
	SUM64_BEGIN
	TESTQ CX, CX
	JZ sumrest
sumloop:
	VADDPS (SI), Z0, Z0
	VADDPS 64(SI), Z1, Z1
	VADDPS 128(SI), Z2, Z2
	VADDPS 192(SI), Z3, Z3
	ADDQ $256, SI
	DECQ CX
	JNZ sumloop
sumrest:
	SUM64_TAIL(0, m0+16)
	VADDPS Z4, Z0, K1, Z0
	SUM64_TAIL(64, m1+24)
	VADDPS Z4, Z1, K1, Z1
	SUM64_TAIL(128, m2+32)
	VADDPS Z4, Z2, K1, Z2
	SUM64_TAIL(192, m3+40)
	VADDPS Z4, Z3, K1, Z3
	SUM64_END

// func copyFinite16(dst, src *float32, n int) bool
// n is a positive multiple of 16. Each vector is stored, and its lanes
// whose exponent is all ones (NaN, ±Inf) are ORed into K2.
TEXT ·copyFinite16(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z1
	KXORW K2, K2, K2
copyfiniteloop:
	VMOVUPS (SI), Z0
	VMOVUPS Z0, (DI)
	VPANDD Z0, Z1, Z2
	VPCMPEQD Z1, Z2, K1
	KORW K1, K2, K2
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ copyfiniteloop
	KORTESTW K2, K2
	SETEQ ret+24(FP)
	VZEROUPPER
	RET

// The bodies of exp16 and erf16, shared with the GELU kernels as macros.
// EXP_CONSTS fills Z17–Z31 with Exp32's constants (log2 e, ½, Cephes'
// c1, c2 and p0–p4, 1, the ends of its range, +Inf, the exponent's bias
// and 0); EXP turns the 16 inputs in Z0 into their Exp32 in Z6, with Z1–Z9 and K1–K3
// for scratch.
#define EXP_CONSTS \
	MOVL $0x3fb8aa3b, AX; \
	VPBROADCASTD AX, Z20; \
	MOVL $0x3f000000, AX; \
	VPBROADCASTD AX, Z21; \
	MOVL $0x3f318000, AX; \
	VPBROADCASTD AX, Z22; \
	MOVL $0xb95e8083, AX; \
	VPBROADCASTD AX, Z23; \
	MOVL $0x39506967, AX; \
	VPBROADCASTD AX, Z24; \
	MOVL $0x3ab743ce, AX; \
	VPBROADCASTD AX, Z25; \
	MOVL $0x3c088908, AX; \
	VPBROADCASTD AX, Z26; \
	MOVL $0x3d2aa9c1, AX; \
	VPBROADCASTD AX, Z27; \
	MOVL $0x3e2aaaaa, AX; \
	VPBROADCASTD AX, Z28; \
	MOVL $0x3f800000, AX; \
	VPBROADCASTD AX, Z29; \
	MOVL $0x42b17217, AX; \
	VPBROADCASTD AX, Z30; \
	MOVL $0xc2aeac50, AX; \
	VPBROADCASTD AX, Z31; \
	MOVL $0x7f800000, AX; \
	VPBROADCASTD AX, Z19; \
	MOVL $127, AX; \
	VPBROADCASTD AX, Z18; \
	VPXORD Z17, Z17, Z17;

#define EXP \
	VMULPS Z20, Z0, Z1; \
	VADDPS Z21, Z1, Z1; \
	VRNDSCALEPS $0x09, Z1, Z2; \
	VCVTTPS2DQ Z2, Z3; \
	VMULPS Z22, Z2, Z4; \
	VSUBPS Z4, Z0, Z5; \
	VMULPS Z23, Z2, Z4; \
	VSUBPS Z4, Z5, Z5; \
	VMULPS Z24, Z5, Z6; \
	VADDPS Z25, Z6, Z6; \
	VMULPS Z5, Z6, Z6; \
	VADDPS Z26, Z6, Z6; \
	VMULPS Z5, Z6, Z6; \
	VADDPS Z27, Z6, Z6; \
	VMULPS Z5, Z6, Z6; \
	VADDPS Z28, Z6, Z6; \
	VMULPS Z5, Z6, Z6; \
	VADDPS Z21, Z6, Z6; \
	VMULPS Z5, Z5, Z7; \
	VMULPS Z7, Z6, Z6; \
	VADDPS Z5, Z6, Z6; \
	VADDPS Z29, Z6, Z6; \
	VPSRAD $1, Z3, Z8; \
	VPSUBD Z8, Z3, Z9; \
	VPADDD Z18, Z8, Z8; \
	VPSLLD $23, Z8, Z8; \
	VPADDD Z18, Z9, Z9; \
	VPSLLD $23, Z9, Z9; \
	VMULPS Z8, Z6, Z6; \
	VMULPS Z9, Z6, Z6; \
	VCMPPS $0x1e, Z30, Z0, K1; \
	VMOVUPS Z19, K1, Z6; \
	VCMPPS $0x11, Z31, Z0, K2; \
	VMOVUPS Z17, K2, Z6; \
	VCMPPS $0x03, Z0, Z0, K3; \
	VMOVUPS Z0, K3, Z6;

// ERF_CONSTS fills Z18–Z31 with Erf32's (±4 and the two polynomials');
// ERF turns the 16 inputs in Z0 into their Erf32 in Z5, with Z1–Z4 for scratch.
#define ERF_CONSTS \
	MOVL $0xc0800000, AX; \
	VPBROADCASTD AX, Z18; \
	MOVL $0x40800000, AX; \
	VPBROADCASTD AX, Z19; \
	MOVL $0xaf95df0b, AX; \
	VPBROADCASTD AX, Z20; \
	MOVL $0x32edffee, AX; \
	VPBROADCASTD AX, Z21; \
	MOVL $0xb60cff51, AX; \
	VPBROADCASTD AX, Z22; \
	MOVL $0xb86ec2d2, AX; \
	VPBROADCASTD AX, Z23; \
	MOVL $0xba40ac63, AX; \
	VPBROADCASTD AX, Z24; \
	MOVL $0xbb41a1f6, AX; \
	VPBROADCASTD AX, Z25; \
	MOVL $0xbc83dbd4, AX; \
	VPBROADCASTD AX, Z26; \
	MOVL $0xb77460cd, AX; \
	VPBROADCASTD AX, Z27; \
	MOVL $0xb95fbd29, AX; \
	VPBROADCASTD AX, Z28; \
	MOVL $0xbadc924e, AX; \
	VPBROADCASTD AX, Z29; \
	MOVL $0xbbf19bf8, AX; \
	VPBROADCASTD AX, Z30; \
	MOVL $0xbc69b6a7, AX; \
	VPBROADCASTD AX, Z31;

#define ERF \
	VMAXPS Z0, Z18, Z1; \
	VMINPS Z1, Z19, Z1; \
	VMULPS Z1, Z1, Z2; \
	VMULPS Z20, Z2, Z3; \
	VADDPS Z21, Z3, Z3; \
	VMULPS Z3, Z2, Z3; \
	VADDPS Z22, Z3, Z3; \
	VMULPS Z3, Z2, Z3; \
	VADDPS Z23, Z3, Z3; \
	VMULPS Z3, Z2, Z3; \
	VADDPS Z24, Z3, Z3; \
	VMULPS Z3, Z2, Z3; \
	VADDPS Z25, Z3, Z3; \
	VMULPS Z3, Z2, Z3; \
	VADDPS Z26, Z3, Z3; \
	VMULPS Z3, Z1, Z3; \
	VMULPS Z27, Z2, Z4; \
	VADDPS Z28, Z4, Z4; \
	VMULPS Z4, Z2, Z4; \
	VADDPS Z29, Z4, Z4; \
	VMULPS Z4, Z2, Z4; \
	VADDPS Z30, Z4, Z4; \
	VMULPS Z4, Z2, Z4; \
	VADDPS Z31, Z4, Z4; \
	VDIVPS Z4, Z3, Z5;

// func exp16(dst, src *float32, n int)
// Exp32 on 16 lanes, bit for bit: the same float32 operations in the same
// order (no fused multiply-add), floor by VRNDSCALEPS, 2ⁿ as two factors
// built from exponent bits (exact where Exp32 scales once), and the out of
// range lanes blended in last: +Inf above 88.72283, 0 below −87.33655,
// NaN as it came.
TEXT ·exp16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	EXP_CONSTS
exploop:
	VMOVUPS (SI), Z0
	EXP
	VMOVUPS Z6, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ exploop
	VZEROUPPER
	RET

// func erf16(dst, src *float32, n int)
// Erf32 on 16 lanes, bit for bit: x clamped to [−4, 4] (a NaN kept: the
// max and min give their second operand, x, when one is NaN), then the
// same polynomials, multiplied and added in the same order, and one
// division.
TEXT ·erf16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	ERF_CONSTS
erfloop:
	VMOVUPS (SI), Z0
	ERF
	VMOVUPS Z5, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ erfloop
	VZEROUPPER
	RET

// func gelu16(out, cdf, x *float32, n int)
// GELU on 16 lanes, bit for bit GELU's scalar loop: z = x·(1/√2) rounded,
// Φ = 0.5·(1 + erf(z)) (the sum rounded, the halving exact), out = x·Φ.
TEXT ·gelu16(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ cdf+8(FP), DX
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX
	ERF_CONSTS
	MOVL $0x3f3504f3, AX
	VPBROADCASTD AX, Z16 // 1/√2
	MOVL $0x3f800000, AX
	VPBROADCASTD AX, Z17 // 1
	MOVL $0x3f000000, AX
	VPBROADCASTD AX, Z15 // 0.5
geluloop:
	VMOVUPS (SI), Z10
	VMULPS Z16, Z10, Z0
	ERF
	VADDPS Z17, Z5, Z5
	VMULPS Z15, Z5, Z5
	VMOVUPS Z5, (DX)
	VMULPS Z5, Z10, Z6
	VMOVUPS Z6, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ geluloop
	VZEROUPPER
	RET

// func geluGrad16(dx, dy, x, cdf *float32, n int)
// GELU's gradient on 16 lanes, bit for bit GELUGrad's scalar loop:
// φ = exp(−0.5·x²)·(1/√(2π)), each product rounded, then dy·(Φ + x·φ).
TEXT ·geluGrad16(SB), NOSPLIT, $0-40
	MOVQ dx+0(FP), DI
	MOVQ dy+8(FP), DX
	MOVQ x+16(FP), SI
	MOVQ cdf+24(FP), R8
	MOVQ n+32(FP), CX
	EXP_CONSTS
	MOVL $0xbf000000, AX
	VPBROADCASTD AX, Z16 // −0.5
	MOVL $0x3ecc422a, AX
	VPBROADCASTD AX, Z15 // 1/√(2π)
gelugradloop:
	VMOVUPS (SI), Z10
	VMULPS Z10, Z10, Z0
	VMULPS Z16, Z0, Z0
	EXP
	VMULPS Z15, Z6, Z6
	VMULPS Z6, Z10, Z6
	VMOVUPS (R8), Z13
	VADDPS Z13, Z6, Z6
	VMOVUPS (DX), Z14
	VMULPS Z14, Z6, Z6
	VMOVUPS Z6, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, R8
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ gelugradloop
	VZEROUPPER
	RET

// func max16(x *float32, n int) float32
// n is a positive multiple of 16: the largest of x[:n], four running
// maxima folded at the end (VMAXPS takes its second source where either
// is NaN).
TEXT ·max16(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VMOVUPS (SI), Z0
	VMOVAPS Z0, Z1
	VMOVAPS Z0, Z2
	VMOVAPS Z0, Z3
max4loop:
	CMPQ CX, $64
	JLT max1loop
	VMAXPS (SI), Z0, Z0
	VMAXPS 64(SI), Z1, Z1
	VMAXPS 128(SI), Z2, Z2
	VMAXPS 192(SI), Z3, Z3
	ADDQ $256, SI
	SUBQ $64, CX
	JMP max4loop
max1loop:
	TESTQ CX, CX
	JZ maxfold
	VMAXPS (SI), Z0, Z0
	ADDQ $64, SI
	SUBQ $16, CX
	JMP max1loop
maxfold:
	VMAXPS Z1, Z0, Z0
	VMAXPS Z3, Z2, Z2
	VMAXPS Z2, Z0, Z0
	VEXTRACTF64X4 $1, Z0, Y1
	VMAXPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VMOVHLPS X0, X0, X1
	VMAXPS X1, X0, X0
	VMOVSHDUP X0, X1
	VMAXSS X1, X0, X0
	MOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// func addScalar16(dst, src *float32, n int, c float32)
TEXT ·addScalar16(SB), NOSPLIT, $0-28
	SCALAR16(VADDPS, addscalarloop)

// func scale16(dst, src *float32, n int, c float32)
TEXT ·scale16(SB), NOSPLIT, $0-28
	SCALAR16(VMULPS, scaleloop)

// func mulSub16(d, p *float32, n int, c float32)
// d = p·(d − c) over n, a positive multiple of 16, the difference
// rounded first.
TEXT ·mulSub16(SB), NOSPLIT, $0-28
	MOVQ d+0(FP), DI
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS c+24(FP), Z1
mulsubloop:
	VMOVUPS (DI), Z0
	VSUBPS Z1, Z0, Z0
	VMULPS (SI), Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ mulsubloop
	VZEROUPPER
	RET

// func sketchScan16(dst, src *float32, signs *uint64, buckets *int32, lanes, sq *float32, blocks, limit int) int
// For each block of 64 values: stored to dst unless dst is nil; the four
// vectors squared and added as (Z4+Z5)+(Z6+Z7) to the 16 running squares
// in Z11; each with its lanes negated (the sign bit flipped) under 16
// bits of the block's mask, added as (Z0+Z1)+(Z2+Z3) and that added to
// the block's bucket's 16 lanes of lanes. No horizontal sum: the caller
// sums a bucket's lanes once for all its blocks. It stops at a bucket not
// below limit and returns the blocks done.
TEXT ·sketchScan16(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), R12
	MOVQ src+8(FP), SI
	MOVQ signs+16(FP), DX
	MOVQ buckets+24(FP), R8
	MOVQ lanes+32(FP), DI
	MOVQ sq+40(FP), R13
	MOVQ blocks+48(FP), CX
	MOVQ limit+56(FP), R10
	XORQ AX, AX
	MOVL $0x80000000, R11
	VPBROADCASTD R11, Z8
	VMOVUPS (R13), Z11
	TESTQ CX, CX
	JZ scdone
scloop:
	MOVLQSX (R8)(AX*4), R9
	CMPQ R9, R10
	JAE scdone
	SHLQ $6, R9
	MOVQ (DX)(AX*8), BX
	VMOVUPS (SI), Z0
	VMOVUPS 64(SI), Z1
	VMOVUPS 128(SI), Z2
	VMOVUPS 192(SI), Z3
	TESTQ R12, R12
	JZ scnocopy
	VMOVUPS Z0, (R12)
	VMOVUPS Z1, 64(R12)
	VMOVUPS Z2, 128(R12)
	VMOVUPS Z3, 192(R12)
	ADDQ $256, R12
scnocopy:
	VMULPS Z0, Z0, Z4
	VMULPS Z1, Z1, Z5
	VMULPS Z2, Z2, Z6
	VMULPS Z3, Z3, Z7
	VADDPS Z5, Z4, Z4
	VADDPS Z7, Z6, Z6
	VADDPS Z6, Z4, Z4
	VADDPS Z4, Z11, Z11
	KMOVW BX, K1
	SHRQ $16, BX
	KMOVW BX, K2
	SHRQ $16, BX
	KMOVW BX, K3
	SHRQ $16, BX
	KMOVW BX, K4
	VPXORD Z8, Z0, K1, Z0
	VPXORD Z8, Z1, K2, Z1
	VPXORD Z8, Z2, K3, Z2
	VPXORD Z8, Z3, K4, Z3
	VADDPS Z1, Z0, Z0
	VADDPS Z3, Z2, Z2
	VADDPS Z2, Z0, Z0
	VADDPS (DI)(R9*1), Z0, Z0
	VMOVUPS Z0, (DI)(R9*1)
	ADDQ $256, SI
	INCQ AX
	CMPQ AX, CX
	JB scloop
scdone:
	VMOVUPS Z11, (R13)
	MOVQ AX, ret+64(FP)
	VZEROUPPER
	RET

// func sumSquares16(x *float32, blocks, m0, m1, m2, m3 int) float32
// sum16 over the squares: each rounded by its own multiply, then added.
TEXT ·sumSquares16(SB), NOSPLIT, $0-52
	SUM64_BEGIN
	TESTQ CX, CX
	JZ sqrest
sqloop:
	VMOVUPS (SI), Z4
	VMOVUPS 64(SI), Z5
	VMOVUPS 128(SI), Z6
	VMOVUPS 192(SI), Z7
	VMULPS Z4, Z4, Z4
	VMULPS Z5, Z5, Z5
	VMULPS Z6, Z6, Z6
	VMULPS Z7, Z7, Z7
	VADDPS Z4, Z0, Z0
	VADDPS Z5, Z1, Z1
	VADDPS Z6, Z2, Z2
	VADDPS Z7, Z3, Z3
	ADDQ $256, SI
	DECQ CX
	JNZ sqloop
sqrest:
	SUM64_TAIL(0, m0+16)
	VMULPS Z4, Z4, Z4
	VADDPS Z4, Z0, K1, Z0
	SUM64_TAIL(64, m1+24)
	VMULPS Z4, Z4, Z4
	VADDPS Z4, Z1, K1, Z1
	SUM64_TAIL(128, m2+32)
	VMULPS Z4, Z4, Z4
	VADDPS Z4, Z2, K1, Z2
	SUM64_TAIL(192, m3+40)
	VMULPS Z4, Z4, Z4
	VADDPS Z4, Z3, K1, Z3
	SUM64_END
