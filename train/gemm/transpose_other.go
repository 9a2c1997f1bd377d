//go:build !amd64

package gemm

// transposeBlocks has no instruction sequence here: the caller's loop
// does the work.
func transposeBlocks(src []float32, lds int, dst []float32, ldd, rows, cols, blocks int) bool {
	return false
}
