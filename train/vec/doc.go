// Package vec holds the element-wise loops a training step runs over every
// parameter — the optimizers' updates and ReLU — in AVX-512 or AVX2
// assembly where the CPU has it, with Go loops of exactly the same
// arithmetic elsewhere and for the tails; and, in AVX-512 with Go loops
// elsewhere, the 2×2 max-pool and its gradient, the NaN/Inf check, a sum
// in a fixed order of 64 lanes (a conv layer's bias gradient), one pass
// that folds blocks into a count sketch's lanes and sums their squares
// beside a copy (every-step update checks: SketchScan), and the
// row copies and sums of a convolution's im2col and its input gradient,
// whose rows are a few values long (AVX-512's masks take a row's ragged
// end in one instruction). A language model's elementwise functions are
// here too: float32 exp and erf (Exp32, Erf32) and, over slices, 16 lanes
// at a time in AVX-512, exp, erf, the GELU with its gradient, and a
// softmax's row operations (Max, AddScalar, Scale, MulSub).
//
// Vectors matter here less for width than for denormals: a dead unit's
// momentum decays through the subnormal range, and this CPU takes a slow
// path for every instruction that meets one. Scalar code pays it per
// value, vector code per eight or sixteen; on the mlp the scalar SGD took
// a third of the step.
//
// The assembly does each IEEE operation of the Go loop, in the same order,
// with no fused multiply-add, so both give the same bits (tests hold them
// to it), as do the CUDA engine's optimizer kernels.
package vec
