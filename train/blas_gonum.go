//go:build !netlib

package train

import (
	G "gorgonia.org/gorgonia"

	"github.com/ringtrain/ringtrain/train/gemm"
)

// cpuBLAS multiplies gorgonia's matrices in this build: gonum's pure-Go
// BLAS with train/gemm's packed SGEMM (AVX-512 or AVX2 assembly) in place
// of gonum's, which has no register-blocked kernel and ran the cnn at a
// seventh of PyTorch's speed. Its thread budget is GOMAXPROCS, which
// `ringtrain local` sets to the cores divided by the peers it starts.
var cpuBLAS = gemm.New(0)

// BLAS names the matrix library this build multiplies with.
func BLAS() string { return "ringtrain-gemm/" + cpuBLAS.Kernel() }

func init() { G.Use(cpuBLAS) }
