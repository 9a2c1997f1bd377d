package gemm

import "golang.org/x/sys/cpu"

// The assembly kernels (kernel_amd64.s): 12 × 32 (or 8 × 48) in AVX-512
// registers and 6 × 16 in AVX2 ones; the sizes fill the register files
// with accumulators (24 of 32 zmm, 12 of 16 ymm) and leave room for the B
// vectors and the broadcast A value. 8 × 48 fills the tiles of a product
// with 64 rows (a batch of 64, 64 filters) that 12 × 32 leaves 11% empty.

//go:noescape
func kernelAVX512(k int, a, b, c *float32, ldc, ldb, lda, load int)

//go:noescape
func kernelAVX512x48(k int, a, b, c *float32, ldc, ldb, lda, load int)

//go:noescape
func kernelAVX2(k int, a, b, c *float32, ldc, ldb, lda, load int)

// kernels lists the kernels this CPU can run, fastest first; the Go kernel
// is always last.
func kernels() []kernel {
	var ks []kernel
	if cpu.X86.HasAVX512F {
		ks = append(ks, kernel{name: "avx512", mr: 12, nr: 32, run: func(k int, a, b, c []float32, ldc, ldb, lda int, load bool) {
			kernelAVX512(k, &a[0], &b[0], &c[0], ldc, ldb, lda, flag(load))
		}, alt: []kernel{{name: "avx512", mr: 8, nr: 48, run: func(k int, a, b, c []float32, ldc, ldb, lda int, load bool) {
			kernelAVX512x48(k, &a[0], &b[0], &c[0], ldc, ldb, lda, flag(load))
		}}}})
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		ks = append(ks, kernel{name: "avx2", mr: 6, nr: 16, run: func(k int, a, b, c []float32, ldc, ldb, lda int, load bool) {
			kernelAVX2(k, &a[0], &b[0], &c[0], ldc, ldb, lda, flag(load))
		}})
	}
	return append(ks, goKernel(4, 16))
}

// flag is 1 for true, 0 for false: the assembly's form of a bool.
func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}
