//go:build !amd64 && !arm64 && !ppc64le && !ppc64 && !s390x && !riscv64

package gemm

// kernels lists the kernels this CPU can run, fastest first. Without
// assembly or a compiler that fuses multiply-adds, only the exact Go
// kernel is left: slow, but the same bits as everywhere else.
func kernels() []kernel { return []kernel{goKernel(4, 16)} }
