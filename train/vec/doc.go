// Package vec holds the element-wise loops a training step runs over every
// parameter — the optimizers' updates and ReLU — in AVX-512 or AVX2
// assembly where the CPU has it, with Go loops of exactly the same
// arithmetic elsewhere and for the tails.
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
