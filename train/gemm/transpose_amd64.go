package gemm

import "golang.org/x/sys/cpu"

//go:noescape
func transposeAVX512(src *float32, lds int, dst *float32, ldd, rows, cols int)

// transposeBlock writes the rows × 16 block at src (rows lds apart; the
// rows past rows, up to 16, taken as zeros) transposed at dst: 16 rows
// ldd apart, cols values each. It reports true where this CPU has an
// instruction sequence for it; else it writes nothing.
func transposeBlock(src []float32, lds int, dst []float32, ldd, rows, cols int) bool {
	if !cpu.X86.HasAVX512F || rows < 1 || rows > 16 || cols < 1 || cols > 16 {
		return false
	}
	_ = src[(rows-1)*lds+15]
	_ = dst[15*ldd+cols-1]
	transposeAVX512(&src[0], lds, &dst[0], ldd, rows, cols)
	return true
}
