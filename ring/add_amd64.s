#include "textflag.h"

// func addBlocks(dst, src []float32)
// Adds src into dst for the first len(dst)&^15 elements, 16 at a time with
// SSE (part of every amd64 CPU). The caller handles the tail.
TEXT ·addBlocks(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	SHRQ $4, CX
	JZ   done

loop:
	MOVUPS (SI), X0
	MOVUPS 16(SI), X1
	MOVUPS 32(SI), X2
	MOVUPS 48(SI), X3
	MOVUPS (DI), X4
	MOVUPS 16(DI), X5
	MOVUPS 32(DI), X6
	MOVUPS 48(DI), X7
	ADDPS  X4, X0
	ADDPS  X5, X1
	ADDPS  X6, X2
	ADDPS  X7, X3
	MOVUPS X0, (DI)
	MOVUPS X1, 16(DI)
	MOVUPS X2, 32(DI)
	MOVUPS X3, 48(DI)
	ADDQ   $64, SI
	ADDQ   $64, DI
	DECQ   CX
	JNZ    loop

done:
	RET

// func mulBlocks(dst []float32, f float32)
// Multiplies the first len(dst)&^15 elements of dst by f, 16 at a time.
TEXT ·mulBlocks(SB), NOSPLIT, $0-28
	MOVQ   dst_base+0(FP), DI
	MOVQ   dst_len+8(FP), CX
	MOVSS  f+24(FP), X8
	SHUFPS $0, X8, X8
	SHRQ   $4, CX
	JZ     muldone

mulloop:
	MOVUPS (DI), X0
	MOVUPS 16(DI), X1
	MOVUPS 32(DI), X2
	MOVUPS 48(DI), X3
	MULPS  X8, X0
	MULPS  X8, X1
	MULPS  X8, X2
	MULPS  X8, X3
	MOVUPS X0, (DI)
	MOVUPS X1, 16(DI)
	MOVUPS X2, 32(DI)
	MOVUPS X3, 48(DI)
	ADDQ   $64, DI
	DECQ   CX
	JNZ    mulloop

muldone:
	RET

// func divBlocks(dst []float32, f float32)
// Divides the first len(dst)&^15 elements of dst by f, 16 at a time.
TEXT ·divBlocks(SB), NOSPLIT, $0-28
	MOVQ   dst_base+0(FP), DI
	MOVQ   dst_len+8(FP), CX
	MOVSS  f+24(FP), X8
	SHUFPS $0, X8, X8
	SHRQ   $4, CX
	JZ     divdone

divloop:
	MOVUPS (DI), X0
	MOVUPS 16(DI), X1
	MOVUPS 32(DI), X2
	MOVUPS 48(DI), X3
	DIVPS  X8, X0
	DIVPS  X8, X1
	DIVPS  X8, X2
	DIVPS  X8, X3
	MOVUPS X0, (DI)
	MOVUPS X1, 16(DI)
	MOVUPS X2, 32(DI)
	MOVUPS X3, 48(DI)
	ADDQ   $64, DI
	DECQ   CX
	JNZ    divloop

divdone:
	RET
