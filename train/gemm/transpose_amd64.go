package gemm

import "golang.org/x/sys/cpu"

//go:noescape
func transpose16AVX512(src *float32, lds int, dst *float32, ldd int)

// transposeBlock writes the 16 × 16 block at src (rows lds apart)
// transposed at dst (rows ldd apart) and reports true, where this CPU has
// an instruction sequence for it; else it writes nothing.
func transposeBlock(src []float32, lds int, dst []float32, ldd int) bool {
	if !cpu.X86.HasAVX512F {
		return false
	}
	_ = src[15*lds+15]
	_ = dst[15*ldd+15]
	transpose16AVX512(&src[0], lds, &dst[0], ldd)
	return true
}
