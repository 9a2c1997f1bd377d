//go:build arm64 || ppc64le || ppc64 || s390x || riscv64

package gemm

// On these architectures the Go compiler turns x*y + acc into one fused
// multiply-add instruction, so this plain loop rounds exactly as the
// FMA kernels of amd64 do and runs at native speed, where goKernel
// emulates the FMA in float64. TestSameBitsEverywhere holds it to
// goKernel on the machine that runs the tests, which is what would catch
// a compiler that stopped fusing.
func fusedKernel(mr, nr int) kernel {
	return kernel{name: "go-fma", mr: mr, nr: nr, run: func(k int, a, b, c []float32, ldc, ldb, lda int, load bool) {
		for r := range mr {
			row := c[r*ldc : r*ldc+nr]
			for q := range row {
				acc := float32(0)
				if load {
					acc = row[q]
				}
				for p := range k {
					acc = a[p*lda+r]*b[p*ldb+q] + acc
				}
				row[q] = acc
			}
		}
	}}
}

// kernels lists the kernels this CPU can run, fastest first.
func kernels() []kernel { return []kernel{fusedKernel(4, 16), goKernel(4, 16)} }
