//go:build !amd64

package gemm

// transposeBlock has no instruction sequence here: the caller's loop does
// the work.
func transposeBlock(src []float32, lds int, dst []float32, ldd, rows, cols int) bool { return false }
