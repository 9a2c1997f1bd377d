package gemm

import "golang.org/x/sys/cpu"

//go:noescape
func transposeAVX512(src *float32, lds int, dst *float32, ldd, rows, cols, blocks int)

// transposeBlocks writes blocks rows × 16 blocks side by side along src's
// rows (rows lds apart; the rows past rows, up to 16, taken as zeros)
// transposed one under another at dst: 16·blocks rows ldd apart, cols
// values each. It reports true where this CPU has an instruction sequence
// for it; else it writes nothing.
func transposeBlocks(src []float32, lds int, dst []float32, ldd, rows, cols, blocks int) bool {
	if !cpu.X86.HasAVX512F || rows < 1 || rows > 16 || cols < 1 || cols > 16 || blocks < 1 {
		return false
	}
	_ = src[(rows-1)*lds+16*blocks-1]
	_ = dst[(16*blocks-1)*ldd+cols-1]
	transposeAVX512(&src[0], lds, &dst[0], ldd, rows, cols, blocks)
	return true
}
